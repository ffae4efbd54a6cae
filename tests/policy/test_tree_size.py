"""Tree scoring and sizing against brute force."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agspec.policy.cost_length import batch_prices
from agspec.policy.tree_size import (
    BranchRates,
    flatten_tries,
    merge_branches,
    node_probabilities,
    size_flat_tries_at_prices,
    size_tree,
    size_trees_at_prices,
)


@st.composite
def scored_trees(draw):
    branches = draw(
        st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=4), min_size=1, max_size=4)
    )
    tokens, parents, support, curve_of = merge_branches(branches)
    curves = []
    for _ in branches:
        steps = draw(st.lists(st.floats(0.0, 1.0), min_size=0, max_size=4))
        curve, s = [], 1.0
        for h in steps:
            s *= h
            curve.append(s)
        curves.append(curve)
    q = draw(st.floats(0.0, 1.0))
    p = node_probabilities(parents, support, curve_of, curves, lambda _s: q)
    return branches, tokens, parents, support, p


@settings(max_examples=300, deadline=None)
@given(scored_trees())
def test_merge_keeps_every_branch_and_merges_shared_prefixes(case):
    branches, tokens, parents, support, _ = case
    paths = set()
    for node in range(len(tokens)):
        path, i = [], node
        while i >= 0:
            path.append(tokens[i])
            i = parents[i]
        paths.add(tuple(reversed(path)))
    prefixes = {tuple(b[:k]) for b in branches for k in range(1, len(b) + 1)}
    assert paths == prefixes  # every prefix once: identical prefixes merged
    # Support: how many branches pass through each node.
    for node in range(len(tokens)):
        path, i = [], node
        while i >= 0:
            path.append(tokens[i])
            i = parents[i]
        path.reverse()
        assert support[node] == sum(1 for b in branches if b[: len(path)] == path)
    # The first branch is nodes 0 .. len - 1 in order.
    assert tokens[: len(branches[0])] == branches[0]
    assert parents[: len(branches[0])] == list(range(-1, len(branches[0]) - 1))


@settings(max_examples=300, deadline=None)
@given(scored_trees())
def test_a_node_is_never_likelier_than_its_parent_and_siblings_share_its_mass(case):
    _, tokens, parents, _, p = case
    for i, par in enumerate(parents):
        assert 0.0 <= p[i] <= (p[par] if par >= 0 else 1.0) + 1e-12
    for node in range(-1, len(tokens)):
        kids = [i for i, par in enumerate(parents) if par == node]
        # Disjoint events: the children together are no likelier than the node.
        assert sum(p[i] for i in kids) <= (p[node] if node >= 0 else 1.0) + 1e-9


def _closed(subset, parents):
    return all(parents[i] < 0 or parents[i] in subset for i in subset)


@settings(max_examples=300, deadline=None)
@given(
    scored_trees(),
    st.lists(st.floats(1.0, 3.0), min_size=12, max_size=12),
    st.integers(0, 12),
)
def test_size_tree_is_the_best_tree_by_brute_force(case, raw_costs, budget):
    """Over every parent-closed subset of at most `budget` nodes, none has a better
    (1 + Σ p) / c(n + 1) than size_tree's pick, and the pick is parent-closed."""
    _, tokens, parents, _, p = case
    costs = [1.0]
    for c in raw_costs:
        costs.append(max(costs[-1], c))  # a step never costs less with more tokens
    n = len(tokens)
    if n > 10:
        return
    keep = size_tree(p, costs, budget)
    assert len(keep) <= budget and _closed(set(keep), parents)
    value = (1 + sum(p[i] for i in keep)) / costs[len(keep)]
    best = 1.0
    for k in range(0, min(n, budget) + 1):
        for subset in itertools.combinations(range(n), k):
            if _closed(set(subset), parents):
                best = max(best, (1 + sum(p[i] for i in subset)) / costs[k])
    assert value == pytest.approx(best, rel=1e-9, abs=1e-12)


def test_size_tree_at_batch_prices_is_the_batch_rule():
    p = [0.9, 0.5, 0.4, 0.2]
    costs = [1.0 + 0.25 * k for k in range(6)]
    prices = batch_prices(costs, batch_size=4, mean_draft=2.0, mean_committed=2.0)
    keep = size_tree(p, None, 4, prices=prices)
    gains = [sum(sorted(p, reverse=True)[:n]) - prices[n] for n in range(5)]
    assert len(keep) == max(range(5), key=lambda n: (gains[n], -n))


