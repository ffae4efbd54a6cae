"""The native index under threads: close/document/save/cursor calls racing a long extend,
save or remove, and cursor sets stepping while another thread holds an index for writing
(held on an event through TokenIndex.hold_for_writing, so the writer is known to be inside
when the step runs). Each scenario runs in a subprocess: a crash or a hang is a failed
test, not a dead test run."""

from __future__ import annotations

import pytest
from isolated import assert_ok, run_script

# --------------------------------------------------------------------------- threads
THREAD_PRELUDE = """
import threading, time
import numpy as np
from agspec.index.token_index import IndexStateError, TokenIndex

def big(n, seed=0):
    return (np.arange(n, dtype=np.int64) * 7919 % 50_000 + seed).astype(np.int32)

def in_thread(fn, *args):
    box = {}
    def run():
        box["started"] = True
        try:
            box["result"] = fn(*args)
        except Exception as exc:  # reported by the caller
            box["error"] = exc
    t = threading.Thread(target=run)
    t.start()
    return t, box

def held_writer(idx):
    # A writer known to be inside idx from busy.is_set() until release.set(): the thread
    # holds the index for writing (TokenIndex.hold_for_writing) while it waits on an event.
    busy, release = threading.Event(), threading.Event()
    def hold():
        busy.set()
        release.wait()
    t, box = in_thread(idx._native.hold_for_writing, hold)
    busy.wait()
    return t, box, release

def wait_busy(t, box, probe, at_most_s=0.2):
    # Until the long call has started and a probe call is refused (the long call holds
    # the index), or at_most_s more.
    while "started" not in box:
        time.sleep(0.001)
    deadline = time.monotonic() + at_most_s
    while t.is_alive() and time.monotonic() < deadline:
        try:
            probe()
        except IndexStateError:
            return True
    return False
"""


@pytest.mark.parametrize("long_call", ["extend", "save", "remove"])
def test_close_during_a_long_call_is_safe(long_call):
    proc = run_script(
        prelude=THREAD_PRELUDE,
        code=f"""
        import tempfile, os
        idx = TokenIndex()
        idx.extend(0, big(1_500_000))
        idx.extend(1, big(1_000_000, seed=3))
        cur = idx.match([1, 2, 3])
        path = os.path.join(tempfile.mkdtemp(), "x.agidx")
        more = big(2_000_000, seed=5)
        call = {{"extend": lambda: idx.extend(2, more),
                 "save": lambda: idx.save(path),
                 "remove": lambda: idx.remove(1)}}[{long_call!r}]
        t, box = in_thread(call)
        wait_busy(t, box, lambda: idx.extend(9, []))  # a writer: refused by every long call
        idx.close()
        assert idx.closed
        for probe in (lambda: idx.num_tokens, lambda: cur.match_length,
                      lambda: cur.extend_one(1), lambda: idx.extend(3, [1])):
            try:
                probe()
                raise AssertionError("a call after close() succeeded")
            except IndexStateError:
                pass
        t.join()
        assert "error" not in box, box   # the running call finished normally
        if {long_call!r} == "save":
            assert TokenIndex.load(path).num_tokens == 2_500_000
        print("OK")
        """,
    )
    assert "OK" in assert_ok(proc)


def test_document_and_cursor_calls_during_a_long_extend():
    """While a writer is inside (held on an event, so known to be inside), every reader
    call, the index's and a cursor's, is refused with IndexStateError, and once it has
    left every one answers; during a real long extend, a call either is refused or sees
    the document whole before or after the extend, never a part of it."""
    proc = run_script(
        prelude=THREAD_PRELUDE,
        code="""
        idx = TokenIndex()
        first = big(1000).tolist()
        idx.extend(0, first)
        cur = idx.match(first[:20])
        calls = {
            "document": lambda: idx.document(0),
            "document_ids": lambda: idx.document_ids(),
            "num_positions": lambda: idx.num_positions,
            "contains": lambda: 0 in idx,
            "num_bytes": lambda: idx.num_bytes(),
            "cursor.extend_one": lambda: cur.extend_one(7),
            "cursor.continuation": lambda: cur.continuation(16),
            "cursor.continuation vote": lambda: cur.continuation(16, "vote"),
            "cursor.occurrences": lambda: cur.occurrences(8),
        }
        t, box, release = held_writer(idx)
        answered = []
        for name, call in calls.items():
            try:
                call()
                answered.append(name)
            except IndexStateError:
                pass
        release.set()
        t.join()
        assert "error" not in box, box
        assert answered == [], f"answered while a writer was inside: {answered}"
        for call in calls.values():
            call()  # the writer has left: no refusal
        assert idx.document(0) == first

        # A real long extend: whatever overlaps it is refused or sees a whole document.
        more = big(2_500_000, seed=1)
        final = first + more.tolist()
        t, box = in_thread(idx.extend, 0, more)
        while t.is_alive():
            try:
                doc = idx.document(0)
                assert doc == final[: len(doc)] and len(doc) in (1000, len(final))
                for call in calls.values():
                    call()
            except IndexStateError:
                pass
        t.join()
        assert "error" not in box, box
        assert idx.document(0) == final
        print("OK")
        """,
    )
    assert "OK" in assert_ok(proc)


