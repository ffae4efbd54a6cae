"""The native index against a brute-force matcher written in plain Python."""

from __future__ import annotations

import gc
import os
import random
import time
from collections import Counter
from typing import get_args

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from isolated import assert_ok, run_script

from agspec.index.token_index import (
    ContinuationRule,
    IndexFormatError,
    IndexStateError,
    TokenIndex,
)


class BruteIndex:
    """Reference semantics: positions are tokens with a successor, in insertion order."""

    def __init__(self) -> None:
        self.docs: dict[int, list[int]] = {}
        self.order: list[tuple[int, int]] = []  # (doc_id, offset): the global clock

    def extend(self, doc_id: int, tokens: list[int]) -> None:
        doc = self.docs.setdefault(doc_id, [])
        for t in tokens:
            if doc:
                self.order.append((doc_id, len(doc) - 1))
            doc.append(t)

    def remove(self, doc_id: int) -> None:
        del self.docs[doc_id]
        self.order = [p for p in self.order if p[0] != doc_id]

    def ends(self, s: list[int]) -> list[tuple[int, int]]:
        """Occurrences of s with a successor, most recent first."""
        n = len(s)
        out = []
        for doc_id, off in reversed(self.order):
            doc = self.docs[doc_id]
            if off + 1 >= n and doc[off - n + 1 : off + 1] == s:
                out.append((doc_id, off))
        return out

    def match_length(self, fed: list[int], cap: int) -> int:
        for n in range(min(cap, len(fed)), 0, -1):
            if self.ends(fed[-n:]):
                return n
        return 0

    def continuation(self, fed: list[int], cap: int, k: int, rule: str, occ_max: int) -> list[int]:
        m = self.match_length(fed, cap)
        if m == 0:
            return []
        occ = self.ends(fed[-m:])
        if rule == "first":
            doc_id, off = occ[-1]
        elif rule == "recent":
            doc_id, off = occ[0]
        elif rule.startswith("recent"):  # recent2 .. recent8: the k-th most recent
            rank = int(rule[len("recent") :])
            if len(occ) < rank:
                return []
            doc_id, off = occ[rank - 1]
        elif rule == "vote":
            conts = [self.docs[d][o + 1 : o + 1 + k] for d, o in occ[:occ_max]]
            support = max(1, (len(conts) + 9) // 10)
            out: list[int] = []
            alive = list(range(len(conts)))
            for j in range(k):
                votes = [conts[i][j] for i in alive if len(conts[i]) > j]
                if not votes:
                    break
                counts = Counter(votes)
                top = max(counts.values())
                tok = next(t for t in votes if counts[t] == top)  # ties: most recent
                if top < support:
                    break
                out.append(tok)
                alive = [i for i in alive if len(conts[i]) > j and conts[i][j] == tok]
            return out
        else:
            occ = occ[:occ_max]
            keys = [tuple(self.docs[d][o + 1 : o + 4]) for d, o in occ]
            counts = Counter(keys)
            best = max(counts.values())
            doc_id, off = next(p for p, key in zip(occ, keys) if counts[key] == best)
        return self.docs[doc_id][off + 1 : off + 1 + k]


def check_cursor(ref: BruteIndex, cur, fed: list[int], cap: int) -> None:
    m = ref.match_length(fed, cap)
    assert cur.match_length == m
    expected_occ = ref.ends(fed[-m:])[:7] if m else []
    assert cur.occurrences(7) == expected_occ
    for rule in get_args(ContinuationRule):
        for occ_max in (1, 3, 32):
            assert cur.continuation(5, rule, max_occurrences=occ_max) == ref.continuation(
                fed, cap, 5, rule, occ_max
            ), (rule, occ_max)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.integers(0, 3), st.lists(st.integers(0, 2), max_size=12)),
        st.tuples(st.just("feed"), st.integers(0, 1), st.lists(st.integers(0, 2), max_size=6)),
        st.tuples(st.just("remove"), st.integers(0, 3), st.just([])),
    ),
    max_size=25,
)


