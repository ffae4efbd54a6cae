"""`step_batch(..., trees=True)` against its oracle: every call's `accept`, then every
call's `propose_tree`, one call at a time. Two servers built alike replay the same
sessions in lockstep, one through the batched tree step and one call by call; at every
step their trees must be equal node for node (token ids and parents), and both commit
the greedy path of the recorded output through that tree."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest
from chartok import CharTokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from agspec.drafter import VARIANTS, AgSpecServer, step_batch
from agspec.drafter.call import tree_rules
from agspec.drafter.tree import DraftTree, tree_commit
from agspec.index.token_index import ContinuationRule

TRACES = (Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces").resolve()


class Flat:
    """A big GPU: verifying any number of tokens costs one decode step (trees pay)."""

    def step_cost(self, n_tokens: int, batch_size: int) -> float:
        return 1.0


@dataclass
class Call:
    """One recorded call: what `begin` gets, and the output the model wrote."""

    agent: str
    role: str
    turn: int
    prompt: list[int]
    output: list[int]
    artifacts: list[tuple[str, str]] = field(default_factory=list)
    emission_format: str = "none"


@dataclass
class Slot:
    """A batch slot replaying one session's calls in order, on both servers."""

    session_id: str
    calls: list[Call]
    drafters: tuple[Any, Any] = (None, None)  # (batched, reference) calls
    position: int = 0  # output tokens committed so far
    committed: list[int] | None = None  # for the next step's accept


def _begin(server: AgSpecServer, sid: str, c: Call) -> Any:
    sess = server.session(sid, emission_format=c.emission_format)
    for path, text in c.artifacts:
        sess.open_artifact(path, text)
    d = sess.call(c.agent, c.role, c.turn)
    d.begin(c.prompt)
    return d


def _lockstep(make_server, sessions, num_requests: int, max_nodes: int) -> tuple[int, int]:
    """Replays `sessions` (session id, [Call]) `num_requests` at a time on two servers;
    asserts the batched trees equal the call-by-call ones at every step. Returns (request
    steps, steps whose tree had more than one branch)."""
    batched, reference = make_server(), make_server()
    queue = list(reversed(sessions))
    slots: list[Slot] = []

    def start(slot: Slot) -> Slot:
        c = slot.calls[0]
        slot.drafters = (_begin(batched, slot.session_id, c), _begin(reference, slot.session_id, c))
        slot.position, slot.committed = 0, None
        return slot

    while queue and len(slots) < num_requests:
        sid, calls = queue.pop()
        slots.append(start(Slot(sid, calls)))
    steps = branched = 0
    step = 0
    while slots:
        trees = step_batch(
            [s.drafters[0] for s in slots], [s.committed for s in slots], max_nodes, trees=True
        )
        for s in slots:  # the oracle: every accept, then every propose_tree
            if s.committed:
                s.drafters[1].accept(s.committed)
        expected = [s.drafters[1].propose_tree(max_nodes) for s in slots]
        for s, got, want in zip(slots, trees, expected):
            assert isinstance(got, DraftTree)
            assert (got.token_ids, got.parents) == (want.token_ids, want.parents), (
                f"step {step}, session {s.session_id} at output token {s.position}: "
                f"batched {got} != call by call {want}"
            )
            assert s.drafters[0].draft == s.drafters[1].draft  # the first branch kept
        steps += len(slots)
        branched += sum(not t.is_chain for t in trees)
        step += 1
        live: list[Slot] = []
        for s, tree in zip(slots, trees):
            out = s.calls[0].output
            _, commit, _ = tree_commit(tree, out, s.position)
            s.position += len(commit)
            s.committed = list(commit)
            if s.position < len(out):
                live.append(s)
                continue
            for d in s.drafters:
                d.accept(s.committed)
                d.end()
            if len(s.calls) > 1:
                live.append(start(Slot(s.session_id, s.calls[1:])))
            else:
                batched.end_session(s.session_id)
                reference.end_session(s.session_id)
                if queue:
                    sid, calls = queue.pop()
                    live.append(start(Slot(sid, calls)))
        slots = live
    assert batched.lengths.mean_draft == reference.lengths.mean_draft
    assert batched.branch_rates._counts == reference.branch_rates._counts
    return steps, branched


