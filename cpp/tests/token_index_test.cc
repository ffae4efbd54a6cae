// Randomized differential test of the native index against a brute-force matcher,
// built without Python so CI can run it under AddressSanitizer and UBSan.
#include "token_index.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "match_cursor.h"

using agspec::Token;

namespace {

struct Brute {
  std::map<int64_t, std::vector<Token>> docs;
  std::vector<std::pair<int64_t, size_t>> order;
  void extend(int64_t id, const std::vector<Token>& t) {
    auto& d = docs[id];
    for (Token x : t) {
      if (!d.empty()) order.emplace_back(id, d.size() - 1);
      d.push_back(x);
    }
  }
  std::vector<std::pair<int64_t, size_t>> ends(const std::vector<Token>& fed, size_t n) const {
    std::vector<std::pair<int64_t, size_t>> out;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      const auto& d = docs.at(it->first);
      if (it->second + 1 < n) continue;
      bool ok = true;
      for (size_t k = 0; k < n && ok; ++k) ok = d[it->second - k] == fed[fed.size() - 1 - k];
      if (ok) out.push_back(*it);
    }
    return out;
  }
  int32_t match(const std::vector<Token>& fed, size_t cap) const {
    for (size_t n = std::min(cap, fed.size()); n > 0; --n) {
      if (!ends(fed, n).empty()) return int32_t(n);
    }
    return 0;
  }
};

int fail(const char* what, int round) {
  std::fprintf(stderr, "FAILED: %s (round %d)\n", what, round);
  return 1;
}

}  // namespace