def run_ops(op_list, alphabet_map, cap: int) -> None:
    idx, ref = TokenIndex(), BruteIndex()
    cursors = [idx.match(max_match_tokens=cap), idx.match(max_match_tokens=cap)]
    fed: list[list[int]] = [[], []]
    removed: set[int] = set()
    for kind, arg, toks in op_list:
        toks = [alphabet_map(t) for t in toks]
        if kind == "extend" and arg in removed:
            with pytest.raises(KeyError, match="removed"):
                idx.extend(arg, toks)
        elif kind == "extend":
            idx.extend(arg, toks)
            ref.extend(arg, toks)
        elif kind == "feed":
            cursors[arg].extend(toks)
            fed[arg].extend(toks)
        elif kind == "remove" and arg in ref.docs:
            idx.remove(arg)
            ref.remove(arg)
            removed.add(arg)
        for c, f in zip(cursors, fed):
            check_cursor(ref, c, f, cap)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.sampled_from([3, 64]))
def test_tiny_alphabet_matches_brute_force(op_list, cap):
    run_ops(op_list, lambda t: t, cap)


@settings(max_examples=100, deadline=None)
@given(ops)
def test_large_alphabet_ids_match_brute_force(op_list):
    # Same shapes with ids spread over a Qwen-sized vocabulary and beyond.
    run_ops(op_list, lambda t: [7, 151_643, 2**31 - 1][t], 64)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=60), min_size=1, max_size=12),
    st.lists(st.integers(0, 40), max_size=40),
)
def test_many_documents_and_interleaved_growth(docs, query):
    idx, ref = TokenIndex(), BruteIndex()
    cur = idx.match(max_match_tokens=16)
    fed: list[int] = []
    # Interleave: documents grow a few tokens at a time while the cursor is fed.
    for step in range(0, 60, 7):
        for d, toks in enumerate(docs):
            idx.extend(d, toks[step : step + 7])
            ref.extend(d, toks[step : step + 7])
        piece = query[step // 2 : step // 2 + 3]
        cur.extend(piece)
        fed.extend(piece)
        check_cursor(ref, cur, fed, 16)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 300), min_size=1, max_size=8),
    st.integers(0, 2**32 - 1),
)
def test_a_cursor_catches_up_with_hundreds_of_new_positions(growth, seed):
    """Between two reads of a cursor the index grows by 0-300 tokens (the history at batch
    64 grows ~240 a step): the cursor re-checks the new positions in blocks of 64 and a
    remainder (MatchCursor::sync), and must find the longest match the brute force does."""
    rng = random.Random(seed)
    idx, ref = TokenIndex(), BruteIndex()
    cur = idx.match(max_match_tokens=12)
    fed: list[int] = []
    for k in growth:
        toks = [rng.randrange(4) for _ in range(k)]
        doc = rng.randrange(3)
        idx.extend(doc, toks)
        ref.extend(doc, toks)
        piece = [rng.randrange(4) for _ in range(rng.randrange(1, 4))]
        cur.extend(piece)  # re-checks the k new positions, then steps
        fed.extend(piece)
        assert cur.match_length == ref.match_length(fed, 12)
    check_cursor(ref, cur, fed, 12)


def test_self_occurrence_at_document_end_never_counts():
    idx = TokenIndex()
    idx.extend(0, [1, 2, 3])
    cur = idx.match([1, 2, 3])
    # "1 2 3" ends the document: no continuation, so only "2 3"? no: nothing follows 3.
    assert cur.match_length == 0
    idx.extend(0, [9])  # now 3 has a successor
    assert cur.match_length == 3
    assert cur.continuation(4) == [9]