def _hand_sessions(seed: int, num_sessions: int) -> list[tuple[str, list[Call]]]:
    """Agent-like sessions: outputs copy lines of a shared pool, with edits, and prompts
    resend the history, so every corpus matches with several occurrences."""
    rng = random.Random(seed)
    pool = [[rng.randrange(1, 300) for _ in range(rng.randrange(4, 10))] for _ in range(30)]
    sessions = []
    for s in range(num_sessions):
        history = [rng.randrange(1, 300) for _ in range(60)]
        calls = []
        for turn in range(3):
            out: list[int] = []
            for _ in range(rng.randrange(4, 8)):
                line = list(rng.choice(pool))
                if rng.random() < 0.4:
                    line[rng.randrange(len(line))] = rng.randrange(1, 300)
                out += line
            agent = ("coder", "reviewer")[s % 2]
            calls.append(Call(agent, "code", turn, list(history), out))
            history = history + out + [rng.randrange(1, 300) for _ in range(20)]
        sessions.append((f"hand/{seed}/{s}", calls))
    return sessions


# (requests per step, the batch size the cost rule prices at): one request (the per-call
# path), eight priced as one (the step costs' rule), eight and a full batch priced at
# their size (the batch prices).
SHAPES = [(1, 1), (8, 1), (8, 8), (64, 64)]