def test_branch_rates_learn_per_agent_and_support():
    rates = BranchRates(prior=0.2, prior_weight=4.0)
    for _ in range(6):
        rates.observe("coder", 2, True)
    rates.observe("coder", 9, False)  # supports above 4 share one bucket
    assert rates.rate("coder", 2) == pytest.approx((0.8 + 6) / 10)
    assert rates.rate("coder", 4) == pytest.approx(0.8 / 5)
    assert rates.rate("reviewer", 2) == 0.2
    with pytest.raises(ValueError, match="prior in"):
        BranchRates(prior=1.5)


def test_a_tiny_curve_does_not_overflow_the_scores():
    # A branch whose curve starts at the smallest float: p stays within its parent's.
    tokens, parents, support, curve_of = merge_branches([[1], [0, 0]])
    p = node_probabilities(parents, support, curve_of, [[0.0], [5e-324, 5e-324]], lambda s: 1.0)
    assert p == [0.0, 1.0, 1.0]


def _reference_probabilities(parents, support, curve_of, curves, rate):
    """node_probabilities as first written: node by node, every run found by scanning
    and every node's free mass kept (the oracle of the run-at-a-time version)."""
    n = len(parents)
    p = [0.0] * n
    depth = [0] * n
    free: dict[int, float] = {}
    start = 0
    while start < n:
        b = curve_of[start]
        end = start + 1
        while end < n and curve_of[end] == b and parents[end] == end - 1:
            end += 1
        par = parents[start]
        p_par = p[par] if par >= 0 else 1.0
        d0 = depth[par] + 1 if par >= 0 else 1
        curve = curves[b]
        rem = free.get(par)
        if d0 > len(curve):
            p0 = 0.0
        elif rem is None:
            before = curve[d0 - 2] if d0 >= 2 else 1.0
            h = curve[d0 - 1] / before if before > 0 else 0.0
            p0 = p_par * (h if h < 1.0 else 1.0)
        else:
            p0 = rem * rate(support[start]) if rem > 0.0 else 0.0
        free[par] = (p_par if rem is None else rem) - p0
        p[start] = p0
        depth[start] = d0
        last = min(end, start + len(curve) - d0 + 1)
        base = curve[d0 - 1] if d0 <= len(curve) else 0.0
        if base > 0.0 and p0 > 0.0:
            for i in range(start + 1, last):
                p[i] = p0 * (curve[d0 - 1 + i - start] / base)
        for i in range(start + 1, end):
            depth[i] = d0 + i - start
            free[i - 1] = p[i - 1] - p[i]
        start = end
    return p


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=7), min_size=1, max_size=9),
    st.lists(st.integers(1, 3), min_size=9, max_size=9),
    st.data(),
)
def test_node_probabilities_equal_the_node_by_node_reference(branches, weights, data):
    tokens, parents, support, curve_of = merge_branches(branches, weights[: len(branches)])
    curves = []
    for _ in branches:
        steps = data.draw(st.lists(st.sampled_from([1.0, 0.9, 0.5, 0.0]), max_size=7))
        curve, s = [], 1.0
        for h in steps:
            s *= h
            curve.append(s)
        curves.append(curve)
    table = data.draw(st.lists(st.floats(0.0, 0.99), min_size=5, max_size=5))
    rate = lambda k: table[min(k, 4)]  # noqa: E731
    got = node_probabilities(parents, support, curve_of, curves, rate)
    assert got == _reference_probabilities(parents, support, curve_of, curves, rate)


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 5), st.data())
def test_size_trees_at_prices_equal_the_per_tree_functions(num_trees, data):
    """The batched tree step's fused scoring and sizing against node_probabilities and
    size_tree of each tree: the same nodes (curves with repeated steps and zeros, so that
    ties between nodes and exhausted branches occur)."""
    shapes, all_curves, tables, budgets, want = [], [], [], [], []
    raw = data.draw(st.lists(st.floats(0.0, 3.0), min_size=2, max_size=20))
    prices = batch_prices(
        [1.0, *(1.0 + sum(raw[:k]) / 4 for k in range(1, len(raw)))],
        batch_size=data.draw(st.integers(2, 64)),
        mean_draft=data.draw(st.floats(0.0, 8.0)),
        mean_committed=data.draw(st.floats(0.5, 4.0)),
    )
    for _ in range(num_trees):
        branches = data.draw(
            st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=7), min_size=1, max_size=9)
        )
        weights = data.draw(st.lists(st.integers(1, 6), min_size=9, max_size=9))
        _, parents, support, curve_of = merge_branches(branches, weights[: len(branches)])
        curves = []
        for _ in branches:
            steps = data.draw(st.lists(st.sampled_from([1.0, 0.9, 0.5, 0.25, 0.0]), max_size=7))
            curve, s = [], 1.0
            for h in steps:
                s *= h
                curve.append(s)
            curves.append(curve)
        table = data.draw(st.lists(st.sampled_from([0.0, 0.2, 0.5, 0.99]), min_size=5, max_size=5))
        budget = data.draw(st.integers(0, 20))
        p = node_probabilities(parents, support, curve_of, curves, lambda k, t=table: t[min(k, 4)])
        want.append(size_tree(p, None, budget, prices=prices))
        shapes.append((parents, support, curve_of))
        all_curves.append(curves)
        tables.append(table)
        budgets.append(budget)
    assert size_trees_at_prices(shapes, all_curves, tables, budgets, prices) == want