def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    idx, ref = TokenIndex(), BruteIndex()
    for d in range(5):
        toks = rng.integers(0, 6, size=200).astype(np.int32)
        idx.extend(d, toks)
        ref.extend(d, toks.tolist())
    idx.remove(2)
    ref.remove(2)
    path = tmp_path / "g.agidx"
    idx.save(path)
    loaded = TokenIndex.load(path)
    assert loaded.frozen and loaded.num_tokens == idx.num_tokens
    assert loaded.document_ids() == idx.document_ids()
    for _ in range(30):
        q = rng.integers(0, 6, size=12).tolist()
        check_cursor(ref, loaded.match(q, max_match_tokens=10), q, 10)
    with pytest.raises(ValueError, match="read-only"):
        loaded.extend(0, [1])


def test_a_save_clears_what_killed_saves_left_behind(tmp_path):
    """A save killed before its rename (kill -9) leaves PATH.tmp.<pid>.<n>; the next save
    to PATH removes those of processes that no longer run, untouched for ten minutes (on a
    shared file system the pid may be another host's), and nothing else."""
    child = os.fork()
    if child == 0:  # pragma: no cover
        os._exit(0)
    os.waitpid(child, 0)  # a pid that no longer runs
    path = tmp_path / "g.agidx"
    stale = tmp_path / f"g.agidx.tmp.{child}.3"
    live = tmp_path / f"g.agidx.tmp.{os.getpid()}.99"  # this process: may be a save in flight
    parent = tmp_path / f"g.agidx.tmp.{os.getppid()}.0"  # alive too
    other = [tmp_path / "g.agidx.tmp.x.1", tmp_path / f"h.agidx.tmp.{child}.0"]
    recent = tmp_path / f"g.agidx.tmp.{child}.5"  # just written: maybe another host's save
    hour_ago = time.time() - 3600
    for f in (stale, live, parent, recent, *other):
        f.write_bytes(b"partial")
        if f is not recent:
            os.utime(f, (hour_ago, hour_ago))
    (tmp_path / f"g.agidx.tmp.{child}.4").mkdir()  # not a file: stays
    idx = TokenIndex()
    idx.extend(0, [1, 2, 3])
    idx.save(path)
    assert not stale.exists()
    assert live.exists() and parent.exists() and recent.exists()
    assert all(f.exists() for f in other)
    assert (tmp_path / f"g.agidx.tmp.{child}.4").is_dir()
    assert TokenIndex.load(path).document(0) == [1, 2, 3]


def test_a_frozen_index_answers_as_before_and_takes_no_more_text():
    """freeze() makes an index read-only; its remembered "frequent" answers (kept only
    for a frozen index) are the ones an unfrozen twin computes afresh."""
    rng = np.random.default_rng(3)
    idx, twin = TokenIndex(), TokenIndex()
    for d in range(6):
        toks = rng.integers(0, 5, size=300).astype(np.int32)
        idx.extend(d, toks)
        twin.extend(d, toks)
    idx.freeze()
    assert idx.frozen and not twin.frozen
    for _ in range(3):  # the second and third rounds are answered from memory
        for q in (rng.integers(0, 5, size=8).tolist() for _ in range(40)):
            a, b = idx.match(q, max_match_tokens=6), twin.match(q, max_match_tokens=6)
            for occ in (1, 8, 32):
                assert a.continuation(5, "frequent", max_occurrences=occ) == b.continuation(
                    5, "frequent", max_occurrences=occ
                )
    with pytest.raises(ValueError, match="read-only"):
        idx.extend(0, [1])
    with pytest.raises(ValueError, match="read-only"):
        idx.remove(0)
    idx.freeze()  # idempotent


