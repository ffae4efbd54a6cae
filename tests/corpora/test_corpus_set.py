"""CorpusSet and the batched step against oracles: brute-force matching, the per-cursor
path, the paper's source rule, and accept-then-propose one call at a time."""

from __future__ import annotations

import random

import pytest
from chartok import CharTokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from agspec.corpora import GlobalCorpus
from agspec.corpora.corpus_set import CorpusSet, SourceRule
from agspec.drafter import VARIANTS, AgSpecServer, choose_source, step_batch
from agspec.index.token_index import TokenIndex


class NotNative:
    """The same index seen through a non-native type: CorpusSet takes its Python path."""

    def __init__(self, index: TokenIndex) -> None:
        self.index = index

    def match(self, tokens, max_match_tokens=64):  # type: ignore[no-untyped-def]
        return self.index.match(tokens, max_match_tokens=max_match_tokens)

    def extend_list(self, doc_id, tokens):  # type: ignore[no-untyped-def]
        self.index.extend_list(doc_id, tokens)


def brute_match(docs: list[list[int]], fed: list[int], cap: int) -> int:
    """Longest suffix of `fed` (at most cap) that occurs in a document with a successor."""
    best = 0
    for k in range(1, min(cap, len(fed)) + 1):
        suffix = fed[-k:]
        if any(d[i : i + k] == suffix for d in docs for i in range(len(d) - k)):
            best = k
        else:
            break
    return best


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=20), min_size=1, max_size=3),
    st.lists(st.integers(0, 3), max_size=8),
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=3), max_size=8),
)
def test_native_and_python_paths_match_brute_force(docs, tail, steps):
    """Both paths give the brute-force match lengths, and the same continuations, while
    the set appends every step to a document of its own first corpus."""
    built = []
    for _ in range(2):
        a, b = TokenIndex(), TokenIndex()
        for i, d in enumerate(docs):
            (a if i % 2 == 0 else b).extend(i, d)
        built.append((a, b))
    (a1, b1), (a2, b2) = built
    native = CorpusSet(
        [("a", a1, "frequent"), ("b", b1, "first")], tail, max_match_tokens=6, appends=[(a1, 99)]
    )
    python = CorpusSet(
        [("a", NotNative(a2), "frequent"), ("b", NotNative(b2), "first")],
        tail,
        max_match_tokens=6,
        appends=[(NotNative(a2), 99)],
    )
    assert native.is_native and not python.is_native
    fed = list(tail)
    own: list[int] = []
    for step in [[]] + steps:
        if step:
            native.advance(step)
            python.advance(step)
            fed += step
            own += step
        docs_a = [d for i, d in enumerate(docs) if i % 2 == 0] + ([own] if own else [])
        docs_b = [d for i, d in enumerate(docs) if i % 2 == 1]
        expected = [brute_match(docs_a, fed, 6), brute_match(docs_b, fed, 6)]
        assert native.match_lengths() == python.match_lengths() == expected
        for slot in (0, 1):
            assert native.continuation(slot, 5) == python.continuation(slot, 5)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=4, max_size=4), st.integers(-3, 5))
def test_source_rules_are_the_papers_preference(lengths, margin):
    m_s, m_w, m_g, m_h = lengths
    names = ["session", "workspace", "global", "history"]
    cs = CorpusSet(
        [(n, TokenIndex(), "first") for n in names],
        [],
        order=[
            SourceRule("global", margin),
            SourceRule("history"),
            SourceRule("workspace"),
            SourceRule("session"),
        ],
    )
    slot = cs.pick(lengths)
    assert (names[slot] if slot >= 0 else None) == choose_source(m_s, m_w, m_g, margin, m_h=m_h)


def test_bad_entries_are_clear_errors():
    with pytest.raises(ValueError, match="unique"):
        CorpusSet([("a", TokenIndex(), "first"), ("a", TokenIndex(), "first")], [])
    with pytest.raises(ValueError, match="rule"):
        CorpusSet([("a", TokenIndex(), "sometimes")], [])  # type: ignore[list-item]
    cs = CorpusSet([("a", TokenIndex(), "first")], [1])
    with pytest.raises(ValueError, match=">= 0"):
        cs.advance([1, -5])
    with pytest.raises(ValueError, match="out of range"):
        cs.continuation(3, 4)


