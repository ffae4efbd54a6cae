"""The suffix-tree engine (agspec.index.suffix_tree) against the native index and brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip(
    "arctic_inference.suffix_decoding._C",
    reason="arctic-inference 0.3.0 is not installed (pip install 'agspec[suffix]')",
)

from chartok import CharTokenizer, toks

from agspec.corpora import GlobalCorpus  # noqa: E402
from agspec.drafter import AgSpecConfig, AgSpecServer  # noqa: E402
from agspec.index.suffix_tree import SuffixTreeIndex  # noqa: E402
from agspec.index.token_index import TokenIndex  # noqa: E402


def occurrences(docs: list[list[int]], s: list[int]) -> list[tuple[int, int]]:
    """(doc, start) of every occurrence of `s` (brute force)."""
    n = len(s)
    return [
        (d, i) for d, doc in enumerate(docs) for i in range(len(doc) - n + 1) if doc[i : i + n] == s
    ]


def brute_match(docs: list[list[int]], ctx: list[int], cap: int) -> int:
    """Longest suffix of ctx (<= cap tokens) that occurs with a next token."""
    best = 0
    for m in range(1, min(cap, len(ctx)) + 1):
        s = ctx[len(ctx) - m :]
        if any(i + m < len(docs[d]) for d, i in occurrences(docs, s)):
            best = m
        else:
            break
    return best


# -- hand-made cases --------------------------------------------------------------------


def test_doc_end_without_continuation_does_not_count():
    idx = SuffixTreeIndex(16)
    idx.extend(0, [5, 1, 2, 3, 7])
    idx.extend(1, [9, 1, 2, 3])  # the request's own text: "1 2 3" ends here, no next token
    cur = idx.match([9, 1, 2, 3])
    # "9 1 2 3" occurs only at the end of doc 1; "1 2 3" is followed by 7 in doc 0.
    assert cur.match_length == 3
    # count("1 2 3") = 2 (one at a document end), count("1 2 3 7") = 1: p = 0.5 >= 0.1.
    assert cur.continuation(4) == [7]
    assert cur.engine_max_tokens == 3
    idx.extend(1, [4])  # now "9 1 2 3" has a continuation: the cursor sees the new version
    assert cur.match_length == 4
    assert cur.continuation(4) == [4]


def test_depth_bounds_match_and_draft():
    idx = SuffixTreeIndex(4)
    idx.extend(0, [1, 2, 3, 4, 5, 6, 7])
    cur = idx.match([1, 2, 3, 4])
    assert cur.match_length == 3  # a match of max_depth tokens leaves no continuation
    assert cur.continuation(10) == [5]  # match 3 + draft 1 = depth 4
    cur2 = idx.match([1])
    assert cur2.continuation(10) == [2, 3, 4]


def test_min_token_prob_cuts_the_path():
    idx = SuffixTreeIndex(8, min_token_prob=0.4)
    # "a" is followed by b, c, d, e once each: the first step already has p = 0.25 < 0.4.
    idx.extend(0, [1, 2, 1, 3, 1, 4, 1, 5])
    cur = idx.match([1])
    assert cur.match_length == 1
    assert cur.continuation(4) == []
    loose = SuffixTreeIndex(8, min_token_prob=0.0)
    loose.extend(0, [1, 2, 1, 3, 1, 4, 1, 5])
    c = loose.match([1]).continuation(1)
    assert len(c) == 1 and c[0] in (2, 3, 4, 5)


def test_engine_max_tokens_is_suffix_decodings_rule():
    idx = SuffixTreeIndex(64, max_spec_tokens=5, max_spec_factor=0.5)
    idx.extend(0, list(range(40)))
    assert idx.match(list(range(7))).engine_max_tokens == 3  # floor(7 * 0.5)
    assert idx.match(list(range(30))).engine_max_tokens == 5  # min(5, 15)
    assert idx.match([99]).engine_max_tokens == 0


def test_one_engine_search_per_step():
    idx = SuffixTreeIndex(16)
    idx.extend(0, [1, 2, 3, 4, 5, 6])
    cur = idx.match([1, 2])
    calls = 0
    real = idx._probe

    def counting(window: list[int], length: int) -> tuple[list[int], list[float]]:
        nonlocal calls
        calls += 1
        return real(window, length)

    idx._probe = counting  # type: ignore[method-assign]
    _ = cur.match_length
    n = calls
    assert n >= 1
    _ = cur.engine_max_tokens, cur.continuation(3), cur.match_length
    assert calls == n  # cached for this (tokens fed, index version)
    cur.extend_list([3])
    assert cur.match_length == 3 and calls > n


def test_bad_input_is_rejected():
    idx = SuffixTreeIndex()
    with pytest.raises(TypeError):
        idx.extend(0, "abc")
    with pytest.raises(ValueError):
        idx.extend(0, [1, -2])
    with pytest.raises(TypeError):
        idx.extend(0, np.array([1, 2], dtype=np.int64))
    with pytest.raises(TypeError):
        idx.extend_list(0, [1, 2.5])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        idx.extend_list(0, [2**31])
    with pytest.raises(ValueError):
        idx.extend(-1, [1])
    with pytest.raises(TypeError):
        idx.extend(True, [1])
    with pytest.raises(ValueError):
        idx.match([1], max_match_tokens=0)
    with pytest.raises(ValueError):
        SuffixTreeIndex(1)
    with pytest.raises(ValueError):
        SuffixTreeIndex(8, min_token_prob=1.5)
    cur = idx.match([1])
    with pytest.raises(ValueError):
        cur.continuation(-1)
    with pytest.raises(ValueError):
        cur.continuation(2, "latest")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        cur.continuation(2, max_occurrences=0)
    with pytest.raises(ValueError):
        cur.extend_list([-1])  # the probe's sentinel is never a token
    with pytest.raises(NotImplementedError):
        idx.save("/tmp/x")
    assert idx.num_tokens == 0 and idx.num_documents == 0  # nothing half-added


# -- differential: the native index and brute force -------------------------------------

small = st.lists(st.integers(0, 2), max_size=14)


@settings(max_examples=150, deadline=None)
@given(
    docs=st.lists(small, min_size=1, max_size=3),
    feeds=st.lists(st.tuples(small.map(lambda x: x[:4]), st.integers(-1, 2), small), max_size=6),
    depth=st.sampled_from([3, 4, 6, 64]),
    max_match=st.sampled_from([2, 5, 64]),
)
def test_match_length_equals_native_and_continuation_is_real(docs, feeds, depth, max_match):
    tree, native = SuffixTreeIndex(depth, min_token_prob=0.0), TokenIndex()
    held = [list(d) for d in docs]
    for i, d in enumerate(docs):
        tree.extend(i, d)
        native.extend(i, d)
    cap = min(max_match, depth - 1)  # the tree cannot see a continuation at its full depth
    ct = tree.match(max_match_tokens=max_match)
    cn = native.match(max_match_tokens=cap)
    ctx: list[int] = []
    for feed, grow_doc, grow in feeds:
        ct.extend_list(list(feed))
        cn.extend(feed)
        ctx += feed
        if grow_doc >= 0 and grow_doc < len(held):  # the index grows under the cursor
            tree.extend(grow_doc, grow)
            native.extend(grow_doc, grow)
            held[grow_doc] += grow
        m = ct.match_length
        assert m == cn.match_length == brute_match(held, ctx, cap)
        draft = ct.continuation(depth)
        assert len(draft) <= depth - m
        if m == 0:
            assert draft == []
            continue
        s = ctx[len(ctx) - m :]
        # The draft follows the match somewhere in the corpus ...
        assert occurrences(held, s + draft), (s, draft)
        # ... and starts with a most frequent next token (p >= 0: never empty here).
        nxt = [held[d][i + m] for d, i in occurrences(held, s) if i + m < len(held[d])]
        counts = {t: nxt.count(t) for t in nxt}
        assert draft and counts[draft[0]] == max(counts.values())


# -- end to end: AgSpec drafting on the suffix tree -------------------------------------


def run_call(call, prompt: str, output: str) -> list[tuple[str | None, int, int]]:
    """Greedy replay of one call; returns (source, match length, accepted) per step."""
    call.begin(toks(prompt))
    out, pos, steps = toks(output), 0, []
    while pos < len(out):
        draft = call.propose(16)
        acc = 0
        while acc < len(draft) and pos + acc < len(out) and draft[acc] == out[pos + acc]:
            acc += 1
        call.accept(out[pos : pos + acc + 1])
        steps.append((call.last_source, call.last_match_length, acc))
        pos += acc + 1
    call.end()
    return steps


def test_agspec_on_the_suffix_tree_drafts_session_text():
    results = {}
    for engine in ("native", "suffix-tree"):
        server = AgSpecServer(
            tokenizer=CharTokenizer(), config=AgSpecConfig(use_global=False, engine=engine)
        )
        sess = server.session("s1")
        run_call(sess.call("coder", "code", 1), "\x00fix it", "def f(): return 1")
        results[engine] = run_call(sess.call("coder", "code", 2), "\x00again", "def f(): return 2")
    steps = results["suffix-tree"]
    assert "session" in [s for s, _, _ in steps]
    assert sum(a for _, _, a in steps) >= len("ef(): return ") - 1
    # One occurrence per context here: both engines see the same matches, sources, drafts.
    assert steps == results["native"]


def test_agspec_on_the_suffix_tree_uses_workspace_and_global():
    seen = {}
    for engine, factory in (("native", TokenIndex), ("suffix-tree", SuffixTreeIndex)):
        g = GlobalCorpus.build([toks("the quick brown fox jumps")], factory)
        server = AgSpecServer(
            tokenizer=CharTokenizer(),
            global_corpus=g,
            config=AgSpecConfig(global_margin_tokens=3, engine=engine),
        )
        sess = server.session("s")
        assert isinstance(sess.workspace.index, factory)
        sess.open_artifact("n.txt", "brown cat")
        seen[engine] = []
        for prompt, max_tokens in (
            ("\x00quick brown", 4),
            ("\x00k brown", 4),
            ("\x00n c", 16),
            ("\x00the qu", 16),
            ("\x00q", 16),
        ):
            call = sess.call("a", "other", 0)
            call.begin(toks(prompt))
            draft = call.propose(max_tokens)
            seen[engine].append((call.last_source, call.last_match_length, draft))
    assert seen["suffix-tree"] == [
        # m_g = 11 > m_w 5 ("brown") + 3: global; the request allows 4 tokens.
        ("global", 11, toks(" fox")),
        # m_g = 7 ("k brown") is not > 5 + 3: workspace.
        ("workspace", 5, toks(" cat")),
        # "brown cat" ends after 2 more tokens.
        ("workspace", 3, toks("at")),
        # m_g = 6 > m_s 2 ("qu" of an earlier prompt) + 3: global; SuffixDecoding's rule
        # min(32, floor(6 * 1.0)) = 6 tokens.
        ("global", 6, toks("ick br")),
        # m_s = 2 ("\x00q" of the first prompt, followed by "uick"): the rule allows 2.
        ("session", 2, toks("ui")),
    ]
    # The native engine has no length rule of its own: it drafts up to the cap (16) there.
    assert [x[:2] for x in seen["native"]] == [x[:2] for x in seen["suffix-tree"]]
