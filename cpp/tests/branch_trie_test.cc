// branch_trie.h against references: merge_branches against a brute-force trie of the
// distinct candidates (a map from each node's root path to the node), on random branches
// over a small alphabet (so that candidates repeat, share prefixes and are prefixes of the
// first branch); and continuation_tries on the helper threads against the same call on
// the caller alone and against continuation_batch() of every candidate, then
// merge_branches of each tree; and ContinuationGroupsRun's wanted groups against the same,
// with the caller copying from the same cursors meanwhile. Built without Python so CI runs it under
// the sanitizers.
#include "branch_trie.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cursor_set.h"
#include "token_index.h"
#include "workers.h"

using agspec::BranchTrie;
using agspec::Token;

namespace {

int failures = 0;

void fail(const std::string& what) {
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  ++failures;
}

bool same(const BranchTrie& a, const BranchTrie& b) {
  return a.tokens == b.tokens && a.parents == b.parents && a.support == b.support &&
         a.branch_of == b.branch_of && a.origin == b.origin;
}

// The reference: drop empty candidates and prefixes of the first, keep each distinct one
// once (its first copy, its count as weight), order stably by rank, then insert every
// branch token by token, a node keyed by its root path.
BranchTrie brute_merge(const std::vector<Token>& first, const std::vector<std::vector<Token>>& c,
                       const std::vector<int64_t>& ranks) {
  std::vector<size_t> kept;
  std::vector<int32_t> weight;
  for (size_t k = 0; k < c.size(); ++k) {
    if (c[k].empty()) continue;
    if (c[k].size() <= first.size() && std::equal(c[k].begin(), c[k].end(), first.begin())) {
      continue;
    }
    const auto it = std::find_if(kept.begin(), kept.end(), [&](size_t u) { return c[u] == c[k]; });
    if (it == kept.end()) {
      kept.push_back(k);
      weight.push_back(1);
    } else {
      ++weight[size_t(it - kept.begin())];
    }
  }
  std::vector<size_t> order(kept.size());
  for (size_t u = 0; u < order.size(); ++u) order[u] = u;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return ranks[kept[a]] < ranks[kept[b]]; });
  BranchTrie t;
  std::map<std::vector<Token>, int32_t> node_of;  // root path -> node
  auto insert = [&](const std::vector<Token>& branch, int32_t w, int32_t b) {
    std::vector<Token> path;
    int32_t parent = -1;
    for (Token tok : branch) {
      path.push_back(tok);
      const auto found = node_of.find(path);
      if (found != node_of.end()) {
        t.support[size_t(found->second)] += w;
        parent = found->second;
        continue;
      }
      const int32_t id = int32_t(t.tokens.size());
      node_of[path] = id;
      t.tokens.push_back(tok);
      t.parents.push_back(parent);
      t.support.push_back(w);
      t.branch_of.push_back(b);
      parent = id;
    }
  };
  t.origin.push_back(-1);
  insert(first, 1, 0);
  for (size_t b = 0; b < order.size(); ++b) {
    t.origin.push_back(int32_t(kept[order[b]]));
    insert(c[kept[order[b]]], weight[order[b]], int32_t(b + 1));
  }
  return t;
}

std::vector<Token> random_tokens(std::mt19937& rng, size_t max_size) {
  std::vector<Token> out(rng() % (max_size + 1));
  for (auto& x : out) x = Token(rng() % 3);
  return out;
}

void merge_scenario() {
  // The worked example of agspec.policy.tree_size.merge_candidates.
  const std::vector<std::vector<Token>> c = {{7, 4}, {7, 8, 9}, {5}, {7, 8, 9}};
  const std::vector<int64_t> ranks = {0, 0, 1, 0};
  const BranchTrie t = agspec::merge_branches({7, 4, 2}, c.data(), ranks.data(), c.size());
  BranchTrie want;
  want.tokens = {7, 4, 2, 8, 9, 5};
  want.parents = {-1, 0, 1, 0, 3, -1};
  want.support = {3, 1, 1, 2, 2, 1};
  want.branch_of = {0, 0, 0, 1, 1, 2};
  want.origin = {-1, 1, 2};
  if (!same(t, want)) fail("merge_branches: the worked example");
  std::mt19937 rng(7);
  for (int round = 0; round < 2000; ++round) {
    const std::vector<Token> first = random_tokens(rng, 5);
    std::vector<std::vector<Token>> cands(rng() % 9);
    std::vector<int64_t> r(cands.size());
    for (size_t k = 0; k < cands.size(); ++k) {
      cands[k] = random_tokens(rng, 5);
      r[k] = int64_t(rng() % 5) - 2;
    }
    const BranchTrie got = agspec::merge_branches(first, cands.data(), r.data(), cands.size());
    if (!same(got, brute_merge(first, cands, r))) {
      fail("merge_branches against brute force, round " + std::to_string(round));
    }
  }
}

