"""REST-style drafter and the shared retrieval helpers, against hand-computed drafts and a
brute-force REST (longest span 16..2, all occurrences, greedy most-frequent trie path)."""

from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("agspec._native", reason="native index not built (pip install -e .)")

from agspec.baselines._base import DocStore, most_frequent_path, token_array  # noqa: E402
from agspec.baselines.rest import RestConfig, RestServer  # noqa: E402
from agspec.drafter.protocol import CallDrafter, DrafterServer  # noqa: E402


def _call(docs: list[list[int]], prompt: list[int]):
    call = RestServer(global_docs=docs).session("s").call("coder", "code", 0)
    call.begin(prompt)
    return call


# -- hand-computed drafts ----------------------------------------------------------------


def test_most_frequent_continuation_of_longest_match() -> None:
    # "2 3" matches in all three documents: 4 follows twice, 5 once.
    call = _call([[1, 2, 3, 4, 6], [1, 2, 3, 5], [7, 2, 3, 4, 8]], [9, 2, 3])
    # depth 0: 4 (x2) beats 5; depth 1 among the two "4" rows: 6 and 8 tie, 8 is more
    # recent (document 2 was added last).
    assert call.propose(8) == [4, 8]
    assert call.last_match_length == 2 and call.last_source == "global"


def test_longer_match_wins_over_more_frequent_shorter_one() -> None:
    # "1 2 3" occurs once (-> 9); "2 3" occurs three times (-> 4 twice).
    call = _call([[1, 2, 3, 9], [5, 2, 3, 4], [6, 2, 3, 4]], [1, 2, 3])
    assert call.propose(8) == [9]
    assert call.last_match_length == 3


def test_one_token_match_never_drafts() -> None:
    call = _call([[1, 2, 3, 4]], [9, 3])  # only "3" (1 token) occurs
    assert call.propose(8) == []
    assert call.last_match_length is None


def test_draft_length_is_fixed_at_ten_and_capped_by_max_tokens() -> None:
    doc = [1, 2] + list(range(100, 130))
    call = _call([doc], [1, 2])
    assert call.propose(64) == list(range(100, 110))
    assert call.propose(3) == [100, 101, 102]
    assert call.propose(0) == []


def test_match_window_is_sixteen_tokens() -> None:
    # A 20-token match is cut to its last 16 tokens, which also occur elsewhere.
    shared = list(range(50, 70))
    docs = [[1, *shared, 7], [2, *shared[4:], 8], [3, *shared[4:], 8]]
    call = _call(docs, [1, *shared])
    assert call._cursor.match_length == 16
    assert call.propose(4) == [8]  # two occurrences of the 16-token suffix say 8


def test_accept_feeds_committed_tokens() -> None:
    call = _call([[1, 2, 3, 4, 5, 6]], [9, 1])
    assert call.propose(4) == []  # "9 1" / "1": only 1 token matches
    call.accept([2])
    assert call.propose(2) == [3, 4]  # "1 2" now matches
    call.accept([3, 4, 0])  # 0 never occurs
    assert call.propose(2) == []


def test_documents_do_not_run_into_each_other() -> None:
    call = _call([[1, 2, 3], [4, 5]], [1, 2])
    assert call.propose(5) == [3]


def test_empty_global_corpus_drafts_nothing() -> None:
    assert _call([], [1, 2, 1, 2]).propose(4) == []


# -- helpers -----------------------------------------------------------------------------


def test_most_frequent_path_ties_go_to_the_most_recent_row() -> None:
    rows = np.array([[7, 1], [8, 2], [8, 3], [7, 4]], dtype=np.int32)
    assert most_frequent_path(rows) == [7, 1]  # 7 and 8 tie; row 0 (7) is most recent
    assert most_frequent_path(np.array([[5, -1], [5, 6], [4, 4]])) == [5, 6]
    assert most_frequent_path(np.zeros((0, 3), dtype=np.int32)) == []


