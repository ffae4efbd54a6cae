// Threads racing on one index, as a server shares it: a writer (small and large extends,
// one remove), a saver (save, load the file back, query the snapshot), two readers
// (cursors, document(), the counters), and close() while the writer is inside a large
// extend. Built without Python so CI runs it under ThreadSanitizer and under
// AddressSanitizer + UBSan. What it checks besides the sanitizers: every call either
// works or raises StateError (or DocumentError for a document not there yet); every
// saved file loads (load verifies it) and holds a state the index really had; after
// close() every call raises StateError.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "token_index.h"

using agspec::MatchCursor;
using agspec::StateError;
using agspec::Token;
using agspec::TokenIndex;
using Docs = std::map<int64_t, std::vector<Token>>;

namespace {

std::atomic<int> failures{0};
std::mutex report_mu;

void fail(const std::string& what) {
  std::lock_guard<std::mutex> lock(report_mu);
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  ++failures;
}

bool is_prefix(const std::vector<Token>& a, const std::vector<Token>& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// Runs fn; a StateError counts as refused (and says whether the index was closed).
template <class Fn>
bool attempt(Fn fn, std::atomic<long>& refused, bool* closed = nullptr) {
  try {
    fn();
    return true;
  } catch (const StateError& e) {
    ++refused;
    if (closed && std::string(e.what()).find("closed") != std::string::npos) *closed = true;
    std::this_thread::yield();
    return false;
  } catch (const agspec::DocumentError&) {
    return false;  // a document that is not (or no longer) there
  } catch (const std::exception& e) {
    fail(std::string("unexpected exception: ") + e.what());
    return false;
  }
}

}  // namespace

int main() {
  constexpr int kRemoveAt = 90;  // the writer's iteration that removes document 10
  constexpr int kCloseAt = 180;  // close() once the writer is past this iteration
  auto index = std::make_shared<TokenIndex>();
  Docs truth;                    // the writer's record; read by others only after join
  std::atomic<int> progress{0};  // writer iterations done
  std::atomic<long> refused{0};

  std::thread writer([idx = index, &truth, &progress, &refused] {
    std::mt19937 rng(1);
    bool closed = false;
    for (int i = 0; !closed; ++i) {
      const int64_t doc = (i == 0) ? 10 : i % 4;
      const size_t n = (i % 5 == 4) ? 3000 + rng() % 6000 : rng() % 40;
      std::vector<Token> toks(n);
      for (auto& t : toks) t = Token(rng() % 20);
      if (attempt([&] { idx->extend(doc, toks.data(), toks.size()); }, refused, &closed)) {
        truth[doc].insert(truth[doc].end(), toks.begin(), toks.end());
      }
      if (i == kRemoveAt) {
        while (!closed && !attempt([&] { idx->remove(10); }, refused, &closed)) {
        }
      }
      progress = i + 1;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // let the others in
    }
  });

  std::vector<Docs> snapshots;
  std::thread saver([idx = index, &snapshots, &refused] {
    bool closed = false;
    for (int k = 0; !closed; ++k) {
      const std::string path = "token_index_threads_test." + std::to_string(k % 2) + ".agidx";
      if (!attempt([&] { idx->save(path); }, refused, &closed)) continue;
      try {
        auto loaded = TokenIndex::load(path);  // verifies the structure
        Docs snap;
        for (int64_t id : loaded->document_ids()) snap[id] = loaded->document(id);
        MatchCursor cur(loaded, 8);
        const std::vector<Token> q = {1, 2, 3, 4};
        cur.extend(q.data(), q.size());
        (void)cur.continuation(16, agspec::ContinuationRule::kFrequent, 32);
        snapshots.push_back(std::move(snap));
      } catch (const std::exception& e) {
        fail(std::string("a saved file does not load: ") + e.what());
      }
      std::remove(path.c_str());
    }
  });

  std::vector<Docs> reads(2);
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([idx = index, r, &reads, &refused] {
      std::mt19937 rng(100 + r);
      std::unique_ptr<MatchCursor> cur;
      bool closed = false;
      while (!closed && !cur) {
        attempt([&] { cur = std::make_unique<MatchCursor>(idx, 16); }, refused, &closed);
      }
      for (long op = 0; !closed; ++op) {
        std::vector<Token> toks(1 + rng() % 4);
        for (auto& t : toks) t = Token(rng() % 20);
        switch (op % 6) {
          case 0:
            attempt([&] { cur->extend(toks.data(), toks.size()); }, refused, &closed);
            break;
          case 1:
            attempt([&] { (void)cur->occurrences(8); }, refused, &closed);
            break;
          case 2:
            attempt([&] { (void)cur->continuation(16, agspec::ContinuationRule(rng() % 4), 32); },
                    refused, &closed);
            break;
          case 3:
            attempt(
                [&] {
                  const int64_t id = rng() % 4;
                  auto doc = idx->document(id);
                  auto& longest = reads[r][id];
                  if (doc.size() > longest.size()) longest = std::move(doc);
                },
                refused, &closed);
            break;
          case 4:
            attempt(
                [&] {
                  (void)idx->document_ids();
                  (void)idx->contains(10);
                  (void)idx->num_documents();
                },
                refused, &closed);
            break;
          default:
            attempt(
                [&] {
                  (void)idx->num_tokens();
                  (void)idx->num_positions();
                  (void)idx->num_bytes();
                  (void)cur->match_length();
                },
                refused, &closed);
        }
      }
      // Closed: the cursor must say so too.
      try {
        (void)cur->match_length();
        fail("a cursor call after close() succeeded");
      } catch (const StateError&) {
      }
    });
  }

  while (progress < kCloseAt) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  index->close();  // the writer is somewhere in its loop, often inside a large extend
  bool refused_after_close = false;
  try {
    (void)index->num_tokens();
  } catch (const StateError&) {
    refused_after_close = true;
  }
  if (!refused_after_close) fail("a call after close() succeeded");
  index.reset();  // the threads hold the last references, as calls in flight do

  writer.join();
  saver.join();
  for (auto& t : readers) t.join();

  for (const auto& snap : snapshots) {
    for (const auto& [id, toks] : snap) {
      if (!is_prefix(toks, truth[id])) fail("a saved file holds a state the index never had");
    }
  }
  for (const auto& docs : reads) {
    for (const auto& [id, toks] : docs) {
      if (!is_prefix(toks, truth[id])) fail("document() returned tokens never written");
    }
  }
  if (snapshots.size() < 3) fail("fewer than 3 saves succeeded");
  std::printf("token_index_threads_test: %zu saves checked, %ld calls refused, %s\n",
              snapshots.size(), refused.load(), failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
