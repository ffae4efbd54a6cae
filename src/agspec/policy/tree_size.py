"""Token trees (beyond the paper): merge candidate branches, score each node, size the tree
with the cost rule.

Candidates are continuations from several occurrences and every corpus, the first one
the chain the drafter would draft alone (`agspec.drafter.call`). `merge_branches` puts
them in one trie (identical prefixes merged, each node counting the branches through it:
its support) and `node_probabilities` scores each node with an estimate of the chance
the model's output reaches it:

- the first child of a node continues the branch that made it:
  p(child) = p(node) · S(d) / S(d − 1), S that branch's acceptance curve (the per-agent
  survival by match length, `MatchSurvival`) and d the child's depth: along the chain
  this is S(d) itself;
- every other child is an alternative, tried when the children before it are wrong
  (ranked in the order their branches came: the drafter puts the longest match first):
  p(alt) = (p(node) − Σ p(earlier children)) · q_a(support), q_a learned online per agent
  and support (`BranchRates`: how often an alternative of that support, the number of
  candidates through it, was the right token when the ones before it were not).

A node is never likelier than its parent, so the nodes sorted by p (ties: the earlier
node) list every parent before its children, and the best tree of n nodes is the first n
of them. `size_tree` then picks n as the chain rule picks a length
(`agspec.policy.cost_length`): at batch size 1 the n maximizing (1 + Σ p) / c(n + 1),
at larger batches Σ p − price(n) at the batch's prices. Where a wider tree does not pay
(a CPU profile: each verified token costs), it keeps the chain's nodes, or none.

>>> tokens, parents, support, curve_of = merge_branches([[7, 8, 9], [7, 4], [7, 8, 9]])
>>> tokens, parents, support
([7, 8, 9, 4], [-1, 0, 1, 0], [3, 2, 2, 1])
>>> p = node_probabilities(parents, support, curve_of, [[0.9, 0.5, 0.4], [0.6, 0.3], []],
...                        lambda s: 0.5)
>>> [round(x, 3) for x in p]     # 7: 0.9, 8: 0.5, 9: 0.4, 4: (0.9 - 0.5) * 0.5
[0.9, 0.5, 0.4, 0.2]
>>> size_tree(p, [1.0] * 5, 4)   # flat costs (a big GPU at batch 1): every node pays
[0, 1, 2, 3]
>>> size_tree(p, [1.0, 1.2, 1.5, 2.0, 2.6], 4)   # 2.4 / 1.5 beats 2.8 / 2.0
[0, 1]
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from typing import TypeAlias

from agspec import _native
from agspec.policy.cost_length import best_length, best_length_at_prices

__all__ = [
    "BranchRates",
    "BranchTrie",
    "FlatTries",
    "KeptTrees",
    "begin_tree_candidates",
    "flatten_tries",
    "grow_begun_trees",
    "merge_branches",
    "merge_candidates",
    "node_probabilities",
    "size_flat_tries_at_prices",
    "size_tree",
    "size_trees_at_prices",
]

# A merged trie: (tokens, parents, support, branch_of, origin), as `merge_candidates`
# (and the native `continuation_tries`, its batched twin) return it.
BranchTrie: TypeAlias = tuple[list[int], list[int], list[int], list[int], list[int]]

# Many merged tries in seven lists, tree after tree: (tokens, parents, support, branch_of,
# origin, node_starts, origin_starts), as `continuation_tries_flat` returns them
# (tree t's nodes are node_starts[t] .. node_starts[t + 1] - 1, its parents counted within
# it; its origin origin_starts[t] .. origin_starts[t + 1] - 1). `flatten_tries` makes it.
FlatTries: TypeAlias = tuple[
    list[int], list[int], list[int], list[int], list[int], list[int], list[int]
]

# Trees kept by `size_flat_tries_at_prices`, in five lists: (tokens, parents, support,
# starts, num_chain); tree j is nodes starts[j] .. starts[j + 1] - 1 of the first three
# (parents counted within it), its first num_chain[j] nodes what it keeps of its chain.
KeptTrees: TypeAlias = tuple[list[int], list[int], list[int], list[int], list[int]]

# Supports above this share one rate (a node most candidates agree on).
MAX_SUPPORT_BUCKET = 4


class BranchRates:
    """q_a(support): P(an alternative child is the right token | its parent was reached
    and the children ranked before it were wrong), per agent and support bucket (1 ..
    MAX_SUPPORT_BUCKET), learned online from every verified tree, with a prior of
    `prior` at weight `prior_weight` (a fifth: the right token is among the top-3
    continuations in about a fifth of the steps that fail on the first draft token,
    docs/drafter.md's step breakdown).

    >>> r = BranchRates(prior=0.2, prior_weight=4.0)
    >>> r.rate("coder", 1)
    0.2
    >>> r.observe("coder", 1, True); round(r.rate("coder", 1), 3)   # (0.8 + 1) / 5
    0.36
    """

    def __init__(self, *, prior: float = 0.2, prior_weight: float = 4.0) -> None:
        if not 0.0 < prior < 1.0 or not prior_weight > 0:
            raise ValueError(
                f"need prior in (0, 1) and prior_weight > 0, got {prior!r} and {prior_weight!r}"
            )
        self.prior, self.prior_weight = float(prior), float(prior_weight)
        # (agent, support bucket) -> [trials, successes], the prior included
        self._counts: dict[tuple[str, int], list[float]] = {}
        # agent -> its `rates_for`, until the next `observe` (a batch step scores many
        # trees between two verifications).
        self._tables: dict[str, Callable[[int], float]] = {}
        self._lists: dict[str, list[float]] = {}

    def rate(self, agent: str, support: int) -> float:
        counts = self._counts.get((agent, min(support, MAX_SUPPORT_BUCKET)))
        if counts is None:
            return self.prior
        return counts[1] / counts[0]

    def rates_for(self, agent: str) -> Callable[[int], float]:
        """q_a as a function of the support, for one agent (one tree's scoring): the
        agent's rates read once, so that one tree's scoring does no lookups by key (and
        kept until the next `observe`)."""
        fn = self._tables.get(agent)
        if fn is None:
            table = [self.rate(agent, s) for s in range(MAX_SUPPORT_BUCKET + 1)]
            top = MAX_SUPPORT_BUCKET

            def fn(support: int) -> float:
                return table[support if support < top else top]

            self._tables[agent] = fn
        return fn

    def table_for(self, agent: str) -> list[float]:
        """[q_a(0), ..., q_a(MAX_SUPPORT_BUCKET)] for one agent (`size_trees_at_prices`),
        read once and kept until the next `observe`, as `rates_for`."""
        table = self._lists.get(agent)
        if table is None:
            table = self._lists[agent] = [
                self.rate(agent, s) for s in range(MAX_SUPPORT_BUCKET + 1)
            ]
        return table

    def observe(self, agent: str, support: int, right: bool) -> None:
        self._tables.pop(agent, None)
        self._lists.pop(agent, None)
        key = (agent, min(support, MAX_SUPPORT_BUCKET))
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = [self.prior_weight, self.prior * self.prior_weight]
        counts[0] += 1.0
        if right:
            counts[1] += 1.0


def merge_branches(
    branches: Sequence[Sequence[int]], weights: Sequence[int] | None = None
) -> tuple[list[int], list[int], list[int], list[int]]:
    """One trie of the branches, in topological order: (tokens, parents, support,
    curve_of). The first branch's nodes come first, in order (it stays the tree's first
    branch); each later branch walks the nodes it shares with earlier ones (their support
    grows by its weight, 1 by default: a branch found that many times) and adds the rest.
    `curve_of[i]` is the branch that made node i. A branch's new nodes are consecutive,
    each the first child of the one before (`node_probabilities` relies on it)."""
    tokens: list[int] = []
    parents: list[int] = []
    support: list[int] = []
    curve_of: list[int] = []
    # (parent, token) -> child: one dict for every edge of the trie.
    edges: dict[tuple[int, int], int] = {}
    for b, branch in enumerate(branches):
        w = 1 if weights is None else weights[b]
        node = -1
        j = 0
        n = len(branch)
        while j < n:
            child = edges.get((node, branch[j]))
            if child is None:
                break
            support[child] += w
            node = child
            j += 1
        if j == n:
            continue
        # The rest is new: consecutive nodes, each hanging from the one before.
        start = len(tokens)
        rest = branch[j:]
        k = len(rest)
        tokens.extend(rest)
        parents.append(node)
        parents.extend(range(start, start + k - 1))
        support.extend([w] * k)
        curve_of.extend([b] * k)
        edges.update(zip(zip(parents[start:], rest), range(start, start + k)))
    return tokens, parents, support, curve_of


def merge_candidates(
    first: Sequence[int], candidates: Sequence[Sequence[int]], ranks: Sequence[int]
) -> BranchTrie:
    """`merge_branches` of a token tree's candidates after its first branch: empty
    candidates and prefixes of the first are dropped (they add nothing), identical ones
    kept once with their count as weight, the rest ordered stably by the rank of their
    first copy (smallest first). Returns the trie and `origin`: origin[b] is the candidate
    whose first copy is branch b (origin[0] = -1, the first branch). The reference of the
    native `continuation_tries` (cpp/index/branch_trie.h), which copies and merges every
    request's candidates of a batch step in one call.

    >>> merge_candidates([7, 4, 2], [[7, 4], [7, 8, 9], [5], [7, 8, 9]], [0, 0, 1, 0])
    ([7, 4, 2, 8, 9, 5], [-1, 0, 1, 0, 3, -1], [3, 1, 1, 2, 2, 1], [0, 0, 0, 1, 1, 2], [-1, 1, 2])
    """
    chain = list(first)
    found: dict[tuple[int, ...], list[int]] = {}  # candidate -> [first copy, copies]
    for k, alt in enumerate(candidates):
        if alt and list(alt) != chain[: len(alt)]:
            key = tuple(alt)
            seen = found.get(key)
            if seen is None:
                found[key] = [k, 1]
            else:
                seen[1] += 1
    ranked = sorted(found.items(), key=lambda kv: ranks[kv[1][0]])
    branches: list[Sequence[int]] = [chain, *(alt for alt, _ in ranked)]
    weights = [1, *(w for _, (_, w) in ranked)]
    tokens, parents, support, branch_of = merge_branches(branches, weights)
    return tokens, parents, support, branch_of, [-1, *(k for _, (k, _) in ranked)]


def flatten_tries(tries: Sequence[BranchTrie]) -> FlatTries:
    """The tries in seven lists, tree after tree (`FlatTries`).

    >>> flatten_tries([([7, 8], [-1, 0], [1, 1], [0, 0], [-1]), ([5], [-1], [2], [1], [-1, 0])])
    ([7, 8, 5], [-1, 0, -1], [1, 1, 2], [0, 0, 1], [-1, -1, 0], [0, 2, 3], [0, 1, 3])
    """
    out: FlatTries = ([], [], [], [], [], [0], [0])
    for trie in tries:
        for field, values in zip(out, trie):
            field.extend(values)
        out[5].append(len(out[0]))
        out[6].append(len(out[4]))
    return out


def node_probabilities(
    parents: Sequence[int],
    support: Sequence[int],
    curve_of: Sequence[int],
    curves: Sequence[Sequence[float]],
    rate: Callable[[int], float],
) -> list[float]:
    """p of every node (see the module docstring) of a `merge_branches` trie;
    `curves[b]` is branch b's acceptance curve [S(1), S(2), ...] (a node deeper than its
    curve gets p = 0) and `rate(support)` is q_a. Alternatives of one node are ranked in
    the order their branches came.

    One step per run of new nodes of a branch (`merge_branches`: a branch's new nodes
    are consecutive, each the first child of the one before, and branch indices never
    fall along the nodes): its first node is the first child of its parent or an
    alternative; the rest follow its curve, p(d) = p(first) · S(d) / S(d0)."""
    n = len(parents)
    p = [0.0] * n
    depth = [0] * n
    # Mass of each node not yet given to a child, once an alternative took some; a node
    # inside a run that no alternative took from has p(node) − p(its run's next node).
    free: dict[int, float] = {}
    start = 0
    while start < n:
        b = curve_of[start]
        end = bisect_right(curve_of, b, start)  # the run: every node of branch b
        par = parents[start]
        curve = curves[b]
        if par >= 0:
            p_par = p[par]
            d0 = depth[par] + 1
            rem = free.get(par)
            if rem is None and par + 1 < n and curve_of[par + 1] == curve_of[par]:
                rem = p_par - p[par + 1]  # its first child continues its run
        else:
            p_par, d0 = 1.0, 1
            rem = free.get(par)
        if d0 > len(curve):
            p0 = 0.0
        elif rem is None:  # the parent's first child: its branch goes on
            before = curve[d0 - 2] if d0 >= 2 else 1.0
            h = curve[d0 - 1] / before if before > 0 else 0.0
            p0 = p_par * (h if h < 1.0 else 1.0)
        else:
            p0 = rem * rate(support[start]) if rem > 0.0 else 0.0
        free[par] = (p_par if rem is None else rem) - p0
        p[start] = p0
        depth[start] = d0
        if end - start > 1:
            depth[start + 1 : end] = range(d0 + 1, d0 + end - start)
            # The run's other nodes: along the curve, relative to its first node.
            last = min(end, start + len(curve) - d0 + 1)
            base = curve[d0 - 1] if d0 <= len(curve) else 0.0
            if base > 0.0 and p0 > 0.0 and last > start + 1:
                # p0 · S(d) / S(d0): the ratio first (at most 1: no overflow for a tiny S(d0)).
                p[start + 1 : last] = [p0 * (c / base) for c in curve[d0 : d0 + last - start - 1]]
        start = end
    return p


def size_tree(
    probabilities: Sequence[float],
    step_costs: Sequence[float] | None,
    budget: int,
    *,
    prices: Sequence[float] | None = None,
) -> list[int]:
    """The nodes to draft, in node order: the first n of the nodes sorted by p (ties: the
    earlier node), n the best count in [0, budget] by the chain's rule at these step costs
    (`best_length`; step_costs[k-1] the cost of verifying k tokens) or, given `prices`
    (`batch_prices` at a batch step), `best_length_at_prices`."""
    # A stable sort by -p: ties keep node order (the earlier node first).
    neg = [-x for x in probabilities]
    order = sorted(range(len(neg)), key=neg.__getitem__)
    ranked = [-neg[i] for i in order]
    if prices is not None:
        n = best_length_at_prices(ranked, prices, budget)
    else:
        assert step_costs is not None
        n = best_length(ranked, step_costs, budget)
    return sorted(order[:n])


def size_trees_at_prices(
    tries: Iterable[tuple[Sequence[int], Sequence[int], Sequence[int]]],
    curves: Iterable[Sequence[Sequence[float]]],
    rates: Sequence[Sequence[float]],
    budgets: Sequence[int],
    prices: Sequence[float],
) -> list[list[int]]:
    """`size_tree(node_probabilities(...), None, budget, prices=prices)` of many tries at
    one batch state, in one pass: tries[t] is (parents, support, curve_of) of a
    `merge_branches` trie, curves[t] its branches' curves, rates[t][s] its q_a(s) for s in
    0 .. MAX_SUPPORT_BUCKET (a support above the last shares its rate) and budgets[t] its
    node budget; `prices` (`batch_prices`) reach min(budget, nodes) of every trie, or all
    the step costs. The same floats in the same order as the two per-tree functions (the
    batched tree step's twin of them: `step_batch(..., trees=True)`), with fewer Python
    steps per node.

    >>> size_trees_at_prices([([-1, 0, 1, 0], [3, 2, 2, 1], [0, 0, 0, 1])],
    ...                      [[[0.9, 0.5, 0.4], [0.6, 0.3]]], [[0.5] * 5], [4],
    ...                      [0.0, 0.1, 0.2, 0.3, 0.4])
    [[0, 1, 2, 3]]
    """
    top = MAX_SUPPORT_BUCKET
    num_prices = len(prices) - 1
    out: list[list[int]] = []
    for (parents, support, curve_of), branch_curves, rate, budget in zip(
        tries, curves, rates, budgets
    ):
        # node_probabilities, inlined (see there for the rule and its invariants). A
        # node's depth is its run's first depth plus its place in the run (a branch's new
        # nodes are one run: `merge_branches`), so depths are kept per branch, not node.
        n = len(parents)
        p = [0.0] * n
        num_branches = len(branch_curves)
        run_start = [0] * num_branches  # [branch] its run's first node
        run_depth = [0] * num_branches  # [branch] that node's depth
        free: dict[int, float] = {}
        start = 0
        while start < n:
            b = curve_of[start]
            end = bisect_right(curve_of, b, start)
            par = parents[start]
            curve = branch_curves[b]
            size = len(curve)
            if par >= 0:
                p_par = p[par]
                pb = curve_of[par]
                d0 = run_depth[pb] + par - run_start[pb] + 1
                rem = free.get(par)
                if rem is None and par + 1 < n and curve_of[par + 1] == pb:
                    rem = p_par - p[par + 1]
            else:
                p_par, d0 = 1.0, 1
                rem = free.get(par)
            run_start[b] = start
            run_depth[b] = d0
            if d0 > size:
                p0 = 0.0
            elif rem is None:
                before = curve[d0 - 2] if d0 >= 2 else 1.0
                h = curve[d0 - 1] / before if before > 0 else 0.0
                p0 = p_par * (h if h < 1.0 else 1.0)
            else:
                s = support[start]
                p0 = rem * rate[s if s < top else top] if rem > 0.0 else 0.0
            free[par] = (p_par if rem is None else rem) - p0
            p[start] = p0
            if end - start > 1 and p0 > 0.0:
                last = start + size - d0 + 1
                if last > end:
                    last = end
                if last > start + 1:
                    base = curve[d0 - 1]
                    if base > 0.0:
                        # p0 · (S(d) / S(d0)), as node_probabilities (a comprehension:
                        # about 0.35 µs for a run of 8 here, where two maps and two
                        # repeats took 0.6; it is most of the scoring's time per node).
                        p[start + 1 : last] = [
                            p0 * (c / base) for c in curve[d0 : d0 + last - start - 1]
                        ]
            start = end
        # size_tree at prices: a stable sort by p, largest first (ties: the earlier node),
        # then best_length_at_prices over the first `limit`.
        order = sorted(range(n), key=p.__getitem__, reverse=True)
        limit = min(budget, n, num_prices)
        best, best_value, expected = 0, 0.0, 0.0
        for k in range(limit):
            expected += p[order[k]]
            value = expected - prices[k + 1]
            if value > best_value:
                best, best_value = k + 1, value
        out.append(sorted(order[:best]))
    return out


def size_flat_tries_at_prices(
    tries: tuple[Sequence[int], Sequence[int], Sequence[int], Sequence[int], Sequence[int]],
    trees: Sequence[int],
    *,
    branch_curves: Sequence[int],
    branch_starts: Sequence[int],
    curves: Sequence[Sequence[float]],
    rate_tables: Sequence[Sequence[float]],
    rate_of: Sequence[int],
    budgets: Sequence[int],
    prices: Sequence[float],
) -> KeptTrees:
    """`size_trees_at_prices` in one native call (cpp/policy/tree_size.h) over a batch
    step's flat tries, the kept trees built there too. `tries` is (tokens, parents,
    support, branch_of, node_starts) of `FlatTries`. Sized tree j is tries' tree
    trees[j], its branch b's curve curves[branch_curves[branch_starts[j] + b]], its q_a
    rate_tables[rate_of[j]] (one rate per support 0 .. MAX_SUPPORT_BUCKET), its budget
    budgets[j]. Returns `KeptTrees`: tree j keeps the nodes `size_trees_at_prices` keeps
    (the same floats, in its order: tests/policy), renumbered in node order. Curves and
    rate tables go once each, however many trees share them. Inconsistent input (an
    index out of range, a parent not before its node, a curve that rises or leaves [0,
    1]) is a ValueError.

    >>> size_flat_tries_at_prices(([7, 8, 9, 4], [-1, 0, 1, 0], [3, 2, 2, 1], [0, 0, 0, 1],
    ...     [0, 4]), [0], branch_curves=[0, 1], branch_starts=[0, 2],
    ...     curves=[[0.9, 0.5, 0.4], [0.6, 0.3]], rate_tables=[[0.5] * 5], rate_of=[0],
    ...     budgets=[2], prices=[0.0, 0.1, 0.2, 0.3, 0.4])   # 7 and 8: p 0.9 and 0.5
    ([7, 8], [-1, 0], [3, 2], [0, 2], [2])
    """
    tokens, parents, support, branch_of, node_starts = tries
    return _native.size_trees_at_prices(
        tokens,
        parents,
        support,
        branch_of,
        node_starts,
        trees,
        branch_starts,
        branch_curves,
        curves,
        rate_tables,
        rate_of,
        budgets,
        prices,
    )


def begin_tree_candidates(
    sets: Sequence[_native.CursorSet],
    *,
    primary_slots: Sequence[int],
    primary_rules: Sequence[_native.ContinuationRule],
    rules: Sequence[_native.ContinuationRule],
    min_match: int,
    depths: Sequence[int],
    max_occurrences: int,
) -> _native.TreeCandidates:
    """A batch step's trees from their chains, first half (the second is
    `grow_begun_trees`): what `agspec.drafter.batch._grow_trees` does with
    `tree_candidates`, `continuation_tries_flat` and `size_flat_tries_at_prices`, node for
    node (tests/drafter check the two paths against each other), in two native calls for
    a caller with other work meanwhile (a batch step's chains, planned while the helper
    threads copy the candidates): every request's candidates listed and handed to the
    helpers. Request t reads the native cursor set sets[t]; its candidates are every
    (corpus slot, rule of `rules`) whose match is at least `min_match`, except
    (primary_slots[t], primary_rules[t]), its chain's, copied depths[t] tokens deep.
    Until `grow_begun_trees` or the job's `drop()` the sets' indexes stay entered for
    reading and nothing may move the sets; their continuations may be copied.
    Inconsistent input is a ValueError."""
    return _native.tree_candidates_begin(
        list(sets), primary_slots, primary_rules, rules, min_match, depths, max_occurrences
    )


def grow_begun_trees(
    job: _native.TreeCandidates,
    trees: Sequence[int],
    *,
    firsts: Sequence[list[int]],
    chain_curves: Sequence[int],
    agent_of: Sequence[int],
    match_curves: Sequence[Sequence[int]],
    bucket_of_match: Sequence[int],
    curves: Sequence[Sequence[float]],
    rate_tables: Sequence[Sequence[float]],
    budgets: Sequence[int],
    prices: Sequence[float],
) -> tuple[list[int], KeptTrees]:
    """The second half: the trees of the begun requests trees[j] (distinct; the other
    requests' candidates are dropped, uncopied where no helper began them), each its
    candidates merged with firsts[j], scored and sized. Tree j's chain follows
    curves[chain_curves[j]], a later branch the curve of its corpus's match m,
    curves[match_curves[agent_of[j]][bucket_of_match[min(m, last)]]], and its q_a is
    rate_tables[agent_of[j]]; it keeps at most budgets[j] nodes at `prices`. Returns the
    trees sized (j: those with a candidate that adds a branch; the others keep their
    chain) and their kept trees (`KeptTrees`, sized tree k's at k). A job grows once;
    inconsistent input is a ValueError (the job is then finished)."""
    sized, *kept = _native.grow_begun_trees(
        job,
        trees,
        firsts,
        chain_curves,
        agent_of,
        match_curves,
        bucket_of_match,
        curves,
        rate_tables,
        budgets,
        prices,
    )
    return sized, tuple(kept)  # type: ignore[return-value]
