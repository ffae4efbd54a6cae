// tree_size.h: the module docstring's tree, hand-computed (agspec.policy.tree_size is the
// reference, tested float for float in tests/policy/test_tree_size.py); and random input,
// well-formed or not, which must either be sized or refused with ArgumentError, never
// read out of range (CI runs this under AddressSanitizer + UBSan).
#include "tree_size.h"

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "token_index.h"  // ArgumentError

namespace {

int failures = 0;

void fail(const std::string& what) {
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  ++failures;
}

struct Case {
  std::vector<int32_t> tokens, parents, support, branch_of, node_starts;
  std::vector<int64_t> trees, branch_starts, branch_curves;
  std::vector<double> curve_values;
  std::vector<int64_t> curve_starts;
  std::vector<double> rates;
  size_t per_table = 5;
  std::vector<int64_t> rate_of, budgets;
  std::vector<double> prices;

  void run(agspec::KeptTrees* kept) const {
    const agspec::FlatTrieView tries{tokens.data(),    parents.data(),     support.data(),
                                     branch_of.data(), node_starts.data(), node_starts.size() - 1};
    const agspec::TreeSizingView sizing{trees.data(),
                                        branch_starts.data(),
                                        branch_curves.data(),
                                        curve_values.data(),
                                        curve_starts.data(),
                                        curve_starts.size() - 1,
                                        rates.data(),
                                        rates.size() / per_table,
                                        per_table,
                                        rate_of.data(),
                                        budgets.data(),
                                        prices.data(),
                                        prices.size(),
                                        trees.size()};
    agspec::size_trees_at_prices(tries, sizing, kept);
  }
};

// Tokens [7, 8, 9] and [7, 4] merged: 7 (support 3), 8, 9 (2 each) and the alternative 4
// under 7. p = 0.9, 0.5, 0.4 along the chain's curve and (0.9 - 0.5) * 0.5 = 0.2 for 4.
Case docstring_tree() {
  Case c;
  c.tokens = {7, 8, 9, 4};
  c.parents = {-1, 0, 1, 0};
  c.support = {3, 2, 2, 1};
  c.branch_of = {0, 0, 0, 1};
  c.node_starts = {0, 4};
  c.trees = {0};
  c.branch_starts = {0, 2};
  c.branch_curves = {0, 1};
  c.curve_values = {0.9, 0.5, 0.4, 0.6, 0.3};
  c.curve_starts = {0, 3, 5};
  c.rates = {0.5, 0.5, 0.5, 0.5, 0.5};
  c.rate_of = {0};
  c.budgets = {4};
  c.prices = {0.0, 0.1, 0.2, 0.3, 0.4};
  return c;
}

using Ints = std::vector<int32_t>;

bool kept_is(const agspec::KeptTrees& k, const Ints& tokens, const Ints& parents,
             const Ints& support, const Ints& starts, const Ints& num_chain) {
  return k.tokens == tokens && k.parents == parents && k.support == support && k.starts == starts &&
         k.num_chain == num_chain;
}

void hand_computed() {
  agspec::KeptTrees kept;
  Case c = docstring_tree();
  c.run(&kept);
  if (!kept_is(kept, {7, 8, 9, 4}, {-1, 0, 1, 0}, {3, 2, 2, 1}, {0, 4}, {3})) {
    fail("the docstring tree keeps every node at cheap prices");
  }
  // 0.9 - 0.45 beats 1.4 - 1.2 (two nodes) and the rest: only the root's first child.
  c.prices = {0.0, 0.45, 1.2, 2.0, 3.0};
  c.run(&kept);
  if (!kept_is(kept, {7}, {-1}, {3}, {0, 1}, {1})) {
    fail("dear prices keep the likeliest node alone");
  }
  // Sized twice, the second with a budget of 2: the two likeliest, 7 (0.9) and 8 (0.5).
  c.prices = {0.0, 0.1, 0.2, 0.3, 0.4};
  c.trees = {0, 0};
  c.branch_starts = {0, 2, 4};
  c.branch_curves = {0, 1, 0, 1};
  c.rate_of = {0, 0};
  c.budgets = {4, 2};
  c.run(&kept);
  if (!kept_is(kept, {7, 8, 9, 4, 7, 8}, {-1, 0, 1, 0, -1, 0}, {3, 2, 2, 1, 3, 2}, {0, 4, 6},
               {3, 2})) {
    fail("a budget of 2 keeps the two likeliest nodes");
  }
  // The alternative kept without the chain's tail: renumbered, its parent is still 7.
  c = docstring_tree();
  c.curve_values = {0.9, 0.1, 0.05, 0.6, 0.3};  // 4: (0.9 - 0.1) * 0.5 = 0.4 beats 8
  c.budgets = {2};
  c.run(&kept);
  if (!kept_is(kept, {7, 4}, {-1, 0}, {3, 1}, {0, 2}, {1})) {
    fail("an alternative kept without the chain's tail keeps its parent");
  }
  c = docstring_tree();
  c.parents[1] = 1;  // its own parent
  bool refused = false;
  try {
    c.run(&kept);
  } catch (const agspec::ArgumentError&) {
    refused = true;
  }
  if (!refused) fail("a node that is its own parent is refused");
  c = docstring_tree();
  c.curve_values[1] = 0.95;  // a curve that rises
  refused = false;
  try {
    c.run(&kept);
  } catch (const agspec::ArgumentError&) {
    refused = true;
  }
  if (!refused) fail("a rising curve is refused");
}

// Random lists, mostly out of shape: every call sizes or raises, nothing else.
void hostile(uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  size_t sized_ok = 0, refused = 0;
  for (int round = 0; round < 20000; ++round) {
    Case c;
    const int num_trees = pick(1, 3);
    c.node_starts = {0};
    for (int t = 0; t < num_trees; ++t) {
      const int n = pick(0, 6);
      for (int i = 0; i < n; ++i) {
        c.tokens.push_back(pick(0, 9));
        c.parents.push_back(pick(-2, i));
        c.support.push_back(pick(-1, 6));
        c.branch_of.push_back(pick(0, 3));
      }
      c.node_starts.push_back(c.node_starts.back() + (pick(0, 20) ? n : pick(-2, 2)));
    }
    const int num_curves = pick(1, 4);
    c.curve_starts = {0};
    for (int k = 0; k < num_curves; ++k) {
      const int len = pick(0, 5);
      double v = 1.0;  // mostly falling, now and then rising or out of [0, 1]
      for (int i = 0; i < len; ++i) {
        v = pick(0, 30) ? v * pick(0, 10) / 10.0 : pick(-2, 12) / 10.0;
        c.curve_values.push_back(v);
      }
      c.curve_starts.push_back(c.curve_starts.back() + (pick(0, 20) ? len : -1));
    }
    if (c.curve_starts.back() < 0 || size_t(c.curve_starts.back()) > c.curve_values.size()) {
      continue;  // the binding refuses these (it builds the starts itself)
    }
    c.per_table = size_t(pick(1, 5));
    for (size_t i = 0; i < c.per_table * size_t(pick(1, 2)); ++i) c.rates.push_back(0.3);
    c.branch_starts = {0};
    const int num_sized = pick(0, 3);
    for (int j = 0; j < num_sized; ++j) {
      c.trees.push_back(pick(-1, num_trees));
      const int nb = pick(0, 4);
      for (int b = 0; b < nb; ++b) c.branch_curves.push_back(pick(-1, num_curves));
      c.branch_starts.push_back(int64_t(c.branch_curves.size()));
      c.rate_of.push_back(pick(-1, 2));
      c.budgets.push_back(pick(-1, 8));
    }
    for (int k = pick(1, 8); k > 0; --k) c.prices.push_back(pick(0, 10) / 10.0);
    if (c.node_starts.back() != int32_t(c.parents.size())) continue;  // the binding's check
    agspec::KeptTrees kept;
    try {
      c.run(&kept);
      ++sized_ok;
      if (kept.starts.size() != c.trees.size() + 1 || kept.num_chain.size() != c.trees.size() ||
          size_t(kept.starts.back()) != kept.tokens.size() ||
          kept.parents.size() != kept.tokens.size() || kept.support.size() != kept.tokens.size()) {
        fail("the kept trees' lists out of step");
        continue;
      }
      for (size_t j = 0; j < c.trees.size(); ++j) {
        const int32_t a = kept.starts[j], n = kept.starts[j + 1] - a;
        if (n < 0 || kept.num_chain[j] > n) fail("a kept tree's chain longer than the tree");
        for (int32_t i = 0; i < n; ++i) {
          if (kept.parents[size_t(a + i)] < -1 || kept.parents[size_t(a + i)] >= i) {
            fail("a kept node's parent is not an earlier kept node");
          }
        }
      }
    } catch (const agspec::ArgumentError&) {
      ++refused;
    }
  }
  if (sized_ok == 0 || refused == 0) fail("hostile rounds cover both outcomes");
}

}  // namespace

int main() {
  hand_computed();
  hostile(1);
  hostile(2);
  if (failures) return 1;
  std::printf("tree_size_test: ok\n");
  return 0;
}