int main() {
  std::mt19937 rng(12345);
  for (int round = 0; round < 300; ++round) {
    auto idx = std::make_shared<agspec::TokenIndex>();
    Brute ref;
    const int alphabet = (round % 3 == 0) ? 2 : (round % 3 == 1 ? 4 : 50);
    const size_t cap = (round % 2) ? 4 : 64;
    agspec::MatchCursor cur(idx, int32_t(cap));
    std::vector<Token> fed;
    for (int op = 0; op < 40; ++op) {
      std::vector<Token> toks(rng() % 6);
      for (auto& t : toks) t = Token(rng() % alphabet);
      if (rng() % 2) {
        const int64_t id = rng() % 3;
        idx->extend(id, toks.data(), toks.size());
        ref.extend(id, toks);
      } else {
        cur.extend(toks.data(), toks.size());
        fed.insert(fed.end(), toks.begin(), toks.end());
      }
      const int32_t m = ref.match(fed, cap);
      if (cur.match_length() != m) return fail("match length", round);
      const auto got = cur.occurrences(5);
      auto want = m ? ref.ends(fed, size_t(m)) : decltype(ref.ends(fed, 0)){};
      if (want.size() > 5) want.resize(5);
      if (got.size() != want.size()) return fail("occurrence count", round);
      for (size_t i = 0; i < got.size(); ++i) {
        if (got[i].doc_id != want[i].first || size_t(got[i].end_offset) != want[i].second) {
          return fail("occurrence order", round);
        }
      }
      (void)cur.continuation(8, agspec::ContinuationRule::kFrequent, 32);
      (void)cur.continuation(8, agspec::ContinuationRule::kFirst, 32);
    }
    idx->verify();  // every index the API builds passes the checks load makes
    if (round % 10 == 0) {
      const std::string path = "token_index_test.tmp";
      idx->save(path);
      auto loaded = agspec::TokenIndex::load(path);
      std::remove(path.c_str());
      agspec::MatchCursor c2(loaded, int32_t(cap));
      c2.extend(fed.data(), fed.size());
      if (c2.match_length() != ref.match(fed, cap)) return fail("loaded match", round);
      // A loaded (frozen) index answers "frequent" at 32 from the picks built at load;
      // the live index computes each answer afresh.
      for (int q = 0; q < 20; ++q) {
        std::vector<Token> query(1 + rng() % 8);
        for (auto& t : query) t = Token(rng() % alphabet);
        agspec::MatchCursor live(idx, int32_t(cap)), frozen(loaded, int32_t(cap));
        live.extend(query.data(), query.size());
        frozen.extend(query.data(), query.size());
        if (live.continuation(8, agspec::ContinuationRule::kFrequent, 32) !=
            frozen.continuation(8, agspec::ContinuationRule::kFrequent, 32)) {
          return fail("loaded frequent pick", round);
        }
      }
    }
  }
  std::printf("token_index_test: 300 rounds passed\n");
  // A live index that grows under a short match (a large link subtree, whose answers
  // are cached and then updated from the positions added since): the most recent
  // occurrences at several counts, asked after every extend, against the brute force.
  for (int round = 0; round < 40; ++round) {
    auto idx = std::make_shared<agspec::TokenIndex>();
    Brute ref;
    const int alphabet = round % 2 ? 2 : 3;
    std::vector<Token> start(300);
    for (auto& t : start) t = Token(rng() % alphabet);
    idx->extend(0, start.data(), start.size());
    ref.extend(0, start);
    std::vector<Token> fed(1 + rng() % 3);
    for (auto& t : fed) t = Token(rng() % alphabet);
    agspec::MatchCursor cur(idx, 3);
    cur.extend(fed.data(), fed.size());
    for (int op = 0; op < 30; ++op) {
      std::vector<Token> toks(rng() % 4);
      for (auto& t : toks) t = Token(rng() % alphabet);
      const int64_t id = rng() % 3 ? 0 : 1 + int64_t(rng() % 2);
      idx->extend(id, toks.data(), toks.size());
      ref.extend(id, toks);
      if (rng() % 4 == 0) {  // the cursor moves too, sometimes
        const Token t = Token(rng() % alphabet);
        cur.extend(&t, 1);
        fed.push_back(t);
      }
      const int32_t m = ref.match(fed, 3);
      if (cur.match_length() != m) return fail("growing index match length", round);
      for (const size_t count : {size_t(3), size_t(32), size_t(5000), size_t(32), size_t(1)}) {
        const auto got = cur.occurrences(count);
        auto want = m ? ref.ends(fed, size_t(m)) : decltype(ref.ends(fed, 0)){};
        if (want.size() > count) want.resize(count);
        if (got.size() != want.size()) return fail("growing index occurrence count", round);
        for (size_t i = 0; i < got.size(); ++i) {
          if (got[i].doc_id != want[i].first || size_t(got[i].end_offset) != want[i].second) {
            return fail("growing index occurrence order", round);
          }
        }
      }
    }
  }
  std::printf("token_index_test: growing-index rounds passed\n");
  // Arrays past large_pages.h's threshold (the state array of 250,000 tokens: 20 MB) take
  // the aligned, advised allocation, and its release, under the sanitizers too; an index
  // built with the advice and one without answer as the brute force, before and after a
  // remove (which reallocates the automaton) and through save and load.
  std::vector<Token> big(250000);
  for (auto& t : big) t = Token(rng() % 4);
  std::vector<Token> other(2000);
  for (auto& t : other) t = Token(rng() % 4);
  Brute ref;
  ref.extend(0, big);
  for (bool advised : {true, false}) {
    agspec::set_large_pages(advised);
    auto idx = std::make_shared<agspec::TokenIndex>();
    idx->extend(0, big.data(), big.size());
    idx->extend(1, other.data(), other.size());
    idx->remove(1);
    const std::string path = "token_index_test_large.tmp";
    idx->save(path);
    auto loaded = agspec::TokenIndex::load(path);
    std::remove(path.c_str());
    for (int q = 0; q < 10; ++q) {
      std::vector<Token> fed(12);
      for (auto& t : fed) t = Token(rng() % 4);
      const int32_t m = ref.match(fed, 10);
      for (const auto& index : {idx, loaded}) {
        agspec::MatchCursor cur(index, 10);
        cur.extend(fed.data(), fed.size());
        if (cur.match_length() != m) return fail("large index match length", q);
        const auto got = cur.occurrences(1);
        const auto want = ref.ends(fed, size_t(m));
        if (m && (got.size() != 1 || size_t(got[0].end_offset) != want[0].second)) {
          return fail("large index most recent occurrence", q);
        }
      }
    }
  }
  agspec::set_large_pages(true);
  std::printf("token_index_test: large arrays passed\n");
  return 0;
}