def test_a_frozen_index_picks_frequent_occurrences_as_the_brute_force_rule(tmp_path):
    """A frozen index answers the 32-occurrence "frequent" rule from picks built for every
    state at freeze (and again at load); those equal the brute-force rule, for a built and
    a loaded index, on text whose suffix-link tree is deeper than the walk goes (a run of
    one token 6000 long: below 4096 levels the states stay on the lazy path)."""
    rng = np.random.default_rng(11)
    docs = [rng.integers(0, 4, size=400).tolist() for _ in range(5)]
    docs.append([7] * 6000 + [1, 7, 7, 2] * 50)
    idx, ref = TokenIndex(), BruteIndex()
    for d, toks in enumerate(docs):
        idx.extend(d, toks)
        ref.extend(d, toks)
    idx.freeze()
    path = tmp_path / "g.agidx"
    idx.save(path)
    loaded = TokenIndex.load(path)
    queries = [rng.integers(0, 4, size=10).tolist() for _ in range(60)]
    queries += [[7] * n for n in (1, 2, 40, 63)] + [[7] * 20 + [1, 7, 7], [2, 7, 7]]
    for q in queries:
        want = ref.continuation(q, 64, 6, "frequent", 32)
        for index in (idx, loaded):
            assert (
                index.match(q, max_match_tokens=64).continuation(6, "frequent", max_occurrences=32)
                == want
            ), q
    # Matches deeper than the walk (4096 levels) answer from the lazy path, the same way.
    for n in (4095, 4097, 5000):
        q = [7] * n
        want = ref.continuation(q, 6000, 6, "frequent", 32)
        for index in (idx, loaded):
            assert (
                index.match(q, max_match_tokens=6000).continuation(
                    6, "frequent", max_occurrences=32
                )
                == want
            ), n


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: b[: len(b) // 2], "truncated"),
        (lambda b: b"NOTANIDX" + b[8:], "bad magic"),
        (lambda b: b[:40] + bytes([b[40] ^ 0xFF]) + b[41:], "checksum"),
        (lambda b: b[:8] + (7).to_bytes(4, "little") + b[12:], "version 7"),
        (lambda b: b[:10], "too short"),
    ],
)
def test_bad_index_files_are_clear_errors(tmp_path, mutate, message):
    idx = TokenIndex()
    idx.extend(0, list(range(50)) * 2)
    good = tmp_path / "good.agidx"
    idx.save(good)
    bad = tmp_path / "bad.agidx"
    bad.write_bytes(mutate(good.read_bytes()))
    with pytest.raises(IndexFormatError, match=message):
        TokenIndex.load(bad)
    with pytest.raises(FileNotFoundError):
        TokenIndex.load(tmp_path / "missing.agidx")