@pytest.mark.parametrize("variant", ["agspec-paper", "agspec", "agspec-paper-request-only"])
def test_step_batch_equals_one_call_at_a_time(variant):
    """Many requests stepped together draft exactly what they draft one call at a time."""
    from agspec.policy.costmodel import get_cost_model

    rng = random.Random(7)
    words = [[rng.randrange(1, 40) for _ in range(rng.randrange(2, 6))] for _ in range(30)]
    texts = [[t for _ in range(60) for t in rng.choice(words)] for _ in range(8)]
    g_docs = [[t for _ in range(80) for t in rng.choice(words)] for _ in range(4)]
    cm = get_cost_model("h200-qwen2.5-32b", context_tokens=16384)

    def make():
        g = GlobalCorpus.build(g_docs)
        return AgSpecServer(
            tokenizer=CharTokenizer(),
            global_corpus=g,
            config=VARIANTS[variant],
            cost_model=cm,
            batch_size=8,
        )

    one, many = make(), make()
    calls_one, calls_many = [], []
    for i, text in enumerate(texts):
        prompt = [0] + text[:40]
        for server, calls in ((one, calls_one), (many, calls_many)):
            c = server.session(f"s{i % 3}").call("coder", "code", 1)
            c.begin(prompt)
            calls.append(c)
    pos = [40] * len(texts)
    committed: list[list[int] | None] = [None] * len(texts)
    steps = drafted = 0
    while any(p < len(t) for p, t in zip(pos, texts)):
        active = [i for i, (p, t) in enumerate(zip(pos, texts)) if p < len(t)]
        # The oracle: every request accepts, then every request proposes (requests of one
        # session see each other's committed tokens of this step, as in an engine's step).
        for i in active:
            if committed[i]:
                calls_one[i].accept(committed[i])
        expected = [calls_one[i].propose(16) for i in active]
        got = step_batch([calls_many[i] for i in active], [committed[i] for i in active], 16)
        assert got == expected
        for i, draft in zip(active, got):
            out = texts[i][pos[i] :]
            a = 0
            while a < len(draft) and a < len(out) and draft[a] == out[a]:
                a += 1
            committed[i] = out[: a + 1]
            pos[i] += a + 1
            drafted += len(draft)
        steps += 1
    assert drafted > 0 and steps > 10


def test_step_batch_refusing_one_request_leaves_the_others_whole():
    """A bad committed list in the middle raises; the calls before it took their tokens
    (their next draft equals that of a call that accepted them alone), the others nothing."""
    docs = [[1, 2, 3, 4, 5, 6, 7, 8] * 4]

    def make():
        server = AgSpecServer(
            tokenizer=CharTokenizer(),
            global_corpus=GlobalCorpus.build(docs),
            config=VARIANTS["agspec-paper"],
        )
        calls = []
        for i in range(3):
            c = server.session(f"s{i}").call("coder", "code", 1)
            c.begin([0, 1, 2, 3])
            calls.append(c)
        return calls

    batch, alone = make(), make()
    drafts = step_batch(batch, [None, None, None], 4)
    assert drafts[0][:2] == [4, 5] and drafts == [drafts[0]] * 3
    with pytest.raises(ValueError, match="never proposed"):
        step_batch(batch, [[4, 5], [9, 9, 9], [4]], 4)
    assert step_batch(alone, [None, None, None], 4) == drafts
    alone[0].accept([4, 5])
    expected = alone[0].propose(4)
    assert expected and batch[0].propose(4) == expected
    # The refused call and the one after it still hold their drafts: they can accept.
    batch[1].accept([4])
    batch[2].accept(drafts[2] + [9])
    with pytest.raises(ValueError, match="max_tokens"):
        step_batch(batch, [None, None, None], -1)


def _shared_sets(num_sets: int) -> tuple[TokenIndex, TokenIndex, list[CorpusSet]]:
    """Sets over one shared live index (each appending its own document) and one other."""
    shared, other = TokenIndex(), TokenIndex()
    shared.extend(0, [5, 6, 7, 8, 9, 5, 6, 1])
    other.extend(0, [1, 2, 3, 4])
    sets = [
        CorpusSet(
            [("shared", shared, "first"), ("other", other, "first")],
            [5, 6],
            appends=[(shared, 1 + i)],
        )
        for i in range(num_sets)
    ]
    return shared, other, sets