void tries_scenario() {
  // 24 requests (enough for the helper threads) over a session corpus each and one shared
  // corpus, every rule, several candidates a tree (some trees without any).
  constexpr size_t kTrees = 24;
  std::mt19937 rng(11);
  auto shared = std::make_shared<agspec::TokenIndex>();
  std::vector<Token> text(600);
  for (auto& x : text) x = Token(rng() % 4);
  shared->extend(0, text.data(), text.size());
  std::vector<std::unique_ptr<agspec::CursorSet>> owned;
  std::vector<agspec::CursorSet*> sets;
  std::vector<std::shared_ptr<agspec::TokenIndex>> sessions;
  for (size_t i = 0; i < kTrees; ++i) {
    auto session = std::make_shared<agspec::TokenIndex>();
    std::vector<Token> own(80);
    for (auto& x : own) x = Token(rng() % 4);
    session->extend(1, own.data(), own.size());
    sessions.push_back(session);
    auto s = std::make_unique<agspec::CursorSet>();
    const Token tail[3] = {Token(i % 4), Token((i / 4) % 4), Token(rng() % 4)};
    s->add_cursor(session, 8, tail, 3);
    s->add_cursor(shared, 8, tail, 3);
    sets.push_back(s.get());
    owned.push_back(std::move(s));
  }
  for (int step = 0; step < 40; ++step) {
    std::vector<int64_t> slots, max_tokens, ranks, counts;
    std::vector<agspec::ContinuationRule> rules;
    std::vector<std::vector<Token>> firsts;
    std::vector<agspec::CursorSet*> flat;
    for (size_t t = 0; t < kTrees; ++t) {
      const int64_t n = int64_t(rng() % 7);
      counts.push_back(n);
      firsts.push_back(random_tokens(rng, 4));
      for (int64_t k = 0; k < n; ++k) {
        slots.push_back(int64_t(rng() % 3) - (k == 0 ? 1 : 0));  // -1: nothing copied
        max_tokens.push_back(int64_t(rng() % 6));
        rules.push_back(agspec::ContinuationRule(rng() % 11));  // kRecent2 .. kRecent8 too
        ranks.push_back(int64_t(rng() % 3));
        flat.push_back(sets[t]);
      }
    }
    for (auto& s : slots) s = std::min<int64_t>(s, 1);
    const size_t n = slots.size();
    std::vector<std::vector<Token>> conts(n);
    // The same groups begun on the helpers (ContinuationGroupsRun) while the caller copies
    // every entry again from the same cursors (the chains a batch step plans meanwhile),
    // every other group wanted; the sessions grew past the cursors since the last step, so
    // each cursor catches up in match_lengths, before the helpers start. The wanted
    // groups' copies and the caller's are the reference's.
    {
      agspec::set_batch_threads(4);
      std::vector<int32_t> lengths(2 * kTrees);
      std::vector<std::vector<Token>> begun(n), again(n);
      agspec::ContinuationGroupsRun run(sets.data(), kTrees);
      run.match_lengths(lengths.data());
      run.start(counts.data(), slots.data(), max_tokens.data(), rules.data(), 16, begun.data());
      agspec::continuation_batch(flat.data(), slots.data(), max_tokens.data(), rules.data(), 16, n,
                                 again.data());
      std::vector<char> wanted(kTrees);
      for (size_t t = 0; t < kTrees; ++t) wanted[t] = char((t + size_t(step)) % 2);
      run.finish(wanted.data());
      agspec::continuation_batch(flat.data(), slots.data(), max_tokens.data(), rules.data(), 16, n,
                                 conts.data());  // the reference, after the run
      if (again != conts) fail("continuation_batch during a run, step " + std::to_string(step));
      size_t from = 0;
      std::vector<int64_t> starts, picked;
      std::vector<std::vector<Token>> picked_firsts;
      for (size_t t = 0; t < kTrees; ++t) {
        starts.push_back(int64_t(from));
        for (size_t j = from; j < from + size_t(counts[t]); ++j) {
          if (wanted[t] && begun[j] != conts[j]) {
            fail("ContinuationGroupsRun, step " + std::to_string(step) + " tree " +
                 std::to_string(t));
          }
        }
        if (wanted[t]) {
          picked.push_back(int64_t(t));
          picked_firsts.push_back(firsts[t]);
        }
        from += size_t(counts[t]);
      }
      // The wanted groups merged on the helpers, each as merge_branches merges it.
      std::vector<BranchTrie> merged(picked.size());
      agspec::merge_groups(picked_firsts.data(), picked.data(), picked.size(), begun.data(),
                           ranks.data(), starts.data(), counts.data(), merged.data());
      for (size_t j = 0; j < picked.size(); ++j) {
        const size_t t = size_t(picked[j]);
        const BranchTrie want = agspec::merge_branches(firsts[t], conts.data() + starts[t],
                                                       ranks.data() + starts[t], size_t(counts[t]));
        if (!same(merged[j], want)) fail("merge_groups, step " + std::to_string(step));
      }
      agspec::set_batch_threads(1);
    }
    std::vector<BranchTrie> helpers(kTrees), alone(kTrees);
    agspec::set_batch_threads(4);
    agspec::continuation_tries(sets.data(), slots.data(), max_tokens.data(), rules.data(), 16, n,
                               ranks.data(), counts.data(), firsts.data(), kTrees, helpers.data());
    agspec::set_batch_threads(1);
    agspec::continuation_tries(sets.data(), slots.data(), max_tokens.data(), rules.data(), 16, n,
                               ranks.data(), counts.data(), firsts.data(), kTrees, alone.data());
    size_t at = 0;
    for (size_t t = 0; t < kTrees; ++t) {
      const BranchTrie want = agspec::merge_branches(firsts[t], conts.data() + at,
                                                     ranks.data() + at, size_t(counts[t]));
      at += size_t(counts[t]);
      if (!same(helpers[t], want))
        fail("continuation_tries on the helpers, step " + std::to_string(step) + " tree " +
             std::to_string(t));
      if (!same(alone[t], want)) fail("continuation_tries alone, step " + std::to_string(step));
    }
    // The requests move on: every session grows, every cursor is fed.
    for (size_t i = 0; i < kTrees; ++i) {
      const Token tok[2] = {Token(rng() % 4), Token(rng() % 4)};
      sessions[i]->extend(1, tok, 2);
      sets[i]->advance(tok, 2);
      sessions[i]->extend(1, tok + 1, 1);  // past the cursors: the next step catches up
    }
  }
  // A miscount is refused before anything is copied.
  std::vector<int64_t> counts = {2}, slots = {0}, max_tokens = {3}, ranks = {0};
  std::vector<agspec::ContinuationRule> rules = {agspec::ContinuationRule::kFirst};
  std::vector<std::vector<Token>> firsts = {{1}};
  BranchTrie out;
  try {
    agspec::continuation_tries(sets.data(), slots.data(), max_tokens.data(), rules.data(), 16, 1,
                               ranks.data(), counts.data(), firsts.data(), 1, &out);
    fail("continuation_tries: a miscount was not refused");
  } catch (const agspec::ArgumentError&) {
  }
  // A negative count is refused before anything is handed out.
  {
    const int64_t negative[1] = {-1};
    agspec::ContinuationGroupsRun run(sets.data(), 1);
    try {
      run.start(negative, slots.data(), max_tokens.data(), rules.data(), 16, nullptr);
      fail("ContinuationGroupsRun: a negative count was not refused");
    } catch (const agspec::ArgumentError&) {
    }
  }
  agspec::set_batch_threads(0);
}

}  // namespace

int main() {
  merge_scenario();
  tries_scenario();
  if (failures) return 1;
  std::printf("branch_trie_test: ok\n");
  return 0;
}