def test_save_while_another_thread_makes_small_extends():
    """Every saved file loads and holds a state the index really had."""
    proc = run_script(
        prelude=THREAD_PRELUDE,
        code="""
        import os, tempfile
        tmp = tempfile.mkdtemp()
        idx = TokenIndex()
        idx.extend(0, big(1_000_000))  # each save takes well over the 10 ms a call waits
        # Four saves at least, and more until an extend was refused during one (the
        # event, not the machine's speed, says when the scenario has happened).
        paths, overlapped = [], threading.Event()
        def saves():
            while len(paths) < 4 or not overlapped.is_set():
                assert len(paths) < 50, "no extend overlapped 50 saves"
                paths.append(os.path.join(tmp, f"s{len(paths)}.agidx"))
                idx.save(paths[-1])
        t, box = in_thread(saves)
        extended, refused = [], 0
        i = 0
        while t.is_alive():
            chunk = [(i * 31 + k) % 97 for k in range(50)]
            try:
                idx.extend(1, chunk)
                extended.extend(chunk)
            except IndexStateError:
                refused += 1
                overlapped.set()
            i += 1
        t.join()
        assert "error" not in box, box
        if extended:
            assert idx.document(1) == extended
        for p in paths:
            loaded = TokenIndex.load(p)   # verified: the file is whole and consistent
            doc1 = loaded.document(1) if 1 in loaded else []
            assert doc1 == extended[: len(doc1)], "a save mixed two states"
            assert len(doc1) % 50 == 0
            assert loaded.document(0) == idx.document(0)
        assert refused > 0, "no extend overlapped a save"
        print("OK", len(extended), refused)
        """,
    )
    assert "OK" in assert_ok(proc)


def test_two_threads_saving_to_one_path_leave_a_whole_file(tmp_path):
    proc = run_script(
        prelude=THREAD_PRELUDE,
        code=f"""
        import os
        path = {str(tmp_path / "same.agidx")!r}
        idx = TokenIndex()
        idx.extend(0, big(800_000))
        a, box_a = in_thread(lambda: [idx.save(path) for _ in range(3)])
        b, box_b = in_thread(lambda: [idx.save(path) for _ in range(3)])
        a.join(); b.join()
        assert "error" not in box_a and "error" not in box_b, (box_a, box_b)
        assert TokenIndex.load(path).num_tokens == 800_000
        leftovers = [n for n in os.listdir(os.path.dirname(path)) if n != "same.agidx"]
        assert leftovers == [], leftovers
        print("OK")
        """,
    )
    assert "OK" in assert_ok(proc)


def test_cursor_calls_during_a_long_remove_and_save():
    proc = run_script(
        prelude=THREAD_PRELUDE,
        code="""
        import os, tempfile
        idx = TokenIndex()
        idx.extend(0, big(1_000_000))
        idx.extend(1, big(1_000_000, seed=2))
        cur = idx.match([5, 6, 7])
        path = os.path.join(tempfile.mkdtemp(), "x.agidx")
        for call in (lambda: idx.remove(0), lambda: idx.save(path)):
            t, box = in_thread(call)
            while t.is_alive():
                try:
                    cur.extend_one(3)
                    cur.continuation(32)
                    cur.occurrences(4)
                    cur.match_length
                except IndexStateError:
                    pass
            t.join()
            assert "error" not in box, box
        assert idx.document_ids() == [1]
        print("OK")
        """,
    )
    assert "OK" in assert_ok(proc)