def test_a_begun_batch_advance_is_the_one_at_a_time_advance():
    """advance_batch_begin on helper threads, the caller busy in between, then finish:
    the documents and match lengths of advancing each set in turn."""
    from agspec import _native
    from agspec.corpora.corpus_set import advance_batch_begin, match_lengths_batch

    rng = random.Random(3)
    steps = [[[rng.randrange(1, 10) for _ in range(rng.randrange(1, 5))] for _ in range(40)]
             for _ in range(6)]  # fmt: skip
    _native.set_batch_threads(2)
    try:
        shared, _, sets = _shared_sets(40)
        oshared, _, osets = _shared_sets(40)
        for committed in steps:
            finish = advance_batch_begin(sets, committed)
            busy = sum(range(20_000))  # the caller's own work meanwhile
            finish()
            for s, c in zip(osets, committed):
                s.advance(c)
            assert busy and match_lengths_batch(sets) == [s.match_lengths() for s in osets]
        for i in range(40):
            assert shared.document(1 + i) == oshared.document(1 + i)
    finally:
        _native.set_batch_threads(0)


def test_a_begun_batch_advance_raises_at_finish_and_finishes_when_dropped():
    """A bad id is raised by finish (the other sets moved); a job dropped unfinished still
    moves and appends everything before it is freed; a writer of a held index gives up
    (IndexStateError) instead of waiting for the job forever."""
    import gc

    from agspec import _native
    from agspec.corpora.corpus_set import advance_batch_begin
    from agspec.index.token_index import IndexStateError

    _native.set_batch_threads(2)
    try:
        shared, _, sets = _shared_sets(20)
        finish = advance_batch_begin(sets, [[7]] * 19 + [[-1]])
        with pytest.raises(ValueError, match="token ids must be >= 0"):
            finish()
        assert [shared.document(1 + i) for i in range(19)] == [[7]] * 19
        with pytest.raises(KeyError):
            shared.document(20)  # the refused set appended nothing
        advance_batch_begin(sets, [[8]] * 20)  # dropped at once
        gc.collect()
        assert [shared.document(1 + i) for i in range(20)] == [[7, 8]] * 19 + [[8]]
        finish = advance_batch_begin(sets, [[9]] * 20)
        with pytest.raises(IndexStateError):
            shared.extend(100, [1, 2])  # the job holds the index for reading
        finish()
        assert shared.document(1) == [7, 8, 9]
    finally:
        _native.set_batch_threads(0)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=3, max_size=6),
    st.lists(st.lists(st.integers(0, 3), max_size=6), min_size=1, max_size=5),
    st.permutations(["a", "b", "c"]),
    st.lists(st.integers(-2, 4), min_size=3, max_size=3),
    st.integers(0, 3),
)
def test_the_native_batched_pick_is_the_python_pick(docs, tails, names, margins, min_match):
    """match_picks_flat in C++ (native sets) gives what pick_at gives in Python (the same
    sets on a non-native engine), for any order and margins, with the min_match gate."""
    from agspec.corpora.corpus_set import match_picks_flat

    order = [SourceRule(n, m) for n, m in zip(names, margins)][: 1 + len(docs) % 3]
    worlds = []
    for wrap in (lambda ix: ix, NotNative):
        ixs = [TokenIndex() for _ in range(3)]
        for i, d in enumerate(docs):
            ixs[i % 3].extend(i, d)
        sets = [
            CorpusSet([(n, wrap(ix), "first") for n, ix in zip("abc", ixs)], tail, order=order)
            for tail in tails
        ]
        worlds.append(sets)
    native, python = worlds
    assert all(s.is_native for s in native) and not any(s.is_native for s in python)
    assert match_picks_flat(native, min_match) == match_picks_flat(python, min_match)


def test_a_native_order_with_a_slot_out_of_range_is_refused():
    from agspec import _native

    cs = CorpusSet([("a", TokenIndex(), "first")], [1])
    with pytest.raises(ValueError, match="out of range"):
        cs._native.set_order([(0, 0), (1, 2)])
    assert isinstance(cs._native, _native.CursorSet)
