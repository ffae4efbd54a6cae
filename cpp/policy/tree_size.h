// The batched tree step's scoring and sizing (agspec.policy.tree_size.size_trees_at_prices,
// its reference, says the rule and its invariants): every tree of a step's flat tries
// scored node by node and cut to the best count at the step's prices, in one call.
//
// A numeric loop of the policy layer, not a policy of its own: what the curves, rates and
// prices are, and which trees are sized, is decided in Python (agspec.drafter.batch). The
// floats are the reference's, in its order (built with -ffp-contract=off, so no multiply
// and add is fused): the same nodes are kept, not merely nearly the same.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace agspec {

// The flat tries of a batch step (continuation_tries' layout): tree t's nodes are
// node_starts[t] .. node_starts[t + 1] - 1, parents and branch_of counted within it.
struct FlatTrieView {
  const int32_t* tokens;       // [num_nodes]
  const int32_t* parents;      // [num_nodes] -1: a child of the root; else an earlier node
  const int32_t* support;      // [num_nodes] >= 0
  const int32_t* branch_of;    // [num_nodes] non-decreasing within a tree; 0: the chain
  const int32_t* node_starts;  // [num_trees + 1] non-decreasing, from 0 to num_nodes
  size_t num_trees;
};

// What to size: sized tree j is tree trees[j] of the tries; its branch b's acceptance
// curve [S(1), S(2), ...] is curves[branch_curves[branch_starts[j] + b]] (curve c is
// curve_values[curve_starts[c] .. curve_starts[c + 1])); its q_a(s) is
// rate_values[rate_of[j] * rates_per_table + min(s, rates_per_table - 1)]; it keeps at
// most budgets[j] nodes. prices[k] is the price of k draft tokens in the batch (k = 0 ..
// num_prices - 1).
struct TreeSizingView {
  const int64_t* trees;          // [num_sized]
  const int64_t* branch_starts;  // [num_sized + 1]
  const int64_t* branch_curves;  // [branch_starts[num_sized]]
  const double* curve_values;
  const int64_t* curve_starts;  // [num_curves + 1]
  size_t num_curves;
  const double* rate_values;  // [num_tables * rates_per_table]
  size_t num_tables;
  size_t rates_per_table;
  const int64_t* rate_of;  // [num_sized]
  const int64_t* budgets;  // [num_sized]
  const double* prices;    // [num_prices]
  size_t num_prices;
  size_t num_sized;
};

// The trees kept: sized tree j is nodes kept_starts[j] .. kept_starts[j + 1] - 1 of the
// three lists, in its node order (every parent before its children), parents counted
// within the kept tree; its first num_chain[j] nodes are what it keeps of its chain
// (branch 0, a prefix: p falls along it).
struct KeptTrees {
  std::vector<int32_t> tokens, parents, support, starts, num_chain;
};

// Inconsistent input (an index out of range, a parent not before its node, branch
// indices that fall, a curve that rises or leaves [0, 1], a rate outside [0, 1], a
// negative support or budget) raises ArgumentError before anything is written.
void size_trees_at_prices(const FlatTrieView& tries, const TreeSizingView& sizing, KeptTrees* out);

}  // namespace agspec