_CURVE_STEPS = st.sampled_from([1.0, 0.9, 0.5, 0.25, 0.0, 1e-300, 0.7000000000000001])


def _kept(keep, tokens, parents, support):
    """The tree of nodes `keep` of one trie (AgSpecCall.keep_tree's renumbering)."""
    new_index = {node: k for k, node in enumerate(keep)}
    new_index[-1] = -1
    return (
        [tokens[i] for i in keep],
        [new_index[parents[i]] for i in keep],
        [support[i] for i in keep],
    )


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 6), st.data())
def test_the_native_sizing_keeps_the_nodes_the_reference_keeps(num_trees, data):
    """`size_flat_tries_at_prices` (cpp/policy/tree_size.cc) against `size_trees_at_prices`
    on the same tries: flat, some trees not sized and the rest in any order, curves and
    rate tables shared between branches and trees, curves that hold (ties) or vanish or
    fall by a float's last bit, prices of every shape. The kept trees must be the
    reference's nodes, renumbered: the native loop computes the same floats in the same
    order."""
    tries, shapes, curves_of_tree, table_of_tree = [], [], [], []
    curves: list[list[float]] = []
    rates = st.lists(st.sampled_from([0.0, 0.2, 0.5, 0.99, 1.0]), min_size=5, max_size=5)
    tables = [data.draw(rates) for _ in range(data.draw(st.integers(1, 3)))]
    for _ in range(num_trees):
        branches = data.draw(
            st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=7), min_size=1, max_size=9)
        )
        weights = data.draw(st.lists(st.integers(1, 6), min_size=9, max_size=9))
        tokens, parents, support, curve_of = merge_branches(branches, weights[: len(branches)])
        ids = []
        for _ in branches:
            if curves and data.draw(st.booleans()):
                ids.append(data.draw(st.integers(0, len(curves) - 1)))  # a shared curve
                continue
            curve, s = [], 1.0
            for h in data.draw(st.lists(_CURVE_STEPS, max_size=7)):
                s *= h
                curve.append(s)
            ids.append(len(curves))
            curves.append(curve)
        tries.append((tokens, parents, support, curve_of, [-1]))
        shapes.append((parents, support, curve_of))
        curves_of_tree.append(ids)
        table_of_tree.append(data.draw(st.integers(0, len(tables) - 1)))
    flat = flatten_tries(tries)
    sized = data.draw(st.lists(st.integers(0, num_trees - 1), max_size=num_trees + 2))
    budgets = [data.draw(st.integers(0, 40)) for _ in sized]
    prices = [0.0, *sorted(data.draw(st.lists(st.floats(0.0, 2.0), min_size=0, max_size=30)))]
    if data.draw(st.booleans()):
        prices = [0.0, *data.draw(st.lists(st.floats(-1.0, 2.0), max_size=30))]  # any shape
    branch_curves, branch_starts = [], [0]
    for t in sized:
        branch_curves += curves_of_tree[t]
        branch_starts.append(len(branch_curves))
    got_tokens, got_parents, got_support, starts, num_chain = size_flat_tries_at_prices(
        (flat[0], flat[1], flat[2], flat[3], flat[5]),
        sized,
        branch_curves=branch_curves,
        branch_starts=branch_starts,
        curves=curves,
        rate_tables=tables,
        rate_of=[table_of_tree[t] for t in sized],
        budgets=budgets,
        prices=prices,
    )
    want = size_trees_at_prices(
        [shapes[t] for t in sized],
        [[curves[c] for c in curves_of_tree[t]] for t in sized],
        [tables[table_of_tree[t]] for t in sized],
        budgets,
        prices,
    )
    assert len(starts) == len(sized) + 1 and len(num_chain) == len(sized)
    for j, (t, keep) in enumerate(zip(sized, want)):
        a, b = starts[j], starts[j + 1]
        tokens, parents, support = tries[t][:3]
        assert (got_tokens[a:b], got_parents[a:b], got_support[a:b]) == _kept(
            keep, tokens, parents, support
        )
        chain_nodes = tries[t][3].count(0)  # the chain's nodes come first, branch 0
        assert num_chain[j] == sum(1 for i in keep if i < chain_nodes)


