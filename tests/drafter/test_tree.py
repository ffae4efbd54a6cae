"""Token trees: the draft type, its verification against brute force, and AgSpec's trees."""

from __future__ import annotations

from dataclasses import replace

import pytest
from chartok import CharTokenizer, toks
from hypothesis import given, settings
from hypothesis import strategies as st

from agspec.drafter import VARIANTS, AgSpecServer
from agspec.drafter.protocol import greedy_commit
from agspec.drafter.tree import DraftTree, check_tree, tree_commit


class Flat:
    """A big GPU at batch 1: verifying any number of tokens costs one decode step."""

    def step_cost(self, n_tokens: int, batch_size: int) -> float:
        return 1.0


class Linear:
    """A small model on a CPU: every verified token costs as much as a decode step."""

    def step_cost(self, n_tokens: int, batch_size: int) -> float:
        return float(n_tokens)


# -- the draft type ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "tokens, parents, needle",
    [
        ([7, 8], [-1, 1], "parents[1] = 1"),  # its own parent
        ([7, 8, 9], [-1, 2, 0], "parents[1] = 2"),  # a later parent
        ([7, 8], [-1, 5], "parents[1] = 5"),  # out of range
        ([7, 8], [-2, 0], "parents[0] = -2"),  # below the root
        ([7, 8], [0, 0], "parents[0] = 0"),  # node 0 must hang from the root
        ([7, 8], [-1], "same length"),
        ([7, -3], [-1, 0], "token_ids[1] = -3"),
        ([7, 2**31], [-1, 0], "token_ids[1]"),
        ([7, 8], [-1, True], "parents[1] = True"),
    ],
)
def test_malformed_trees_are_refused_naming_the_node(tokens, parents, needle):
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        DraftTree(tokens, parents)
    with pytest.raises(ValueError):
        check_tree(tokens, parents)


def test_chain_is_a_tree_with_one_branch():
    tree = DraftTree.chain([5, 6, 7])
    assert tree.parents == [-1, 0, 1] and tree.is_chain
    assert tree.first_branch() == [5, 6, 7] and tree.depth() == 3
    assert not DraftTree([7, 8, 9, 4], [-1, 0, 1, 0]).is_chain
    assert DraftTree([], []).first_branch() == [] and DraftTree([], []).depth() == 0


@st.composite
def trees_and_outputs(draw):
    """A random tree over a small alphabet (so branches collide with the output often)
    and an output that often follows one of its paths for a while."""
    n = draw(st.integers(0, 12))
    parents = [draw(st.integers(-1, i - 1)) for i in range(n)]
    tokens = [draw(st.integers(0, 3)) for _ in range(n)]
    tree = DraftTree(tokens, parents)
    out = draw(st.lists(st.integers(0, 3), min_size=1, max_size=10))
    if n and draw(st.booleans()):
        # Follow a random node's path, then the random tail.
        out = tree.path(draw(st.integers(0, n - 1))) + out
    start = draw(st.integers(0, len(out) - 1))
    prefix = draw(st.lists(st.integers(0, 3), max_size=3))
    return tree, prefix + out, len(prefix) + start


@settings(max_examples=400, deadline=None)
@given(trees_and_outputs())
def test_tree_commit_against_brute_force(case):
    tree, reference, start = case
    rest = reference[start:]
    # Brute force: every node's root path; the longest that the output starts with.
    best = 0
    for node in range(tree.num_nodes):
        path = tree.path(node)
        if rest[: len(path)] == path and len(path) > best:
            best = len(path)
    accepted, committed, first = tree_commit(tree, reference, start)
    assert accepted == best
    assert list(committed) == rest[: best + 1]
    # The first branch alone: a chain.
    assert first == greedy_commit(tree.first_branch(), reference, start)[0]
    assert first <= accepted


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=8), st.lists(st.integers(0, 3), min_size=1, max_size=8))
def test_a_chain_tree_commits_as_the_chain(draft, out):
    accepted, committed, first = tree_commit(DraftTree.chain(draft), out, 0)
    assert (accepted, list(committed)) == tuple(
        [greedy_commit(draft, out, 0)[0], list(greedy_commit(draft, out, 0)[1])]
    )
    assert first == accepted


# -- AgSpec's trees ---------------------------------------------------------------------

TREES = replace(VARIANTS["agspec"], use_global=False, use_history=False)


