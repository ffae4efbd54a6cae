#include "branch_trie.h"

#include <algorithm>
#include <exception>
#include <numeric>
#include <string>

#include "token_index.h"
#include "workers.h"

namespace agspec {

namespace {

bool is_prefix_of(const std::vector<Token>& a, const std::vector<Token>& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// The trie under construction: children as linked lists (a node has few), the root's
// children in root_first_.
class TrieBuilder {
 public:
  explicit TrieBuilder(BranchTrie& t) : t_(t) {}

  // Room for `nodes` nodes in every per-node array (at most the branches' total length).
  void reserve(size_t nodes) {
    t_.tokens.reserve(nodes);
    t_.parents.reserve(nodes);
    t_.support.reserve(nodes);
    t_.branch_of.reserve(nodes);
    next_.reserve(nodes);
    first_child_.reserve(nodes);
    last_child_.reserve(nodes);
  }

  void add(const std::vector<Token>& branch, int32_t weight, int32_t index) {
    int32_t node = -1;
    size_t j = 0;
    const size_t n = branch.size();
    for (; j < n; ++j) {
      const int32_t child = find(node, branch[j]);
      if (child < 0) break;
      t_.support[size_t(child)] += weight;
      node = child;
    }
    for (; j < n; ++j) {
      const int32_t id = int32_t(t_.tokens.size());
      t_.tokens.push_back(branch[j]);
      t_.parents.push_back(node);
      t_.support.push_back(weight);
      t_.branch_of.push_back(index);
      next_.push_back(-1);
      first_child_.push_back(-1);
      last_child_.push_back(-1);
      link(node, id);
      node = id;
    }
  }

 private:
  int32_t find(int32_t node, Token token) const {
    int32_t c = node < 0 ? root_first_ : first_child_[size_t(node)];
    while (c >= 0 && t_.tokens[size_t(c)] != token) c = next_[size_t(c)];
    return c;
  }
  void link(int32_t node, int32_t id) {
    int32_t& first = node < 0 ? root_first_ : first_child_[size_t(node)];
    int32_t& last = node < 0 ? root_last_ : last_child_[size_t(node)];
    if (first < 0) {
      first = id;
    } else {
      next_[size_t(last)] = id;
    }
    last = id;
  }
  BranchTrie& t_;
  std::vector<int32_t> next_, first_child_, last_child_;  // per node
  int32_t root_first_ = -1, root_last_ = -1;
};

}  // namespace

BranchTrie merge_branches(const std::vector<Token>& first, const std::vector<Token>* candidates,
                          const int64_t* ranks, size_t n) {
  // The distinct candidates that add something, by their first copy, and their weights.
  std::vector<size_t> kept;
  std::vector<int32_t> weight;
  for (size_t k = 0; k < n; ++k) {
    const std::vector<Token>& c = candidates[k];
    if (c.empty() || is_prefix_of(c, first)) continue;
    size_t u = 0;
    while (u < kept.size() && candidates[kept[u]] != c) ++u;
    if (u == kept.size()) {
      kept.push_back(k);
      weight.push_back(1);
    } else {
      ++weight[u];
    }
  }
  std::vector<size_t> order(kept.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return ranks[kept[a]] < ranks[kept[b]]; });
  BranchTrie t;
  TrieBuilder builder(t);
  size_t nodes = first.size();
  for (const size_t k : kept) nodes += candidates[k].size();
  builder.reserve(nodes);
  t.origin.reserve(kept.size() + 1);
  t.origin.push_back(-1);
  builder.add(first, 1, 0);
  for (size_t b = 0; b < order.size(); ++b) {
    const size_t u = order[b];
    t.origin.push_back(int32_t(kept[u]));
    builder.add(candidates[kept[u]], weight[u], int32_t(b + 1));
  }
  return t;
}

void continuation_tries(CursorSet* const* sets, const int64_t* slots, const int64_t* max_tokens,
                        const ContinuationRule* rules, size_t max_occurrences, size_t n,
                        const int64_t* ranks, const int64_t* counts,
                        const std::vector<Token>* firsts, size_t num_trees, BranchTrie* out) {
  size_t total = 0;
  for (size_t t = 0; t < num_trees; ++t) {
    if (counts[t] < 0) throw ArgumentError("continuation_tries: a negative candidate count");
    total += size_t(counts[t]);
  }
  if (total != n) {
    throw ArgumentError("continuation_tries: the counts sum to " + std::to_string(total) +
                        ", not the " + std::to_string(n) + " candidates");
  }
  std::vector<std::vector<Token>> conts(n);
  std::vector<size_t> start(num_trees + 1, 0);
  for (size_t t = 0; t < num_trees; ++t) start[t + 1] = start[t] + size_t(counts[t]);
  continuation_groups(sets, counts, num_trees, slots, max_tokens, rules, max_occurrences,
                      conts.data(), [&](size_t t) {
                        out[t] = merge_branches(firsts[t], conts.data() + start[t],
                                                ranks + start[t], size_t(counts[t]));
                      });
}

void merge_groups(const std::vector<Token>* firsts, const int64_t* groups, size_t num_trees,
                  const std::vector<Token>* candidates, const int64_t* ranks, const int64_t* starts,
                  const int64_t* counts, BranchTrie* out) {
  // A few trees a task (tasks must not throw: each keeps its error).
  constexpr size_t kTreesPerTask = 4;
  std::vector<std::exception_ptr> errors((num_trees + kTreesPerTask - 1) / kTreesPerTask);
  run_tasks(errors.size(), [&](size_t task) {
    try {
      const size_t end = std::min(num_trees, (task + 1) * kTreesPerTask);
      for (size_t j = task * kTreesPerTask; j < end; ++j) {
        const size_t g = size_t(groups[j]);
        out[j] =
            merge_branches(firsts[j], candidates + starts[g], ranks + starts[g], size_t(counts[g]));
      }
    } catch (...) {
      errors[task] = std::current_exception();
    }
  });
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace agspec