def _one_tree(**changes):
    """The module docstring's tree as `size_flat_tries_at_prices` arguments, changed."""
    args = dict(
        tries=([7, 8, 9, 4], [-1, 0, 1, 0], [3, 2, 2, 1], [0, 0, 0, 1], [0, 4]),
        trees=[0],
        branch_curves=[0, 1],
        branch_starts=[0, 2],
        curves=[[0.9, 0.5, 0.4], [0.6, 0.3]],
        rate_tables=[[0.5] * 5],
        rate_of=[0],
        budgets=[4],
        prices=[0.0, 0.1, 0.2, 0.3, 0.4],
    )
    args.update(changes)
    tries, trees = args.pop("tries"), args.pop("trees")
    return size_flat_tries_at_prices(tries, trees, **args)


def test_the_native_sizing_of_the_docstring_tree():
    # p = 0.9, 0.5, 0.4 along the chain 7 8 9, (0.9 - 0.5) * 0.5 = 0.2 for 4 under 7.
    assert _one_tree() == ([7, 8, 9, 4], [-1, 0, 1, 0], [3, 2, 2, 1], [0, 4], [3])
    # Dear prices: only the likeliest node pays (0.9 - 0.85), then none.
    assert _one_tree(prices=[0.0, 0.85, 2.0, 3.0, 4.0]) == ([7], [-1], [3], [0, 1], [1])
    assert _one_tree(prices=[0.0, 1.0]) == ([], [], [], [0, 0], [0])
    assert _one_tree(budgets=[0]) == ([], [], [], [0, 0], [0])
    # The chain's curve collapses after 7: the alternative 4 (0.9 * 0.5) outranks 8.
    assert _one_tree(curves=[[0.9, 0.01, 0.0], [0.6, 0.3]], budgets=[2]) == (
        [7, 4],
        [-1, 0],
        [3, 1],
        [0, 2],
        [1],
    )
    none = _one_tree(trees=[], branch_starts=[0], branch_curves=[], rate_of=[], budgets=[])
    assert none == ([], [], [], [0], [])


_TRIE = ([7, 8, 9, 4], [-1, 0, 1, 0], [3, 2, 2, 1], [0, 0, 0, 1], [0, 4])


def _trie(field, values):
    out = list(_TRIE)
    out[field] = values
    return tuple(out)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"tries": _trie(1, [-1, 2, 1, 0])}, "earlier node"),
        ({"tries": _trie(1, [-1, 0, 1, -2])}, "earlier node"),
        ({"tries": _trie(3, [0, 1, 0, 1])}, "must not fall"),
        ({"tries": _trie(3, [0, 0, 0, 2])}, "curve each"),
        ({"tries": _trie(2, [3, 2, -2, 1])}, "support"),
        ({"tries": _trie(4, [0, 3])}, "end at the nodes"),
        ({"tries": _trie(4, [0, 5, 4])}, "not fall"),
        ({"tries": _trie(2, [3, 2, 2])}, "per node"),
        ({"tries": _trie(0, [7, 8, 9])}, "per node"),
        ({"trees": [1]}, "tree index"),
        ({"trees": [-1]}, "tree index"),
        ({"branch_curves": [0, 2]}, "curve index"),
        ({"branch_starts": [0, 3]}, "end at the branch curves"),
        ({"rate_of": [1]}, "rate table"),
        ({"rate_tables": [[0.5] * 5, [0.5] * 4]}, "unequal"),
        ({"budgets": [-1]}, "negative"),
        ({"budgets": [4, 4]}, "per sized tree"),
        ({"curves": [[0.9, float("nan"), 0.4], [0.6, 0.3]]}, r"\[0, 1\]"),
        ({"curves": [[0.9, 0.5, 0.6], [0.6, 0.3]]}, "rises"),
        ({"curves": [[1.5, 0.5, 0.4], [0.6, 0.3]]}, "rises"),
        ({"curves": [[0.9, 0.5, -0.1], [0.6, 0.3]]}, r"\[0, 1\]"),
        ({"rate_tables": [[float("inf")] * 5]}, "rate is not"),
        ({"rate_tables": [[0.5, 0.5, 1.5, 0.5, 0.5]]}, "rate is not"),
        ({"prices": []}, "at least price"),
    ],
)
def test_the_native_sizing_refuses_inconsistent_input(changes, message):
    with pytest.raises(ValueError, match=message):
        _one_tree(**changes)