def _server(config=TREES, cost_model=None) -> AgSpecServer:
    return AgSpecServer(tokenizer=CharTokenizer(), config=config, cost_model=cost_model or Flat())


def _second_call(server: AgSpecServer, first: str, second: str):
    """A session whose first call's prompt is `first` (and output `q`), and its second
    call begun on `second`."""
    sess = server.session("s")
    call = sess.call("coder", "code", 0)
    call.begin(toks(first))
    call.accept(toks("q"))
    call.end()
    call = sess.call("coder", "code", 1)
    call.begin(toks(second))
    return call


def _two_occurrences(server: AgSpecServer):
    """A session whose text has `56789xy` early and `56742` late: after `56` the chain
    copies the recent occurrence, the tree adds the first one."""
    return _second_call(server, "\x00ab56789xy56742", "\x00zz56")


def test_tree_adds_the_other_occurrence_after_the_chain():
    server = _server()
    call = _two_occurrences(server)
    tree = call.propose_tree(10)  # alternatives up to 10 // 2 = 5 tokens deep
    # The chain first (recent occurrence: 7 4 2 q), then the first occurrence's 8 9 x y
    # after the shared 7.
    assert [chr(t) for t in tree.token_ids] == list("742q89xy")
    assert tree.parents == [-1, 0, 1, 2, 0, 4, 5, 6]
    assert tree.first_branch() == toks("742q")
    # The model writes 7 8 then '!': the second branch wins. At 7 the first child (4) was
    # wrong and the alternative (8) right. Its support is 2: the first occurrence is also
    # the second most recent ("first" and "recent2" copy the same 8 9 x y). One success
    # for the rate at support 2 (prior 0.2 at weight 4: 0.8 of 4, now 1.8 of 5); at 8 no
    # alternative was tried.
    call.accept(toks("78!"))
    assert server.branch_rates._counts == {("coder", 2): [5.0, 1.8]}
    # The chain (742q) is what the acceptance curve learns from: 1 of 4 accepted.
    at_risk, survived = server.lengths.survival._counts[("coder", 2)]
    prior = server.lengths.survival._prior(2)
    assert [a - b for a, b in zip(at_risk[:5], prior[0][:5])] == [1, 1, 0, 0, 0]
    assert [a - b for a, b in zip(survived[:5], prior[1][:5])] == [1, 0, 0, 0, 0]


def _three_occurrences(config=TREES):
    """A session with `56AB`, `56CD` and `56EF` in that order: after `56` the chain copies
    the most recent (EF), the first occurrence gives AB and only the second most recent
    gives CD."""
    return _second_call(_server(config), "\x0056AB.56CD.56EF.", "\x00zz56")


def test_tree_branches_from_the_second_most_recent_occurrence():
    tree = _three_occurrences().propose_tree(8)  # alternatives 4 tokens deep
    # The chain, then the first occurrence's AB and the second most recent's CD: eight
    # nodes kept of the twelve (the alternatives' third and fourth tokens are the least
    # likely nodes).
    assert [chr(t) for t in tree.token_ids] == list("EF.qABCD")
    assert tree.parents == [-1, 0, 1, 2, -1, 4, -1, 6]


def test_tree_occurrences_one_leaves_the_other_recent_ones_out():
    call = _three_occurrences(replace(TREES, tree_occurrences=1))
    tree = call.propose_tree(8)
    assert [chr(t) for t in tree.token_ids] == list("EF.qAB.5")
    with pytest.raises(ValueError, match="tree_occurrences"):
        replace(TREES, tree_occurrences=9)


def test_an_engine_without_occurrences_leaves_the_other_recent_ones_out():
    # The suffix tree keeps counts, not occurrences: its candidates are the three rules'.
    pytest.importorskip("arctic_inference", reason="arctic-inference is not installed")
    call = _three_occurrences(replace(TREES, engine="suffix-tree"))
    tree = call.propose_tree(8)
    assert tree.num_nodes >= 1
    assert call._tree_rules
    for rules in call._tree_rules.values():
        assert all(r in ("recent", "frequent", "first") for rs in rules for r in rs)