def test_bad_input_is_a_clear_error_and_changes_nothing():
    idx = TokenIndex()
    idx.extend(0, [1, 2, 3])
    with pytest.raises(TypeError, match="int32"):
        idx.extend(0, np.array([1, 2], dtype=np.int64))
    with pytest.raises(TypeError, match="int32"):
        idx.extend(0, np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="1-D"):
        idx.extend(0, np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(ValueError, match=">= 0"):
        idx.extend(0, np.array([4, -1], dtype=np.int32))
    with pytest.raises(ValueError):
        idx.extend(0, [5, -3])
    with pytest.raises(ValueError, match="doc_id"):
        idx.extend(-1, [1])
    with pytest.raises(TypeError):
        idx.extend(0, "abc")  # type: ignore[arg-type]
    assert idx.document(0) == [1, 2, 3]  # nothing was appended by the failed calls
    with pytest.raises(KeyError, match="no document 5"):
        idx.remove(5)
    with pytest.raises(KeyError):
        idx.document(5)
    idx.remove(0)
    with pytest.raises(KeyError, match="removed"):
        idx.extend(0, [1])
    cur = idx.match([1, 2])
    with pytest.raises(ValueError):
        cur.continuation(-1)
    with pytest.raises(ValueError, match="rule"):
        cur.continuation(3, "latest")  # type: ignore[arg-type]


def test_cursor_after_index_closed_raises():
    idx = TokenIndex()
    idx.extend(0, [1, 2, 3, 1, 2])
    cur = idx.match([1, 2])
    assert cur.match_length == 2
    idx.close()
    with pytest.raises(IndexStateError, match="closed"):
        cur.match_length  # noqa: B018
    with pytest.raises(IndexStateError):
        cur.extend([1])
    with pytest.raises(IndexStateError):
        idx.extend(0, [1])


def test_num_bytes_grows_with_content():
    idx = TokenIndex()
    before = idx.num_bytes()
    idx.extend(0, np.arange(10_000, dtype=np.int32) % 97)
    assert idx.num_bytes() > before + 10_000 * 4


@pytest.mark.skipif(os.cpu_count() is None, reason="needs threads")
def test_long_extend_releases_the_gil():
    import threading
    import time

    idx = TokenIndex()
    toks = (np.arange(3_000_000, dtype=np.int64) * 7919 % 50_000).astype(np.int32)
    ticks = []
    t = threading.Thread(target=idx.extend, args=(0, toks))
    t.start()
    while t.is_alive():
        ticks.append(time.perf_counter())
        time.sleep(0.005)
    t.join()
    assert idx.num_tokens == toks.size
    assert len(ticks) >= 3  # the main thread ran while the build was going on


def _advised_huge_kb() -> int:
    """kB of this process's mappings advised for 2 MB pages (VmFlags "hg")."""
    total, size = 0, 0
    with open("/proc/self/smaps") as f:
        for line in f:
            if line.startswith("Size:"):
                size = int(line.split()[1])
            elif line.startswith("VmFlags:") and "hg" in line.split()[1:]:
                total += size
    return total


@pytest.mark.skipif(
    not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"),
    reason="needs Linux with transparent huge pages",
)
@pytest.mark.skipif(os.environ.get("AGSPEC_LARGE_PAGES") == "0", reason="AGSPEC_LARGE_PAGES=0")
def test_a_large_index_lives_on_memory_advised_for_large_pages():
    # A brute-force oracle over numpy for the queries (the per-token BruteIndex is too slow
    # at this size), so the arrays that take the large-page allocation answer as before.
    # The advice is counted in a child interpreter: in this one, memory that earlier tests
    # advised and freed can be handed to the new arrays and would not count as new. There,
    # the new index's state array alone (room for 800,000 states, 35 MB) adds more than the
    # bound.
    grown_kb = assert_ok(
        run_script("""
        import numpy as np
        from agspec.index.token_index import TokenIndex
        from test_token_index import _advised_huge_kb
        doc = np.random.default_rng(7).integers(0, 4, 400_000).astype(np.int32)
        before = _advised_huge_kb()
        idx = TokenIndex()
        idx.extend(0, doc)
        print(_advised_huge_kb() - before)
    """)
    )
    assert int(grown_kb.split()[-1]) >= 16 * 1024, grown_kb
    rng = np.random.default_rng(7)
    doc = rng.integers(0, 4, 400_000).astype(np.int32)
    gc.collect()
    idx = TokenIndex()
    idx.extend(0, doc)
    for q in range(20):
        fed = rng.integers(0, 4, 12).astype(np.int32).tolist()
        cur = idx.match(max_match_tokens=10)
        cur.extend(fed)
        m = 0
        for n in range(10, 0, -1):
            # End offsets e < len - 1 (a successor) where doc[e-n+1 : e+1] == fed[-n:].
            win = np.lib.stride_tricks.sliding_window_view(doc[:-1], n)
            hits = np.flatnonzero((win == np.asarray(fed[-n:], dtype=np.int32)).all(axis=1))
            if hits.size:
                m = n
                ends = hits[::-1][:3] + n - 1  # the three most recent
                break
        assert cur.match_length == m, q
        for k, rule in enumerate(("recent", "recent2", "recent3")):
            expected = doc[ends[k] + 1 : ends[k] + 9].tolist() if m and k < len(ends) else []
            assert cur.continuation(8, rule) == expected, (q, rule)
    idx.close()