@pytest.mark.parametrize("num_requests, priced_at", SHAPES)
def test_batched_trees_equal_call_by_call_on_hand_built_sessions(num_requests, priced_at):
    config = replace(VARIANTS["agspec"], use_global=False, use_history=False)

    def make_server() -> AgSpecServer:
        return AgSpecServer(
            tokenizer=CharTokenizer(), config=config, cost_model=Flat(), batch_size=priced_at
        )

    sessions = _hand_sessions(7, max(4, num_requests + num_requests // 2))
    steps, branched = _lockstep(make_server, sessions, num_requests, 16)
    assert branched >= 5, f"only {branched} of {steps} steps drafted a tree"


@pytest.mark.parametrize("path", ["late", "reference"])
@pytest.mark.parametrize("num_requests, priced_at", [(8, 8), (64, 64)])
def test_batched_trees_other_paths_equal_call_by_call(num_requests, priced_at, path, monkeypatch):
    # The batch step's other paths at the batch prices: candidates begun only once the
    # trees are known ("late": what a step after one that grew no tree does), and the
    # Python path ("reference": a corpus of another engine, calls of several
    # max_occurrences), each forced here.
    from agspec.drafter import batch

    calls = []
    if path == "late":
        monkeypatch.setattr(batch, "_begin_trees", lambda *args: calls.append(1))
    else:
        monkeypatch.setattr(batch, "_begin_candidates", lambda *args: calls.append(1))
    config = replace(VARIANTS["agspec"], use_global=False, use_history=False)

    def make_server() -> AgSpecServer:
        return AgSpecServer(
            tokenizer=CharTokenizer(), config=config, cost_model=Flat(), batch_size=priced_at
        )

    sessions = _hand_sessions(8, num_requests + num_requests // 2)
    steps, branched = _lockstep(make_server, sessions, num_requests, 16)
    assert calls and branched >= 5, f"only {branched} of {steps} steps drafted a tree"


_dev: dict[str, Any] = {}


def _dev_traces() -> tuple[list[tuple[str, list[Call]]], Any]:
    """Real sessions of the dev traces (rendered; each call's output cut to 96 tokens),
    the first 72 of SWE-agent and ChatDev alternately, and a global corpus of 30 more."""
    if not _dev:
        from agspec.corpora import GlobalCorpus
        from agspec.tokenizers import get_tokenizer
        from agspec.traces import import_traces, render_call

        tok = get_tokenizer("qwen2.5")
        picked: list[Any] = []
        rest: list[Any] = []
        for fmt, folder in (("swe-agent", "swe-agent-java"), ("chatdev", "chatdev")):
            found, _ = import_traces(fmt, [TRACES / folder])
            picked.append(found[:36])
            rest += found[36:51]
        sessions = []
        for a, b in zip(*picked):
            for s in (a, b):
                calls = []
                for c in s.calls[:3]:
                    prompt, out = render_call(c, tok)
                    if out:
                        arts = [(x.path, x.text) for x in c.artifacts if x.text]
                        calls.append(
                            Call(c.agent, c.role, c.turn, prompt, out[:96], arts, c.emission_format)
                        )
                if calls:
                    sessions.append((s.session_id, calls))
        docs = []
        for s in rest:
            for c in s.calls:
                prompt, out = render_call(c, tok)
                docs.append(np.asarray(prompt + out, dtype=np.int32))
        _dev["sessions"], _dev["global"], _dev["tok"] = sessions, GlobalCorpus.build(docs), tok
    return _dev["sessions"], _dev


@pytest.mark.skipif(
    not TRACES.is_dir(), reason=f"dev-set traces not found at {TRACES} (third-party data)"
)
@pytest.mark.parametrize("num_requests, priced_at", SHAPES)
def test_batched_trees_equal_call_by_call_on_dev_traces(num_requests, priced_at):
    from agspec.policy.costmodel import get_cost_model

    sessions, dev = _dev_traces()
    # H200, a 32B model: trees pay at batch 1 and, trimmed, at 64.
    cost_model = get_cost_model("h200-qwen2.5-32b", context_tokens=16384)

    def make_server() -> AgSpecServer:
        return AgSpecServer(
            tokenizer=dev["tok"],
            global_corpus=dev["global"],
            config=VARIANTS["agspec"],
            cost_model=cost_model,
            batch_size=priced_at,
        )

    count = {1: 6, 8: 16}.get(num_requests, len(sessions))
    steps, branched = _lockstep(make_server, sessions[:count], num_requests, 16)
    assert branched > 0, f"no tree among {steps} steps"


# -- the native trie against its reference -----------------------------------------------


@st.composite
def candidate_batches(draw):
    """Requests over a small alphabet (so continuations repeat and share prefixes), each
    with its chain (often a continuation's prefix or the whole of one) and candidates."""
    from agspec.corpora.corpus_set import CorpusSet
    from agspec.index.token_index import TokenIndex

    index = TokenIndex()
    index.extend(0, draw(st.lists(st.integers(0, 3), min_size=1, max_size=60)))
    # Every rule, the k-th most recent ones among them (copied a slot's run at a time).
    rules = list(get_args(ContinuationRule))
    sets, slots, depths, picks, ranks, counts, firsts = [], [], [], [], [], [], []
    for _ in range(draw(st.integers(1, 4))):
        cs = CorpusSet(
            [("a", index, "recent"), ("b", index, "first")],
            draw(st.lists(st.integers(0, 3), max_size=4)),
        )
        n = draw(st.integers(0, 8))
        sets.append(cs)  # one per tree
        for _ in range(n):
            slots.append(draw(st.integers(0, 1)))
            depths.append(draw(st.integers(0, 6)))
            picks.append(draw(st.sampled_from(rules)))
            ranks.append(draw(st.integers(-3, 3)))
        counts.append(n)
        firsts.append(draw(st.lists(st.integers(0, 3), max_size=6)))
    return sets, slots, depths, picks, ranks, counts, firsts


@settings(max_examples=300, deadline=None)
@given(candidate_batches())
def test_native_tries_equal_merge_candidates(batch):
    from agspec.corpora.corpus_set import continuation_tries, continuations_batch
    from agspec.policy.tree_size import merge_candidates

    sets, slots, depths, rules, ranks, counts, firsts = batch
    got = continuation_tries(sets, slots, depths, rules, ranks, counts, firsts)
    flat = [cs for cs, n in zip(sets, counts) for _ in range(n)]
    conts = continuations_batch(flat, slots, depths, rules)
    at = 0
    for trie, n, first in zip(got, counts, firsts):
        assert trie == merge_candidates(first, conts[at : at + n], ranks[at : at + n])
        at += n


@settings(max_examples=200, deadline=None)
@given(candidate_batches())
def test_flat_tries_are_the_tries_tree_after_tree(batch):
    # The batch's seven lists (what step_batch reads) against each tree's own trie, and
    # flatten_tries (the non-native engines' path) against the native flat lists.
    from agspec.corpora.corpus_set import continuation_tries, continuation_tries_flat
    from agspec.policy.tree_size import flatten_tries

    tries = continuation_tries(*batch)
    flat = continuation_tries_flat(*batch)
    tokens, parents, support, branch_of, origin, node_at, origin_at = flat
    assert len(node_at) == len(origin_at) == len(tries) + 1
    assert node_at[0] == origin_at[0] == 0
    for t, trie in enumerate(tries):
        a, b = node_at[t], node_at[t + 1]
        o, e = origin_at[t], origin_at[t + 1]
        got = (tokens[a:b], parents[a:b], support[a:b], branch_of[a:b], origin[o:e])
        assert got == trie
    assert flatten_tries(tries) == flat


_BEGIN_ARGS = ("primary_slots", "primary_rules", "rules", "min_match", "depths", "max_occurrences")


_RULES = tree_rules(8, native=True)  # the default's, the k-th most recent among them


def _begin_args(trees, picked, min_match=1, rules=_RULES):
    """`begin_tree_candidates`' arguments for requests `picked` of a drawn batch (the
    dict of `grow_batches` and `_begun_batch`)."""
    from agspec.corpora.corpus_set import native_handles, rule_codes

    return dict(
        handles=native_handles([trees["sets"][t] for t in picked]),
        primary_slots=[trees["primary"][t][0] for t in picked],
        primary_rules=rule_codes([trees["primary"][t][1] for t in picked]),
        rules=rule_codes(list(rules)),
        min_match=min_match,
        depths=[trees["depths"][t] for t in picked],
        max_occurrences=32,
    )


def _sized_args(trees, picked, curves, rows, tables, prices):
    """`grow_begun_trees`' keyword arguments for requests `picked` of a drawn batch."""
    from agspec.policy.survival import BUCKET_OF_MATCH

    return dict(
        firsts=[trees["firsts"][t] for t in picked],
        chain_curves=[trees["chains"][t] for t in picked],
        agent_of=[trees["agents"][t] for t in picked],
        match_curves=rows,
        bucket_of_match=BUCKET_OF_MATCH,
        curves=curves,
        rate_tables=tables,
        budgets=[trees["budgets"][t] for t in picked],
        prices=prices,
    )


def _grow_all(handles, **kwargs):
    """`begin_tree_candidates`, then `grow_begun_trees` of every request begun (the
    keyword arguments of either)."""
    from agspec.policy.tree_size import begin_tree_candidates, grow_begun_trees

    begin = {k: kwargs.pop(k) for k in _BEGIN_ARGS}
    job = begin_tree_candidates(handles, **begin)
    return grow_begun_trees(job, list(range(len(begin["depths"]))), **kwargs)


@st.composite
def grow_batches(draw):
    """A batch step's trees for `begin_tree_candidates` and `grow_begun_trees`: requests
    over two small corpora (their matches differ, so candidates come from both and rank
    apart), each tree with its chain's (slot, rule), depth, chain, budget and agent, and
    curves and rates that are probabilities (non-rising curves)."""
    import random

    from agspec.corpora.corpus_set import CorpusSet
    from agspec.index.token_index import TokenIndex
    from agspec.policy.survival import MATCH_BUCKETS
    from agspec.policy.tree_size import MAX_SUPPORT_BUCKET

    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    a, b = TokenIndex(), TokenIndex()
    a.extend(0, draw(st.lists(st.integers(0, 3), min_size=1, max_size=60)))
    b.extend(0, draw(st.lists(st.integers(0, 3), min_size=1, max_size=30)))
    # Every rule, the k-th most recent ones among them (copied a slot's run at a time).
    rules = list(get_args(ContinuationRule))
    num_agents = draw(st.integers(1, 2))

    def curve(n: int) -> list[float]:
        return sorted((rng.random() for _ in range(n)), reverse=True)

    trees: dict[str, list] = {
        k: [] for k in ("sets", "primary", "depths", "firsts", "budgets", "agents", "chains")
    }
    curves: list[list[float]] = []
    for _ in range(draw(st.integers(1, 4))):
        trees["sets"].append(
            CorpusSet(
                [("a", a, draw(st.sampled_from(rules))), ("b", b, draw(st.sampled_from(rules)))],
                draw(st.lists(st.integers(0, 3), max_size=5)),
            )
        )
        trees["primary"].append((draw(st.integers(0, 1)), draw(st.sampled_from(rules))))
        depth = draw(st.integers(1, 6))
        trees["depths"].append(depth)
        first = draw(st.lists(st.integers(0, 3), max_size=6))
        trees["firsts"].append(first)
        trees["budgets"].append(draw(st.integers(0, 10)))
        trees["agents"].append(draw(st.integers(0, num_agents - 1)))
        trees["chains"].append(len(curves))
        curves.append(curve(max(len(first), 1)))
    deepest = max(trees["depths"])
    rows = []
    for _ in range(num_agents):
        rows.append(list(range(len(curves), len(curves) + MATCH_BUCKETS)))
        curves += [curve(deepest) for _ in range(MATCH_BUCKETS)]
    tables = [[rng.random() for _ in range(MAX_SUPPORT_BUCKET + 1)] for _ in range(num_agents)]
    prices = [0.0]
    for _ in range(draw(st.integers(0, 12))):
        prices.append(prices[-1] + rng.random() * 0.3)
    return trees, draw(st.integers(0, 3)), curves, rows, tables, prices


@settings(max_examples=300, deadline=None)
@given(grow_batches())
def test_grown_trees_equal_their_parts(batch):
    # The batched tree step's two native calls against the parts they fuse, each with its
    # own reference tests: the candidates listed as `tree_candidates` lists them, copied
    # and merged by continuation_tries_flat, then scored and sized by
    # size_flat_tries_at_prices with each branch's curve by its corpus's match bucket.
    from agspec.corpora.corpus_set import (
        continuation_tries_flat,
        match_lengths_flat,
    )
    from agspec.policy.survival import match_bucket
    from agspec.policy.tree_size import size_flat_tries_at_prices

    trees, min_match, curves, rows, tables, prices = batch
    sets = trees["sets"]
    rules = ["recent", "frequent", "first"]
    lengths = match_lengths_flat(sets)
    slots, cand_rules, ranks, depths, counts = [], [], [], [], []
    at = 0
    for t, cs in enumerate(sets):
        n = len(slots)
        for s in range(len(cs.names)):
            m = lengths[at + s]
            if m >= max(1, min_match):
                for r in rules:
                    if (s, r) != trees["primary"][t]:
                        slots.append(s)
                        cand_rules.append(r)
                        ranks.append(-m)
                        depths.append(trees["depths"][t])
        at += len(cs.names)
        counts.append(len(slots) - n)
    flat = continuation_tries_flat(sets, slots, depths, cand_rules, ranks, counts, trees["firsts"])
    tokens, parents, support, branch_of, origin, node_at, origin_at = flat
    sized, branch_curves, branch_starts = [], [], [0]
    cand_at = [sum(counts[:t]) for t in range(len(sets))]
    for t in range(len(sets)):
        o, e = origin_at[t], origin_at[t + 1]
        if not counts[t] or e - o <= 1:
            continue
        sized.append(t)
        branch_curves.append(trees["chains"][t])
        for k in origin[o + 1 : e]:
            m = -ranks[cand_at[t] + k]
            branch_curves.append(rows[trees["agents"][t]][match_bucket(m)])
        branch_starts.append(len(branch_curves))
    want = (
        size_flat_tries_at_prices(
            (tokens, parents, support, branch_of, node_at),
            sized,
            branch_curves=branch_curves,
            branch_starts=branch_starts,
            curves=curves,
            rate_tables=tables,
            rate_of=[trees["agents"][t] for t in sized],
            budgets=[trees["budgets"][t] for t in sized],
            prices=prices,
        )
        if sized
        else ([], [], [], [0], [])
    )
    every = range(len(sets))
    got_sized, got = _grow_all(
        **_begin_args(trees, every, min_match, rules),
        **_sized_args(trees, every, curves, rows, tables, prices),
    )
    assert got_sized == sized
    assert got == want


def test_grow_trees_refuses_inconsistent_input():
    from agspec.corpora.corpus_set import CorpusSet, native_handles, rule_codes
    from agspec.index.token_index import TokenIndex
    from agspec.policy.survival import BUCKET_OF_MATCH, MATCH_BUCKETS
    from agspec.policy.tree_size import MAX_SUPPORT_BUCKET

    index = TokenIndex()
    index.extend(0, [1, 2, 3, 1, 2, 4, 1, 2, 5])
    cs = CorpusSet([("s", index, "recent")], [1, 2])
    good = dict(
        primary_slots=[0],
        primary_rules=rule_codes(["recent"]),
        rules=rule_codes(["recent", "frequent", "first"]),
        min_match=1,
        depths=[3],
        firsts=[[5]],
        max_occurrences=32,
        chain_curves=[0],
        agent_of=[0],
        match_curves=[list(range(1, 1 + MATCH_BUCKETS))],
        bucket_of_match=BUCKET_OF_MATCH,
        curves=[[0.9]] + [[0.8, 0.5, 0.2]] * MATCH_BUCKETS,
        rate_tables=[[0.5] * (MAX_SUPPORT_BUCKET + 1)],
        budgets=[2],
        prices=[0.0, 0.01, 0.02, 0.03, 0.04],
    )
    sized, (tokens, parents, support, starts, num_chain) = _grow_all(native_handles([cs]), **good)
    # After [1, 2]: 3 (first), 4 and 5 (recent: the chain [5]); frequent ties go to the
    # most recent, the chain's. Two nodes: the chain's 5 (p 0.9), then first's 3, a root
    # child (p (1 - 0.9) * 0.5 = 0.05; 4 is no candidate).
    assert sized == [0] and starts == [0, 2] and num_chain == [1]
    assert (tokens, parents) == ([5, 3], [-1, -1])
    bad = {
        "depths": [0],
        "agent_of": [1],
        "budgets": [4, 4],
        "bucket_of_match": [],
        "match_curves": [[0]],  # a bucket without a curve
        "chain_curves": [99],  # a curve index out of range
        "curves": [[0.9]] + [[0.5, 0.8]] * MATCH_BUCKETS,  # a curve that rises
        "prices": [],
    }
    for key, value in bad.items():
        with pytest.raises(ValueError):
            _grow_all(native_handles([cs]), **(good | {key: value}))


def _begun_batch(seed: int, num_requests: int):
    """A batch step of num_requests trees over two shared corpora (enough distinct sets
    that the candidates are copied on the helper threads), as `grow_batches` draws them."""
    import random

    from agspec.corpora.corpus_set import CorpusSet
    from agspec.index.token_index import TokenIndex
    from agspec.policy.survival import MATCH_BUCKETS
    from agspec.policy.tree_size import MAX_SUPPORT_BUCKET

    rng = random.Random(seed)
    a, b = TokenIndex(), TokenIndex()
    a.extend(0, [rng.randrange(4) for _ in range(400)])
    b.extend(0, [rng.randrange(4) for _ in range(200)])
    # Every rule, the k-th most recent ones among them (copied a slot's run at a time).
    rules = list(get_args(ContinuationRule))
    sets, primary, depths, firsts, budgets, agents, chains = [], [], [], [], [], [], []
    curves: list[list[float]] = []

    def curve(n: int) -> list[float]:
        return sorted((rng.random() for _ in range(n)), reverse=True)

    for _ in range(num_requests):
        sets.append(
            CorpusSet(
                [("a", a, rng.choice(rules)), ("b", b, rng.choice(rules))],
                [rng.randrange(4) for _ in range(rng.randrange(6))],
            )
        )
        primary.append((rng.randrange(2), rng.choice(rules)))
        depths.append(rng.randint(1, 6))
        first = [rng.randrange(4) for _ in range(rng.randrange(7))]
        firsts.append(first)
        budgets.append(rng.randint(0, 10))
        agents.append(rng.randrange(2))
        chains.append(len(curves))
        curves.append(curve(max(len(first), 1)))
    rows = []
    for _ in range(2):
        rows.append(list(range(len(curves), len(curves) + MATCH_BUCKETS)))
        curves += [curve(max(depths)) for _ in range(MATCH_BUCKETS)]
    tables = [[rng.random() for _ in range(MAX_SUPPORT_BUCKET + 1)] for _ in range(2)]
    prices = [0.0]
    for _ in range(12):
        prices.append(prices[-1] + rng.random() * 0.3)
    trees = dict(
        sets=sets,
        primary=primary,
        depths=depths,
        firsts=firsts,
        budgets=budgets,
        agents=agents,
        chains=chains,
    )
    return trees, curves, rows, tables, prices


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("seed", range(6))
def test_begun_trees_grown_in_part_equal_those_grown_alone(seed, threads):
    # step_batch(trees=True) begins the candidates of more requests than it grows (their
    # chains are planned meanwhile, and their continuations copied from the same
    # cursors): the trees grown from a begun job equal those grown from a job of just
    # those requests, on the helper threads or not.
    import random

    from agspec import _native
    from agspec.corpora.corpus_set import continuation_batch
    from agspec.policy.tree_size import begin_tree_candidates, grow_begun_trees

    trees, curves, rows, tables, prices = _begun_batch(seed, 40)
    n = len(trees["sets"])
    rng = random.Random(seed)
    grown = sorted(rng.sample(range(n), rng.randint(0, n)))
    _native.set_batch_threads(threads)
    try:
        want = _grow_all(
            **_begin_args(trees, grown), **_sized_args(trees, grown, curves, rows, tables, prices)
        )
        chains_before = continuation_batch(trees["sets"], [0] * n, [8] * n)
        args = _begin_args(trees, range(n))
        job = begin_tree_candidates(args.pop("handles"), **args)
        # The chains' copies, from the same cursors, while the helpers copy candidates.
        assert continuation_batch(trees["sets"], [0] * n, [8] * n) == chains_before
        got = grow_begun_trees(
            job, grown, **_sized_args(trees, grown, curves, rows, tables, prices)
        )
    finally:
        _native.set_batch_threads(0)
    assert got == want
    with pytest.raises(ValueError, match="grown or dropped already"):
        grow_begun_trees(job, grown, **_sized_args(trees, grown, curves, rows, tables, prices))


def test_grow_begun_trees_refuses_bad_requests():
    from agspec.corpora.corpus_set import native_handles, rule_codes
    from agspec.policy.tree_size import begin_tree_candidates, grow_begun_trees

    trees, curves, rows, tables, prices = _begun_batch(7, 20)
    n = len(trees["sets"])

    def begin():
        args = _begin_args(trees, range(n))
        return begin_tree_candidates(args.pop("handles"), **args)

    def grow(job, picked):  # request 0's data for every tree (picked may be out of range)
        args = _sized_args(trees, [0] * len(picked), curves, rows, tables, prices)
        return grow_begun_trees(job, picked, **args)

    for picked in ([0, 0], [n], [-1]):  # a request twice, out of range
        with pytest.raises(ValueError, match="distinct requests"):
            grow(begin(), picked)
    job = begin()
    job.drop()
    job.drop()  # dropping twice is no error
    with pytest.raises(ValueError, match="grown or dropped already"):
        grow(job, [0])
    with pytest.raises(ValueError, match="one primary slot"):
        begin_tree_candidates(
            native_handles(trees["sets"]),
            primary_slots=[0],
            primary_rules=rule_codes(["recent"]),
            rules=rule_codes(["recent"]),
            min_match=1,
            depths=[1],
            max_occurrences=32,
        )
    assert grow(begin(), []) == ([], ([], [], [], [0], []))


def test_a_step_that_raises_between_its_halves_leaves_the_indexes(monkeypatch):
    # An error after the candidates were begun (here: in the bound, while the helpers
    # may still copy) drops them: the step raises it, every session's index takes a
    # writer at once (no read left held), and the next step drafts trees as usual.
    from agspec import _native
    from agspec.drafter import batch
    from agspec.drafter.call import AgSpecCall

    config = replace(VARIANTS["agspec"], use_global=False, use_history=False)
    server = AgSpecServer(
        tokenizer=CharTokenizer(), config=config, cost_model=Flat(), batch_size=32
    )
    # 24 requests (distinct sets, enough for the helper threads) whose prompts and
    # outputs are lines of one pool: every step drafts, and lines that recur with other
    # continuations make trees.
    rng = random.Random(9)
    pool = [[rng.randrange(1, 300) for _ in range(rng.randrange(4, 10))] for _ in range(12)]
    sessions = []
    for s in range(24):
        prompt = [t for _ in range(40) for t in rng.choice(pool)]
        out = [t for _ in range(60) for t in rng.choice(pool)]
        sessions.append((f"raise/{s}", [Call("coder", "code", 0, prompt, out)]))
    drafters = [_begin(server, sid, calls[0]) for sid, calls in sessions]
    outputs = [calls[0].output for _, calls in sessions]
    positions = [0] * len(sessions)
    committed: list[list[int] | None] = [None] * len(sessions)
    begun: list[int] = []  # how many requests the step began

    def step() -> list[DraftTree]:
        begun.clear()
        trees = step_batch(drafters, committed, 16, trees=True)
        for i, tree in enumerate(trees):  # greedy through the tree, as the model would
            _, commit, _ = tree_commit(tree, outputs[i], positions[i])
            positions[i] += len(commit)
            committed[i] = list(commit)
        return trees

    begin = batch.begin_tree_candidates
    monkeypatch.setattr(
        batch, "begin_tree_candidates", lambda *a, **k: begun.append(len(a[0])) or begin(*a, **k)
    )
    bound = AgSpecCall.tree_curve

    def broken(self, chain, budget):
        if begun and begun[0] >= 16:  # begun on the helper threads: fail between halves
            raise RuntimeError("bound failed")
        return bound(self, chain, budget)

    monkeypatch.setattr(AgSpecCall, "tree_curve", broken)
    _native.set_batch_threads(2)
    try:
        error = None
        for _ in range(20):
            try:
                step()
            except RuntimeError as exc:
                error = exc  # held, with its traceback (the step's frames)
                break
        assert error is not None and "bound failed" in str(error), begun
        monkeypatch.setattr(AgSpecCall, "tree_curve", bound)
        # A writer gets in while the error (its traceback, the step's frames) is still
        # held, as by an engine that logs it: nothing holds the index.
        for sid, _ in sessions:
            index = server.session(sid).session_corpus.index
            index.extend(10_000, [1, 2, 3])
            index.remove(10_000)
        del error
        # The calls accepted the step's tokens before the error: the next step goes on.
        assert all(p + 3 < len(o) for p, o in zip(positions, outputs))
        committed = [[outputs[i][positions[i]]] for i in range(len(sessions))]
        positions = [p + 1 for p in positions]
        assert any(not t.is_chain for t in step() + step())
    finally:
        _native.set_batch_threads(0)