class _Rates:
    """Records what a tree's accept feeds the alternatives' rates."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, bool]] = []

    def observe(self, agent: str, support: int, right: bool) -> None:
        self.seen.append((support, right))


def _path_oracle(tree: DraftTree, support: list[int], committed: list[int]):
    """Brute force of a tree accept's walk: the children of each node on the committed
    path (every node scanned), the alternatives tried where the first child was wrong,
    and whether the tokens are a root path plus one token (None when not)."""
    seen = []
    node = -1
    for d, want in enumerate(committed):
        group = [i for i in range(tree.num_nodes) if tree.parents[i] == node]
        right = [i for i in group if tree.token_ids[i] == want]
        if group and tree.token_ids[group[0]] != want:
            for i in group[1:]:
                seen.append((support[i], tree.token_ids[i] == want))
                if tree.token_ids[i] == want:
                    break
        if not right:
            return seen if d == len(committed) - 1 else None
        node = right[0]
    return seen


@settings(max_examples=400, deadline=None)
@given(trees_and_outputs(), st.data())
def test_tree_accept_walk_against_brute_force(case, data):
    # What accept learns from a tree (the alternatives tried on the committed path) and
    # what it refuses, against every node scanned at every depth.
    tree, reference, start = case
    committed = reference[start:]
    if data.draw(st.booleans()):  # often a root path plus one token
        _, committed, _ = tree_commit(tree, reference, start)
        committed = list(committed)
    support = [data.draw(st.integers(1, 6)) for _ in range(tree.num_nodes)]
    call = _two_occurrences(_server())
    call.propose(4)
    call._tree, call._draft = (tree, support), tree.first_branch()
    rates = _Rates()
    call.session.server.branch_rates = rates  # type: ignore[assignment]
    want = _path_oracle(tree, support, committed)
    if want is None:
        with pytest.raises(ValueError, match="root path of the draft tree"):
            call._tree_path(committed, True)
        return
    chain_accept = call._tree_path(committed, True)
    assert rates.seen == want
    first = tree.first_branch()
    a = 0
    while a < min(len(committed) - 1, len(first)) and committed[a] == first[a]:
        a += 1
    assert chain_accept == a


def test_tree_accept_refuses_tokens_never_proposed():
    call = _two_occurrences(_server())
    call.propose_tree(8)
    with pytest.raises(ValueError, match="root path of the draft tree"):
        call.accept(toks("79!"))  # 9 hangs below 8, not below 7
    with pytest.raises(ValueError, match="root path"):
        call.accept(toks("4!!"))


def test_budget_zero_or_one_drafts_todays_chain():
    for budget_config in (replace(TREES, tree_max_nodes=1), replace(TREES, tree_max_nodes=0)):
        chain_server, tree_server = _server(budget_config), _server(TREES)
        chain_call = _two_occurrences(chain_server)
        tree = chain_call.propose_tree(8)
        assert tree == DraftTree.chain(toks("742q"))
        # The same as propose() of a tree server: propose() always drafts the chain.
        assert _two_occurrences(tree_server).propose(8) == toks("742q")
    # max_nodes of 1 asks for a chain too.
    assert _two_occurrences(_server()).propose_tree(1) == DraftTree.chain(toks("7"))


def test_a_cpu_profile_keeps_the_chain():
    # Each verified token costs a decode step: no extra node pays (nor the chain itself).
    call = _two_occurrences(_server(cost_model=Linear()))
    tree = call.propose_tree(8)
    assert tree.is_chain


def test_trees_need_the_cost_rule():
    with pytest.raises(ValueError, match="tree_max_nodes = 8 needs length_mode='cost'"):
        replace(VARIANTS["agspec-paper"], tree_max_nodes=8)
    with pytest.raises(ValueError, match="tree_max_nodes must be in"):
        replace(TREES, tree_max_nodes=-1)


def test_agspec_chain_is_the_default_with_one_branch():
    assert VARIANTS["agspec-chain"] == replace(VARIANTS["agspec"], tree_max_nodes=1)
    assert VARIANTS["agspec"].tree_max_nodes > 1


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=10, max_size=80),
    st.lists(st.integers(0, 4), min_size=1, max_size=40),
    st.integers(2, 12),
)
def test_tree_replay_never_exceeds_the_budget_and_commits_the_output(history, out, budget):
    """A whole call replayed with trees: every tree within the budget and well formed,
    the committed tokens are the output, and the corpora end where a chain call's do."""
    cfg = replace(TREES, tree_max_nodes=budget)
    server = _server(cfg)
    sess = server.session("s")
    first = sess.call("coder", "code", 0)
    first.begin([9, *history])
    first.accept([9])
    first.end()
    call = sess.call("coder", "code", 1)
    call.begin([9, *history[-5:]])
    pos = 0
    committed_all: list[int] = []
    while pos < len(out):
        tree = call.propose_tree(budget)
        assert tree.num_nodes <= budget
        check_tree(tree.token_ids, tree.parents)
        _, committed, _ = tree_commit(tree, out, pos)
        call.accept(list(committed))
        committed_all += committed
        pos += len(committed)
    assert committed_all == out
    assert server.branch_rates.rate("coder", 1) > 0


