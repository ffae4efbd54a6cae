// Token branches merged into one trie (the candidates of a token tree draft), and the
// batched call that copies every request's candidate continuations and merges them.
//
// No policy lives here: the caller says which occurrences to copy and in which order the
// distinct candidates enter (a rank per candidate); how likely a node is, and how many
// to draft, is decided in Python (agspec.policy.tree_size).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cursor_set.h"
#include "token.h"

namespace agspec {

// A trie in topological order (every parent before its children).
struct BranchTrie {
  std::vector<Token> tokens;
  std::vector<int32_t> parents;    // -1: a child of the root; else an earlier node
  std::vector<int32_t> support;    // summed weight of the branches through the node
  std::vector<int32_t> branch_of;  // the branch (in merge order) whose walk made the node
  // origin[b]: the candidate whose first copy became branch b (b >= 1); origin[0] = -1,
  // the first branch. Branches that add no node keep their index.
  std::vector<int32_t> origin;
};

// The first branch (weight 1), then the n candidates: empty ones and prefixes of the
// first dropped, identical ones kept once (weight: their copies; origin: the first
// copy), ordered stably by ranks[first copy], smallest first, and merged in that order.
// A branch walks the nodes it shares with earlier ones (their support grows by its
// weight) and adds the rest as consecutive nodes, each the first child of the one
// before (agspec.policy.tree_size.merge_candidates is the reference).
BranchTrie merge_branches(const std::vector<Token>& first, const std::vector<Token>* candidates,
                          const int64_t* ranks, size_t n);

// The candidates of num_trees trees (n of them: slot, length, rule each) copied as
// continuation_batch() copies them, then one trie per tree: tree t's candidates are the
// next counts[t] ones, all of sets[t] (its request's corpora), merged after firsts[t]
// with their ranks (merge_branches). When the sets are distinct the trees are copied and
// merged on the helper threads (continuation_groups). out[t] gets tree t's trie.
void continuation_tries(CursorSet* const* sets, const int64_t* slots, const int64_t* max_tokens,
                        const ContinuationRule* rules, size_t max_occurrences, size_t n,
                        const int64_t* ranks, const int64_t* counts,
                        const std::vector<Token>* firsts, size_t num_trees, BranchTrie* out);

// merge_branches of num_trees trees whose candidates were copied already (a batch step's,
// by ContinuationGroupsRun): out[j] is firsts[j] merged with the groups[j]-th group of
// candidates, counts[g] of them from starts[g] in candidates (ranks alike). On the helper
// threads (workers.h) from a few trees on; the first error, in tree order, is raised.
void merge_groups(const std::vector<Token>* firsts, const int64_t* groups, size_t num_trees,
                  const std::vector<Token>* candidates, const int64_t* ranks, const int64_t* starts,
                  const int64_t* counts, BranchTrie* out);

}  // namespace agspec