def test_doc_store_grows_and_pads() -> None:
    store = DocStore()
    store.extend(0, list(range(3000)))  # past the initial buffer
    store.extend(0, [7])
    for d in range(1, 40):  # past the initial document table
        store.extend(d, [d, d + 1])
    assert store.continuations([(0, 2998), (39, 0), (5, 1)], 3).tolist() == [
        [2999, 7, -1],
        [40, -1, -1],
        [-1, -1, -1],
    ]
    with pytest.raises(ValueError, match="newest document"):
        store.extend(3, [1])


def test_token_array_rejects_bad_ids() -> None:
    assert token_array(np.array([1, 2], dtype=np.int64)).dtype == np.int32
    with pytest.raises(ValueError, match="token ids"):
        token_array([1, -2])
    with pytest.raises(ValueError, match="token ids"):
        token_array([2**31])
    with pytest.raises(TypeError):
        token_array([1.5, 2.0])
    with pytest.raises(TypeError):
        token_array("123")
    with pytest.raises(ValueError, match="flat"):
        token_array([[1, 2]])


def test_lifecycle_misuse_raises() -> None:
    server = RestServer(global_docs=[[1, 2, 3]])
    assert isinstance(server, DrafterServer)
    session = server.session("s")
    call = session.call("a", "code", 0)
    assert isinstance(call, CallDrafter)
    with pytest.raises(RuntimeError, match="begin"):
        call.propose(3)
    call.begin([1])
    with pytest.raises(RuntimeError, match="already"):
        call.begin([1])
    with pytest.raises(ValueError, match=">= 0"):
        call.propose(-1)
    with pytest.raises(TypeError):
        call.propose(2.5)  # type: ignore[arg-type]
    call.end()
    with pytest.raises(RuntimeError, match="ended"):
        call.accept([1])
    session.end()
    with pytest.raises(RuntimeError, match="ended"):
        session.call("a", "code", 1)
    with pytest.raises(ValueError, match="session_id"):
        server.session("")
    with pytest.raises(ValueError):
        RestConfig(min_match_tokens=0)


# -- brute-force oracle ------------------------------------------------------------------


def _rest_oracle(docs: list[list[int]], context: list[int], num_tokens: int) -> list[int]:
    """REST by brute force: spans 16..2, every occurrence with a successor, greedy trie."""
    for span in range(min(16, len(context)), 1, -1):
        suffix = context[-span:]
        occ = [
            (d, i + span - 1)
            for d, doc in enumerate(docs)
            for i in range(len(doc) - span)
            if doc[i : i + span] == suffix
        ]
        if occ:
            break
    else:
        return []
    occ.sort(reverse=True)  # most recent first: later documents, later offsets
    rows = [docs[d][e + 1 : e + 1 + num_tokens] for d, e in occ]
    path: list[int] = []
    for depth in range(num_tokens):
        live = [r for r in rows if len(r) > depth and r[: len(path)] == path]
        if not live:
            break
        counts: dict[int, int] = {}
        for r in live:
            counts[r[depth]] = counts.get(r[depth], 0) + 1
        best = max(counts.values())
        path.append(next(r[depth] for r in live if counts[r[depth]] == best))
    return path


@pytest.mark.parametrize("seed", range(40))
def test_matches_brute_force_rest(seed: int) -> None:
    rng = random.Random(seed)
    vocab = rng.choice([3, 5, 8])
    docs = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 40))] for _ in range(4)]
    context = [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))]
    server = RestServer(global_docs=docs)
    call = server.session("s").call("a", "code", 0)
    call.begin(context)
    for _ in range(6):
        k = rng.randrange(1, 14)
        assert call.propose(k) == _rest_oracle(docs, context, min(k, 10))
        step = [rng.randrange(vocab) for _ in range(rng.randrange(1, 4))]
        call.accept(step)
        context += step
    call.end()