def _agent_sessions(seed: int, num_sessions: int = 4):
    """Agent-like sessions (outputs copy lines of a shared pool, with edits; prompts
    resend the history), so every corpus finds matches with several occurrences."""
    import random

    from agspec.lab.records import ReplayCall, ReplaySession

    rng = random.Random(seed)
    pool = [[rng.randrange(1, 300) for _ in range(rng.randrange(4, 10))] for _ in range(30)]
    sessions = []
    for s in range(num_sessions):
        history = [rng.randrange(1, 300) for _ in range(60)]
        calls = []
        for turn in range(4):
            out: list[int] = []
            for _ in range(rng.randrange(5, 10)):
                line = list(rng.choice(pool))
                if rng.random() < 0.4:
                    line[rng.randrange(len(line))] = rng.randrange(1, 300)
                out += line
            calls.append(ReplayCall("coder", "code", turn, list(history), out))
            history = history + out + [rng.randrange(1, 300) for _ in range(20)]
        sessions.append(ReplaySession(f"hand/{seed}/{s}", tuple(calls)))
    return sessions


def _replay(name: str, cost_model, batch_size: int, sessions):
    from agspec.lab.registry import make_server
    from agspec.lab.simulator import replay_batched

    server = make_server(
        name, global_docs=[], tokenizer=CharTokenizer(), cost_model=cost_model, batch_size=1
    )
    if batch_size > 1:
        server.set_batch_size(batch_size)
    return replay_batched(
        [(s, server) for s in sessions], batch_size=batch_size, cost_model=cost_model
    )


@pytest.mark.parametrize("batch_size", [1, 4])
def test_the_measured_cpu_profile_drafts_the_chain_step_for_step(batch_size):
    # llama.cpp on 2 CPU threads: verifying 2 tokens costs 2.2 decode steps. No tree pays:
    # the default drafts exactly what agspec-chain drafts, step for step.
    from agspec.policy.costmodel import get_cost_model

    cpu = get_cost_model("epyc2t-llamacpp-qwen2.5-coder-0.5b-measured", context_tokens=1024)
    sessions = _agent_sessions(3)
    tree = _replay("agspec", cpu, batch_size, sessions)
    chain = _replay("agspec-chain", cpu, batch_size, sessions)
    for column in ("drafted", "accepted", "committed", "position"):
        assert tree.recorder.columns[column] == chain.recorder.columns[column]
    assert tree.num_branch_wins == 0


def test_a_big_gpu_profile_drafts_trees_that_win():
    # H200, a 32B model, batch 1: verifying 64 tokens costs one decode step. Trees pay:
    # later branches win steps, and the run takes fewer steps than the chain's.
    from agspec.policy.costmodel import get_cost_model

    gpu = get_cost_model("h200-qwen2.5-32b")
    sessions = _agent_sessions(4)
    tree = _replay("agspec", gpu, 1, sessions)
    chain = _replay("agspec-chain", gpu, 1, sessions)
    assert tree.num_branch_wins > 0
    assert tree.drafted_per_step > chain.drafted_per_step
    assert tree.tokens_per_step > chain.tokens_per_step


def test_trees_in_a_full_batch_price_nodes_at_the_batch_rate():
    # H200, a 32B model, batch 16: the tree step prices its nodes with the chain rule's
    # batch prices (`CostLengthRule.batch_prices`), so a tree is drafted where a node
    # pays at the batch's rate; the run commits every output as the chain's run does.
    from agspec.policy.costmodel import get_cost_model

    gpu = get_cost_model("h200-qwen2.5-32b")
    sessions = _agent_sessions(4)
    tree = _replay("agspec", gpu, 16, sessions)
    chain = _replay("agspec-chain", gpu, 16, sessions)
    assert sum(tree.recorder.columns["committed"]) == sum(chain.recorder.columns["committed"])
    assert tree.num_branch_wins > 0
    assert tree.tokens_per_step >= chain.tokens_per_step
