#include "tree_size.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "token_index.h"  // ArgumentError

namespace agspec {

namespace {

[[noreturn]] void bad(const std::string& what) {
  throw ArgumentError("size_trees_at_prices: " + what);
}

// Everything the loop below indexes is in range, so that it needs no check of its own.
void check(const FlatTrieView& tries, const TreeSizingView& s) {
  const int32_t* starts = tries.node_starts;
  if (starts[0] != 0) bad("node_starts must begin at 0");
  for (size_t t = 0; t < tries.num_trees; ++t) {
    if (starts[t + 1] < starts[t]) bad("node_starts must not fall");
  }
  if (s.curve_starts[0] != 0) bad("curve_starts must begin at 0");
  for (size_t c = 0; c < s.num_curves; ++c) {
    if (s.curve_starts[c + 1] < s.curve_starts[c]) bad("curve_starts must not fall");
  }
  // Survival curves and rates are probabilities and a curve never rises: so no node is
  // likelier than its parent, and the best n nodes by p hold every parent of theirs.
  for (size_t c = 0; c < s.num_curves; ++c) {
    double last = 1.0;
    for (int64_t k = s.curve_starts[c]; k < s.curve_starts[c + 1]; ++k) {
      const double v = s.curve_values[k];
      if (!(v >= 0.0 && v <= last)) bad("a curve value is not in [0, 1] or the curve rises");
      last = v;
    }
  }
  if (s.rates_per_table == 0) bad("a rate table needs at least one rate");
  for (size_t k = 0; k < s.num_tables * s.rates_per_table; ++k) {
    if (!(s.rate_values[k] >= 0.0 && s.rate_values[k] <= 1.0)) bad("a rate is not in [0, 1]");
  }
  if (s.num_prices == 0) bad("prices must hold at least price(0)");
  if (s.branch_starts[0] != 0) bad("branch_starts must begin at 0");
  for (size_t j = 0; j < s.num_sized; ++j) {
    const int64_t t = s.trees[j];
    if (t < 0 || size_t(t) >= tries.num_trees) bad("a tree index is out of range");
    const int64_t b0 = s.branch_starts[j], b1 = s.branch_starts[j + 1];
    if (b1 < b0) bad("branch_starts must not fall");
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t c = s.branch_curves[b];
      if (c < 0 || size_t(c) >= s.num_curves) bad("a branch's curve index is out of range");
    }
    if (s.rate_of[j] < 0 || size_t(s.rate_of[j]) >= s.num_tables) {
      bad("a tree's rate table index is out of range");
    }
    if (s.budgets[j] < 0) bad("a budget is negative");
    const int32_t a = starts[t], n = starts[t + 1] - a;
    const int64_t num_branches = b1 - b0;
    int32_t last_branch = 0;
    for (int32_t i = 0; i < n; ++i) {
      const int32_t par = tries.parents[a + i], br = tries.branch_of[a + i];
      if (par < -1 || par >= i) bad("a parent is not an earlier node of its tree");
      if (br < last_branch || br >= num_branches) {
        bad("branch indices must not fall and must have a curve each");
      }
      if (tries.support[a + i] < 0) bad("a support is negative");
      last_branch = br;
    }
  }
}

}  // namespace