def test_cursor_sets_over_a_closed_or_busy_index_raise_instead_of_crashing():
    """The batched cursor path (agspec.corpora.corpus_set) inherits the same guards."""
    proc = run_script(
        prelude=THREAD_PRELUDE,
        code="""
        from agspec import _native
        idx = TokenIndex()
        idx.extend(0, big(1_000_000))
        live = TokenIndex()
        live.extend(1, [1, 2, 3])
        s = _native.CursorSet()
        s.add_cursor(idx._native, 16, [1, 2, 3])
        s.add_append(live._native, 1)
        t, box = in_thread(idx.extend, 2, big(1_500_000, seed=4))
        while "started" not in box:
            time.sleep(0.001)
        refused = 0
        while t.is_alive():
            try:
                s.match_lengths()
                s.continuation(0, 8, _native.ContinuationRule.frequent, 32)
            except IndexStateError:
                refused += 1
        t.join()
        assert "error" not in box, box
        idx.close()
        live.close()
        for call in (s.match_lengths, lambda: s.advance([4]),
                     lambda: s.continuation(0, 8, _native.ContinuationRule.first, 32)):
            try:
                call()
                raise AssertionError("a call after close() succeeded")
            except IndexStateError:
                pass
        print("OK", refused)
        """,
    )
    assert "OK" in assert_ok(proc)


def test_a_cursor_set_steps_through_a_long_writer_without_failing():
    """A request's step while another thread holds its session index for writing (a long
    prompt entering it) neither raises nor loses tokens: the busy corpus matches nothing
    meanwhile, its cursor catches up after, and its document gets the step's tokens in
    order at the next step. The oracle: a cursor fed the same tokens on a quiet index."""
    proc = run_script(
        prelude=THREAD_PRELUDE,
        code="""
        from agspec.corpora.corpus_set import CorpusSet
        session, other = TokenIndex(), TokenIndex()
        session.extend(0, [5, 6, 7, 8, 9])
        other.extend(0, [1, 2, 3, 4])
        cs = CorpusSet([("session", session, "first"), ("other", other, "first")], [5, 6],
                       appends=[(session, 1)])
        assert cs.match_lengths() == [2, 0]
        t, box, release = held_writer(session)
        cs.advance([7])                          # the session index is busy: no error
        during = cs.match_lengths()
        assert during == [0, 0] and cs.continuation(0, 4) == [], during
        release.set()
        t.join()
        assert "error" not in box, box
        cs.advance([1, 2])                       # catches up, then appends [7] and [1, 2]
        assert session.document(1) == [7, 1, 2]
        oracle = session.match([5, 6, 7, 1, 2])
        assert cs.match_lengths() == [oracle.match_length, 2], cs.match_lengths()
        assert cs.continuation(1, 4) == [3, 4]
        # A document still busy at its last advance gets one more try at close().
        t, box, release = held_writer(session)
        cs.advance([3])                          # busy: [3] waits
        release.set()
        t.join()
        cs.close()
        assert session.document(1) == [7, 1, 2, 3], session.document(1)
        print("OK", during)
        """,
    )
    assert "OK" in assert_ok(proc)


def test_a_large_batch_steps_through_a_long_writer_without_failing():
    """The same with 20 requests stepped in batches (past the size from which the native
    calls take one read per index for the batch and share the work with helper threads):
    no error while another thread writes the session index, and afterwards every match
    and document as on a quiet index."""
    proc = run_script(
        prelude=THREAD_PRELUDE,
        code="""
        from agspec import _native
        from agspec.corpora.corpus_set import (
            CorpusSet, advance_batch, match_lengths_batch, continuation_batch)
        _native.set_batch_threads(2)
        session, other = TokenIndex(), TokenIndex()
        session.extend(0, [5, 6, 7, 8, 9])
        other.extend(0, [1, 2, 3, 4])
        sets = [CorpusSet([("session", session, "first"), ("other", other, "first")], [5, 6],
                          appends=[(session, 1 + i)]) for i in range(20)]
        assert match_lengths_batch(sets) == [[2, 0]] * 20
        t, box, release = held_writer(session)
        advance_batch(sets, [[7]] * 20)          # the session index is busy: no error
        during = match_lengths_batch(sets)
        assert during == [[0, 0]] * 20, during
        assert continuation_batch(sets, [0] * 20, [4] * 20) == [[]] * 20
        release.set()
        t.join()
        assert "error" not in box, box
        advance_batch(sets, [[1, 2]] * 20)       # catch up, then [7] and [1, 2] appended
        assert all(session.document(1 + i) == [7, 1, 2] for i in range(20))
        oracle = session.match([5, 6, 7, 1, 2])
        assert match_lengths_batch(sets) == [[oracle.match_length, 2]] * 20
        assert continuation_batch(sets, [1] * 20, [4] * 20) == [[3, 4]] * 20
        print("OK", during[0])
        """,
    )
    assert "OK" in assert_ok(proc)
