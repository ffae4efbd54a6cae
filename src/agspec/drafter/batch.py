"""One verification step for many requests at once (`step_batch`)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, Literal, overload

import numpy as np

from agspec.corpora.corpus_set import (
    CorpusSet,
    advance_batch_begin,
    continuation_batch,
    match_lengths_batch,
    match_lengths_flat,
    match_picks_flat,
    native_handles,
    prepare_batch,
    rule_codes,
)
from agspec.drafter.call import (
    AgSpecCall,
    candidate_tries,
    candidate_tries_flat,
    tree_candidates,
    tree_depth,
    tree_rules,
)
from agspec.drafter.tree import DraftTree
from agspec.policy.survival import BUCKET_OF_MATCH, MATCH_OF_BUCKET
from agspec.policy.tree_size import (
    KeptTrees,
    begin_tree_candidates,
    flatten_tries,
    grow_begun_trees,
    size_flat_tries_at_prices,
)

# The native codes of `tree_rules(occurrences, native=True)`, by occurrences.
_TREE_RULE_CODES: dict[int, list[_native.ContinuationRule]] = {}

if TYPE_CHECKING:
    from agspec import _native
    from agspec.drafter.server import AgSpecServer


@overload
def step_batch(
    calls: Sequence[AgSpecCall],
    committed: Sequence[Sequence[int] | np.ndarray | None],
    max_tokens: Sequence[int] | int,
    *,
    batch_size: int | None = None,
    trees: Literal[False] = False,
) -> list[list[int]]: ...


@overload
def step_batch(
    calls: Sequence[AgSpecCall],
    committed: Sequence[Sequence[int] | np.ndarray | None],
    max_tokens: Sequence[int] | int,
    *,
    batch_size: int | None = None,
    trees: Literal[True],
) -> list[DraftTree]: ...


def step_batch(
    calls: Sequence[AgSpecCall],
    committed: Sequence[Sequence[int] | np.ndarray | None],
    max_tokens: Sequence[int] | int,
    *,
    batch_size: int | None = None,
    trees: bool = False,
) -> list[list[int]] | list[DraftTree]:
    """One verification step for many requests at once: accept, then propose.

    `committed[i]` is what the engine committed for `calls[i]` since its last step (its
    accepted draft prefix plus one token; None or empty right after `begin`), and
    `max_tokens[i]` bounds its next draft. `batch_size` (an engine whose batch changes
    every step: vLLM) prices the cost rule at that many requests from this step on
    (`AgSpecServer.set_batch_size`); None keeps the server's. Returns the drafts, in
    order. Equivalent to `accept` on every call, then `propose` on every call (so
    requests of one session see each other's tokens of this step), with every corpus of
    every request moved in one native call, every match read in another and every
    continuation copied in a third (one per call with a non-native engine).
    The calls may belong to different sessions of one server, or of several.

    With `trees=True` the step proposes token trees (an engine that verifies trees):
    `drafts[i]` is the `DraftTree` that `propose_tree(max_tokens[i])` returns after the
    accept half, node for node; the chains are planned as above, then (every corpus
    native, the cost rule pricing the batch) the candidates of the trees that may pay are
    copied on the helper threads while the chains are copied, and merged, scored and
    sized in one more native call (docs/trees.md). `committed[i]` then follows a root
    path of the last tree, plus one token.

    >>> # drafts = step_batch([c1, c2], [[5], [7, 8]], 16)
    >>> # trees = step_batch([c1, c2], [[5], [7, 4, 2]], 16, trees=True)
    """
    n = len(calls)
    if batch_size is not None:
        # The cost rule prices this step's drafts at the engine's live batch size.
        for server in {id(call.session.server): call.session.server for call in calls}.values():
            server.set_batch_size(batch_size)
    if len(committed) != n:
        raise ValueError(f"committed has {len(committed)} entries for {n} calls")
    if type(max_tokens) is int:
        if not 0 <= max_tokens <= 1 << 16:
            raise ValueError(f"max_tokens must be ints in [0, 65536], got {max_tokens!r}")
        caps = [max_tokens] * n
    else:
        raw = [max_tokens] * n if isinstance(max_tokens, (int, np.integer)) else list(max_tokens)
        if len(raw) != n:
            raise ValueError(f"max_tokens has {len(raw)} entries for {n} calls")
        for k in raw:
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= 1 << 16:
                raise ValueError(f"max_tokens must be ints in [0, 65536], got {k!r}")
        caps = [int(k) for k in raw]
    if n == 1:
        # One request: the per-call path is the same step with fewer crossings.
        call, c = calls[0], committed[0]
        if c is not None and len(c):
            call.accept(c)
        elif not call.live:
            raise call.not_live_error("step_batch()")
        if trees:
            return [call.propose_tree(caps[0])]
        return [call.propose(caps[0])]
    prepare_batch(n)
    # One server (the usual case): its policy learns from the whole step in one call and
    # plans every draft in another. Calls of several servers go one call at a time.
    shared: AgSpecServer | None = calls[0].session.server
    for call in calls:
        if call.session.server is not shared:
            shared = None
            break
    applied: list[AgSpecCall] = []
    moved: list[list[int]] = []
    # What the shared server's policy learns from (`AgSpecCall.accept`'s
    # feedback, for the whole step at once): each applied call's last draft length, and of
    # those that drafted the agent, decision and accept length. Nothing reads the policy
    # before it is fed. Calls of several servers feed theirs one at a time.
    drafted: list[int] = []
    sizes: list[int] = []  # len(moved[i])
    agents: list[str] = []
    decisions: list[tuple[int, bool, int]] = []
    accepted: list[int] = []
    # `_count`'s work (the live token count) overlaps the advance when it cannot go over
    # the budget; otherwise it runs after, as it may stop a session's indexing (touching
    # corpora) or evict sessions (ending calls), and the calls are checked again.
    counted = False
    try:
        for call, c in zip(calls, committed):
            if c is not None and shared is None and len(c):
                moved.append(call.accept_fed(c))
                applied.append(call)
            elif c is not None and (size := len(c)):
                toks, num_drafted, decision, accept = call.take_committed(c)
                moved.append(toks)
                applied.append(call)
                drafted.append(num_drafted)
                sizes.append(size)
                if decision is not None:
                    agents.append(call.agent)
                    decisions.append(decision)
                    accepted.append(accept)
            else:
                call.skip_step()
    finally:
        # Every call whose tokens were checked gets them into its policy, then its corpora,
        # even when a later call's tokens were refused: no call is left half accepted.
        if applied:
            # The helper threads move the cursors while the policy learns (it touches no
            # corpus); then the rest of the cursors and the appends.
            finish = advance_batch_begin([call.corpora for call in applied], moved)  # type: ignore[misc]
            try:
                if shared is not None:
                    policy = shared.lengths
                    policy.observe_batch(agents, decisions, accepted)
                    if shared.batch_cost_mode:
                        policy.note_steps(drafted, sizes)
                    if shared.cost_mode:
                        # The last step's cost tables at this step's state, while the
                        # helpers still move cursors (the plan below reads them).
                        policy.refresh_cost_tables()
                    if shared.within_budget(sum(sizes)):
                        shared.count_committed(applied, sizes)
                        counted = True
            finally:
                finish()
        if shared is not None:
            if not counted:
                shared.count_committed(applied, sizes)
        else:
            for call, toks in zip(applied, moved):
                call.count_committed(len(toks))
    # Propose: read every match in one call, plan each draft, copy the continuations in one
    # more (per call with a non-native engine).
    if not counted:
        # Sessions may have been evicted while counting (their calls ended).
        for call in calls:
            if not call.live:
                raise call.not_live_error("step_batch()")
    sets: list[CorpusSet] = [call.corpora for call in calls]  # type: ignore[misc]
    if shared is None:
        if trees:
            # Every call accepted first, as above; then each call's tree in turn.
            return [call.propose_tree(k) for call, k in zip(calls, caps)]
        for call in calls:
            call.last_source, call.last_match_length = None, 0
        return _propose_each(calls, sets, match_lengths_batch(sets), caps)
    if not trees:
        return _propose(shared, calls, sets, caps)
    begun: list[_Begun] = []  # the trees' candidates, copied while the chains are copied
    try:
        chains = _propose(shared, calls, sets, caps, begun)
        return _grow_trees(shared, calls, sets, caps, chains, begun[0] if begun else None)
    finally:
        for job, _ in begun:
            job.drop()  # grown or not: the helpers stop, the indexes are left


def _grow_trees(
    server: AgSpecServer,
    calls: Sequence[AgSpecCall],
    sets: list[CorpusSet],
    caps: list[int],
    chains: list[list[int]],
    begun: _Begun | None = None,
) -> list[DraftTree]:
    """`propose_tree`'s rest for the calls of one server, after `_propose` drafted (and
    recorded) their chains: which trees may beat their chains (`tree_curve`), then, when
    `_propose` began their candidates (`begun`: every corpus native, the cost rule
    pricing the batch, one max_occurrences), the rest in one native call
    (`_grow_native`). Otherwise, the reference path: every match of those trees in
    one native call, every candidate branch of every request in one more (seven flat
    lists, `FlatTries`), then each tree scored and sized (at the step's prices, all at
    once) and kept in its call.

    Per-tree data lives in flat lists indexed by tree (t), not in tuples per tree: a
    batch step of trees otherwise makes hundreds of small objects that live through the
    step and set off the garbage collector every few steps."""
    n = len(calls)
    grown: list[int] = []  # [num_trees] the request of each tree that may beat its chain
    chain_curves: list[list[float]] = []  # [num_trees]
    budgets: list[int] = []  # [num_trees] node budget
    top = server.tree_max_nodes
    # `tree_curve` depends on the agent, the match's bucket, the chain's length and the
    # budget alone while the step proposes (nothing observes): asked once per distinct
    # four.
    bounds: dict[tuple[str, int, int, int], list[float] | None] = {}
    last_bucket = len(MATCH_OF_BUCKET) - 1
    for i, (call, chain, k) in enumerate(zip(calls, chains, caps)):
        if chain:
            budget = k if k < top else top
            bucket = call.last_match_length.bit_length()  # match_bucket, inline
            asked = (
                call.agent,
                bucket if bucket < last_bucket else last_bucket,
                len(chain),
                budget,
            )
            if asked in bounds:
                curve = bounds[asked]
            else:
                curve = bounds[asked] = call.tree_curve(chain, budget)
            if curve is not None:
                grown.append(i)
                chain_curves.append(curve)
                budgets.append(budget)
    server.trees_grew = bool(grown)
    if not grown:
        return [DraftTree.chain(chain) for chain in chains]
    tree_sets = [sets[i] for i in grown]  # one per tree: its request's
    if begun is not None:
        job, job_of = begun
        members = [job_of[i] for i in grown]
        if -1 not in members:  # every tree's candidates begun: the rest in one native call
            return _grow_native(server, calls, chains, grown, chain_curves, budgets, job, members)
        job.drop()  # never so (the trees grown are among those begun)
    if server.batch_cost_mode:
        # Not begun (the last step grew no tree): begun now, grown at once.
        slots = [calls[i]._tree_primary(calls[i].last_source)[0] for i in grown]  # type: ignore[arg-type]
        late = _begin_candidates(
            server, [calls[i] for i in grown], tree_sets, slots, [caps[i] for i in grown]
        )
        if late is not None:
            every = list(range(len(grown)))
            try:
                return _grow_native(
                    server, calls, chains, grown, chain_curves, budgets, late, every
                )
            finally:
                late.drop()  # grown or not: the indexes are left
    occurrences = {calls[i].max_occurrences for i in grown}
    lengths = match_lengths_flat(tree_sets)  # every tree's corpora's matches, tree after tree
    # Every tree's candidate branches, flat, tree t's from slot_at[t], each depths[t]
    # tokens deep.
    cands = tree_candidates([calls[i] for i in grown], lengths, budgets)
    flat_slots, flat_rules, ranks, flat_depths, slot_at, depths = cands
    counts = [b - a for a, b in zip(slot_at, slot_at[1:])]
    firsts = [chains[i] for i in grown]
    if len(occurrences) == 1:
        flat = candidate_tries_flat(
            tree_sets,
            flat_slots,
            flat_depths,
            flat_rules,
            ranks,
            counts,
            firsts,
            max_occurrences=occurrences.pop(),
        )
    else:
        tries = []
        for t, i in enumerate(grown):
            a, b = slot_at[t], slot_at[t + 1]
            tries += candidate_tries(
                [sets[i]],
                flat_slots[a:b],
                flat_depths[a:b],
                flat_rules[a:b],
                ranks[a:b],
                [b - a],
                [firsts[t]],
                max_occurrences=calls[i].max_occurrences,
            )
        flat = flatten_tries(tries)
    tokens, parents, support, branch_of, origin, node_at, origin_at = flat
    out: list[DraftTree | None] = [None] * n
    if not server.batch_cost_mode:
        # where tree t's corpora's match lengths start
        length_at = list(accumulate((len(cs.names) for cs in tree_sets), initial=0))
        for t, i in enumerate(grown):
            if counts[t]:
                a, b = node_at[t], node_at[t + 1]
                trie = (
                    tokens[a:b],
                    parents[a:b],
                    support[a:b],
                    branch_of[a:b],
                    origin[origin_at[t] : origin_at[t + 1]],
                )
                num = len(tree_sets[t].names)
                out[i] = calls[i].take_tree(
                    chains[i],
                    chain_curves[t],
                    budgets[t],
                    lengths[length_at[t] : length_at[t] + num],
                    flat_slots[slot_at[t] : slot_at[t + 1]],
                    trie,
                    depths[t],
                )
        return [DraftTree.chain(c) if tree is None else tree for tree, c in zip(out, chains)]
    # `AgSpecCall.take_tree` of every tree at once: each branch's curve (read once per
    # agent, match and depth: scoring only reads), then every tree scored and sized at the
    # step's prices in one native call (`size_flat_tries_at_prices`), then each kept in
    # its call. Curves and rate tables go once each, trees point at them by index.
    survival = server.lengths.survival
    rates = server.branch_rates
    # (agent, depth) -> match -> the index in `curves` of the curve of a branch from a
    # corpus with that match
    by_match: dict[tuple[str, int], dict[int, int]] = {}
    by_agent: dict[str, int] = {}  # agent -> the index in `tables` of its q_a
    curves: list[list[float]] = []
    tables: list[list[float]] = []
    chain_ids: dict[int, int] = {}  # id(a chain's curve) -> its index in `curves`
    sized: list[int] = []  # the trees sized (t)
    branch_curves: list[int] = []  # every sized tree's branches' curves, in turn
    branch_at: list[int] = [0]  # where sized tree j's curves start in branch_curves
    rate_of: list[int] = []
    sized_budgets: list[int] = []
    most = 0  # the most nodes any tree may keep: how far the prices must go
    for t, i in enumerate(grown):
        o, o_end = origin_at[t] + 1, origin_at[t + 1]
        if not counts[t] or o == o_end:  # no candidate, or none adds a node
            continue
        agent = calls[i].agent
        depth = depths[t]
        s_at = slot_at[t]
        chain_curve = chain_curves[t]  # shared by the trees of one `bounds` entry
        c_id = chain_ids.get(id(chain_curve))
        if c_id is None:
            c_id = chain_ids[id(chain_curve)] = len(curves)
            curves.append(chain_curve)
        branch_curves.append(c_id)
        of_match = by_match.get((agent, depth))
        if of_match is None:
            of_match = by_match[agent, depth] = {}
        for k in range(o, o_end):
            # A branch's curve is its corpus's (a candidate's rank is minus its corpus's
            # match), read once per agent, depth and match.
            r = ranks[s_at + origin[k]]
            c_id = of_match.get(r)
            if c_id is None:
                c_id = of_match[r] = len(curves)
                curves.append(survival.curve(agent, -r, depth)[:depth])
            branch_curves.append(c_id)
        branch_at.append(len(branch_curves))
        sized.append(t)
        r_id = by_agent.get(agent)
        if r_id is None:
            r_id = by_agent[agent] = len(tables)
            tables.append(rates.table_for(agent))
        rate_of.append(r_id)
        budget = budgets[t]
        sized_budgets.append(budget)
        num = node_at[t + 1] - node_at[t]
        if (budget if budget < num else num) > most:
            most = budget if budget < num else num
    if sized:
        # A node costs what a draft token costs in the batch (the chain rule's prices, at
        # the tree's step costs; one list for the step: prices do not depend on how far
        # they go).
        prices = server.lengths.cost.batch_prices(most, server.tree_step_costs)
        kept = size_flat_tries_at_prices(
            (tokens, parents, support, branch_of, node_at),
            sized,
            branch_curves=branch_curves,
            branch_starts=branch_at,
            curves=curves,
            rate_tables=tables,
            rate_of=rate_of,
            budgets=sized_budgets,
            prices=prices,
        )
        _adopt_kept(calls, chains, grown, sized, kept, out)
    return [DraftTree.chain(c) if tree is None else tree for tree, c in zip(out, chains)]


def _adopt_kept(
    calls: Sequence[AgSpecCall],
    chains: list[list[int]],
    grown: list[int],
    sized: list[int],
    kept: KeptTrees,
    out: list[DraftTree | None],
) -> None:
    """Each sized tree (sized[j], of request grown[sized[j]]) kept in its call, into out."""
    kept_tokens, kept_parents, kept_support, kept_at, num_chain = kept
    for j, t in enumerate(sized):
        i = grown[t]
        a, b = kept_at[j], kept_at[j + 1]
        out[i] = calls[i].adopt_tree(
            chains[i], num_chain[j], kept_tokens[a:b], kept_parents[a:b], kept_support[a:b]
        )


def _grow_native(
    server: AgSpecServer,
    calls: Sequence[AgSpecCall],
    chains: list[list[int]],
    grown: list[int],
    chain_curves: list[list[float]],
    budgets: list[int],
    job: _native.TreeCandidates,
    members: list[int],
) -> list[DraftTree]:
    """`_grow_trees`' rest when `_propose` began every tree's candidates (`_begin_trees`;
    tree t is request members[t] of the job): the candidates merged, scored and sized in
    one native call (`grow_begun_trees`), node for node what `_grow_trees`' Python path
    builds. Python supplies per tree its chain's curve and per agent its rates and one
    curve per match bucket (scoring only reads them: each is read once a step)."""
    survival = server.lengths.survival
    rates = server.branch_rates
    branch_tokens = server.config.tree_branch_tokens
    chain_ids: list[int] = []  # [num_trees] the index in `curves` of its chain's curve
    agent_of: list[int] = []  # [num_trees] the index of its agent in `tables` / `rows`
    curves: list[list[float]] = []
    seen: dict[int, int] = {}  # id(a chain's curve) -> its index in `curves`
    agents: dict[str, int] = {}
    agent_names: list[str] = []
    for t, i in enumerate(grown):
        curve = chain_curves[t]  # shared by the trees of one `bounds` entry
        c_id = seen.get(id(curve))
        if c_id is None:
            c_id = seen[id(curve)] = len(curves)
            curves.append(curve)
        chain_ids.append(c_id)
        agent = calls[i].agent
        a_id = agents.get(agent)
        if a_id is None:
            a_id = agents[agent] = len(agent_names)
            agent_names.append(agent)
        agent_of.append(a_id)
    # Per agent: its q_a, and the curve of each match bucket, as deep as any branch goes
    # (the depth grows with the budget).
    deepest = tree_depth(max(budgets), branch_tokens)
    tables = [rates.table_for(agent) for agent in agent_names]
    rows: list[list[int]] = []
    for agent in agent_names:
        rows.append(list(range(len(curves), len(curves) + len(MATCH_OF_BUCKET))))
        curves += [survival.curve(agent, m, deepest)[:deepest] for m in MATCH_OF_BUCKET]
    # A node costs what a draft token costs in the batch (the chain rule's prices, at the
    # tree's step costs; a longer list of prices starts as a shorter one).
    prices = server.lengths.cost.batch_prices(max(budgets), server.tree_step_costs)
    sized, kept = grow_begun_trees(
        job,
        members,
        firsts=[chains[i] for i in grown],
        chain_curves=chain_ids,
        agent_of=agent_of,
        match_curves=rows,
        bucket_of_match=BUCKET_OF_MATCH,
        curves=curves,
        rate_tables=tables,
        budgets=budgets,
        prices=prices,
    )
    out: list[DraftTree | None] = [None] * len(calls)
    _adopt_kept(calls, chains, grown, sized, kept, out)
    return [DraftTree.chain(c) if tree is None else tree for tree, c in zip(out, chains)]


# A batch step's tree candidates begun (`begin_tree_candidates`) and, per request of the
# step, its index in the job (-1: not begun).
_Begun = tuple["_native.TreeCandidates", list[int]]


def _begin_trees(
    server: AgSpecServer,
    picked: list[int],
    calls: list[AgSpecCall],
    sets: list[CorpusSet],
    slots: list[int],
    caps: list[int],
    wants: list[int],
    begun: list[_Begun],
) -> None:
    """The candidates of every tree the step may grow, handed to the helper threads to
    copy while `_propose` copies the chains: the picked requests (picked[j], its call,
    set, slot, cap and planned length at j) whose budget may hold a tree and whose chain
    is planned. Their chains are not copied yet, so this is a superset of the trees grown
    (`tree_curve`); those left out are dropped. Only when the last tree step grew a tree
    (`AgSpecServer.trees_grew`), the cost rule prices the batch, every corpus is native
    and the calls share one max_occurrences (`_begin_candidates`)."""
    if not server.trees_grew or not server.batch_cost_mode or server.tree_max_nodes < 2:
        return
    # A budget of one node is the chain, and no chain no tree (`tree_curve`).
    members = [j for j, (k, want) in enumerate(zip(caps, wants)) if k >= 2 and want]  # j
    if not members:
        return
    job = _begin_candidates(
        server,
        [calls[j] for j in members],
        [sets[j] for j in members],
        [slots[j] for j in members],
        [caps[j] for j in members],
    )
    if job is not None:
        job_of = [-1] * (picked[-1] + 1)
        for t, j in enumerate(members):
            job_of[picked[j]] = t
        begun.append((job, job_of))


def _begin_candidates(
    server: AgSpecServer,
    calls: list[AgSpecCall],
    sets: list[CorpusSet],
    slots: list[int],
    caps: list[int],
) -> _native.TreeCandidates | None:
    """`begin_tree_candidates` of these requests (each its call, set, chain's slot and
    cap), with the policy's data: the rules, each chain's (slot, rule) and each tree's
    depth. None unless every corpus is native and the calls share one max_occurrences."""
    occurrences = calls[0].max_occurrences
    for call in calls:
        if call.max_occurrences != occurrences:
            return None
    handles = native_handles(sets)
    if handles is None:
        return None
    # A chain's (slot, rule) is its request's pick and that corpus's rule
    # (`AgSpecCall._tree_primary`).
    top = server.tree_max_nodes
    branch_tokens = server.config.tree_branch_tokens
    depth_of: dict[int, int] = {}  # cap -> depth
    depths: list[int] = []
    for k in caps:
        depth = depth_of.get(k)
        if depth is None:
            depth = depth_of[k] = tree_depth(k if k < top else top, branch_tokens)
        depths.append(depth)
    recent = server.config.tree_occurrences
    codes = _TREE_RULE_CODES.get(recent)
    if codes is None:
        codes = _TREE_RULE_CODES[recent] = rule_codes(tree_rules(recent, native=True))
    return begin_tree_candidates(
        handles,
        primary_slots=slots,
        primary_rules=[cs.rule_code(slot) for cs, slot in zip(sets, slots)],
        rules=codes,
        min_match=server.min_match_tokens,
        depths=depths,
        max_occurrences=occurrences,
    )


def _propose(
    server: AgSpecServer,
    calls: Sequence[AgSpecCall],
    sets: list[CorpusSet],
    caps: list[int],
    begun: list[_Begun] | None = None,
) -> list[list[int]]:
    """`AgSpecCall.plan` and `take_draft` for the calls of one server, the policy asked once
    (every match read in one call first; each call's last draft was reset by the accept
    half of the step). With `begun` (a step of trees), the candidates of every tree the
    step may grow are handed to the helper threads once the chains are planned, and the
    job goes into `begun` (`_begin_trees`)."""
    n = len(calls)
    # Each request's source pick and its match, long enough to draft from (slot -1: none).
    picks = match_picks_flat(sets, server.min_match_tokens)
    drafts: list[list[int]] = [[] for _ in range(n)]
    # Every call's last draft was cleared as its tokens were checked (or it had none).
    for call in calls:
        call.last_source = None
        call.last_match_length = 0
    all_slots, all_matches = picks[0::2], picks[1::2]
    picked = [i for i, (slot, k) in enumerate(zip(all_slots, caps)) if slot >= 0 and k > 0]
    if not picked:
        return drafts
    if len(picked) == n:  # every request drafts (the usual case at large batches)
        picked_calls, picked_sets = list(calls), sets
        slots, matches, available = all_slots, all_matches, caps
    else:
        picked_calls = [calls[i] for i in picked]
        picked_sets = [sets[i] for i in picked]
        slots = [all_slots[i] for i in picked]
        matches = [all_matches[i] for i in picked]
        available = [caps[i] for i in picked]
    native = all(cs.is_native for cs in picked_sets)
    policy = server.lengths
    cost_mode, capped_mode = server.cost_mode, server.capped_mode
    tables: list[list[int]] = []
    if cost_mode and native:
        # The cost rule's answers for every retrieved length of each request's (agent,
        # match bucket): the draft length now, and again if fewer tokens are retrieved.
        bound = policy.cost_bound_tokens
        tables = policy.cost_tables([call.agent for call in picked_calls], matches, available)
        wants = [t[k if k < bound else bound] for t, k in zip(tables, available)]
    else:
        wants = policy.draft_lengths(
            [call.agent for call in picked_calls],
            matches,
            available,
            # The cost rule reads no cap.
            None if policy.variant == "cost" else [call.cap_tokens for call in picked_calls],
            # An engine with its own length rule (SuffixDecoding's) bounds the draft too.
            None if native else [cs.engine_max_tokens(s) for cs, s in zip(picked_sets, slots)],
        )
    if not any(wants):
        return drafts
    if begun is not None and native:
        _begin_trees(server, picked, picked_calls, picked_sets, slots, available, wants, begun)
    occurrences = picked_calls[0].max_occurrences
    if native and all(call.max_occurrences == occurrences for call in picked_calls):
        # A length of 0 copies nothing.
        conts = continuation_batch(picked_sets, slots, wants, max_occurrences=occurrences)
    else:
        conts = [
            cs.continuation(slot, want, max_occurrences=call.max_occurrences) if want else []
            for call, cs, slot, want in zip(picked_calls, picked_sets, slots, wants)
        ]
    # `AgSpecCall.take_draft` for each: the draft of this step and what the policy learns from.
    if tables:
        for j, draft in enumerate(conts):
            size = len(draft)
            if size < wants[j]:
                # Fewer tokens retrieved than planned: the best length over those.
                del draft[tables[j][size] :]
    elif cost_mode:
        for j, (call, m, draft) in enumerate(zip(picked_calls, matches, conts)):
            if len(draft) < wants[j]:
                del draft[policy.cost_length(call.agent, m, len(draft)) :]
    for i, call, slot, want, m, draft in zip(picked, picked_calls, slots, wants, matches, conts):
        size = len(draft)
        if size:
            # Censored only when the cap itself bounded the draft (not max_tokens, not text).
            call.set_draft(draft, slot, m, capped_mode and size == want == call.cap_tokens)
            drafts[i] = list(draft)
    return drafts


def _propose_each(
    calls: Sequence[AgSpecCall],
    sets: list[CorpusSet],
    lengths: list[list[int]],
    caps: list[int],
) -> list[list[int]]:
    """The propose half of `step_batch` one call at a time (calls of several servers)."""
    n = len(calls)
    plans = [call.plan(ls, k) if k > 0 else (-1, 0, 0) for call, ls, k in zip(calls, lengths, caps)]
    drafts: list[list[int]] = [[] for _ in range(n)]
    wanted = [i for i, plan in enumerate(plans) if plan[1] > 0]
    if not wanted:
        return drafts
    occurrences = calls[wanted[0]].max_occurrences
    if all(sets[i].is_native and calls[i].max_occurrences == occurrences for i in wanted):
        conts = continuation_batch(
            [sets[i] for i in wanted],
            [plans[i][0] for i in wanted],
            [plans[i][1] for i in wanted],
            max_occurrences=occurrences,
        )
    else:
        conts = [
            sets[i].continuation(plans[i][0], plans[i][1], max_occurrences=calls[i].max_occurrences)
            for i in wanted
        ]
    for i, draft in zip(wanted, conts):
        slot, want, m = plans[i]
        drafts[i] = calls[i].take_draft(draft, slot, want, m)
    return drafts