void size_trees_at_prices(const FlatTrieView& tries, const TreeSizingView& s, KeptTrees* out) {
  check(tries, s);
  *out = KeptTrees();
  out->starts.push_back(0);
  const size_t top = s.rates_per_table - 1;
  const size_t num_prices = s.num_prices - 1;
  // Per tree, reused: p, the mass of each node (and the root, at 0) not yet given to a
  // child once an alternative took some, and each branch's run (first node, its depth).
  std::vector<double> p, free;
  std::vector<char> has_free;
  std::vector<int32_t> run_start, run_depth, order, new_index;
  for (size_t j = 0; j < s.num_sized; ++j) {
    const int32_t a = tries.node_starts[s.trees[j]];
    const int32_t n = tries.node_starts[s.trees[j] + 1] - a;
    const int32_t* parents = tries.parents + a;
    const int32_t* support = tries.support + a;
    const int32_t* curve_of = tries.branch_of + a;
    const int64_t* curve_ids = s.branch_curves + s.branch_starts[j];
    const size_t num_branches = size_t(s.branch_starts[j + 1] - s.branch_starts[j]);
    const double* rate = s.rate_values + size_t(s.rate_of[j]) * s.rates_per_table;
    p.assign(size_t(n), 0.0);
    free.assign(size_t(n) + 1, 0.0);  // [par + 1]
    has_free.assign(size_t(n) + 1, 0);
    run_start.assign(num_branches, 0);
    run_depth.assign(num_branches, 0);
    int32_t start = 0;
    while (start < n) {
      const int32_t b = curve_of[start];
      int32_t end = start + 1;
      while (end < n && curve_of[end] == b) ++end;
      const int32_t par = parents[start];
      const double* curve = s.curve_values + s.curve_starts[curve_ids[b]];
      const int64_t size = s.curve_starts[curve_ids[b] + 1] - s.curve_starts[curve_ids[b]];
      double p_par, rem = 0.0;
      bool has_rem = has_free[size_t(par + 1)] != 0;
      if (has_rem) rem = free[size_t(par + 1)];
      int64_t d0;
      if (par >= 0) {
        p_par = p[size_t(par)];
        const int32_t pb = curve_of[par];
        d0 = int64_t(run_depth[size_t(pb)]) + par - run_start[size_t(pb)] + 1;
        if (!has_rem && par + 1 < n && curve_of[par + 1] == pb) {
          rem = p_par - p[size_t(par) + 1];  // its first child continues its run
          has_rem = true;
        }
      } else {
        p_par = 1.0;
        d0 = 1;
      }
      run_start[size_t(b)] = start;
      run_depth[size_t(b)] = int32_t(d0);
      double p0;
      if (d0 > size) {
        p0 = 0.0;
      } else if (!has_rem) {  // the parent's first child: its branch goes on
        const double before = d0 >= 2 ? curve[d0 - 2] : 1.0;
        const double h = before > 0.0 ? curve[d0 - 1] / before : 0.0;
        p0 = p_par * (h < 1.0 ? h : 1.0);
      } else {
        const size_t sup = size_t(support[start]);
        p0 = rem > 0.0 ? rem * rate[sup < top ? sup : top] : 0.0;
      }
      free[size_t(par + 1)] = (has_rem ? rem : p_par) - p0;
      has_free[size_t(par + 1)] = 1;
      p[size_t(start)] = p0;
      if (end - start > 1 && p0 > 0.0) {
        int64_t last = start + size - d0 + 1;
        if (last > end) last = end;
        if (last > start + 1) {
          const double base = curve[d0 - 1];
          if (base > 0.0) {
            // p0 · (S(d) / S(d0)): the ratio first, as the reference.
            for (int64_t k = start + 1; k < last; ++k) {
              p[size_t(k)] = p0 * (curve[d0 + (k - start - 1)] / base);
            }
          }
        }
      }
      start = end;
    }
    // Sorted by p, largest first, ties: the earlier node (a stable sort).
    order.resize(size_t(n));
    for (int32_t i = 0; i < n; ++i) order[size_t(i)] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t x, int32_t y) { return p[size_t(x)] > p[size_t(y)]; });
    int64_t limit = s.budgets[j];
    if (limit > n) limit = n;
    if (limit > int64_t(num_prices)) limit = int64_t(num_prices);
    int64_t best = 0;
    double best_value = 0.0, expected = 0.0;
    for (int64_t k = 0; k < limit; ++k) {
      expected += p[size_t(order[size_t(k)])];
      const double value = expected - s.prices[k + 1];
      if (value > best_value) {
        best = k + 1;
        best_value = value;
      }
    }
    // The first `best` in node order; a kept node's new index is its rank among them
    // (every parent is kept, and earlier).
    std::sort(order.begin(), order.begin() + best);
    new_index.assign(size_t(n), -1);
    int32_t num_chain = 0;
    for (int64_t k = 0; k < best; ++k) {
      const int32_t i = order[size_t(k)];
      new_index[size_t(i)] = int32_t(k);
      out->tokens.push_back(tries.tokens[a + i]);
      out->parents.push_back(parents[i] >= 0 ? new_index[size_t(parents[i])] : -1);
      out->support.push_back(support[i]);
      if (curve_of[i] == 0) ++num_chain;
    }
    out->starts.push_back(int32_t(out->tokens.size()));
    out->num_chain.push_back(num_chain);
  }
}

}  // namespace agspec
