"""The native index's files (cpp/index/token_index_io.cc) and argument checks: hostile
files, structurally edited and given a valid checksum (named cases and a seeded fuzz over
random edits: `python tests/index/test_token_index_io.py fuzz ...`), and out-of-range sizes.

Everything that could crash or hang the interpreter on a broken build runs in a
subprocess, so a segfault or a spin is a failed test, not a dead test run. The threads
scenarios are in test_token_index_threads.py.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from index_file import EMPTY_KEY, STATE_FIELDS, F, IndexFile
from isolated import assert_ok, child_env, run_script

from agspec.index.token_index import IndexFormatError, TokenIndex

HERE = Path(__file__).resolve()


def saved_bytes(idx: TokenIndex, tmp: Path) -> bytes:
    path = tmp / "base.agidx"
    idx.save(path)
    return path.read_bytes()


def base_indexes() -> list[TokenIndex]:
    """Small indexes of different shapes (removed and empty documents, big tables)."""
    rng = random.Random(7)
    out = []
    for alphabet, sizes, removes in [
        (2, [30], []),
        (3, [12, 9, 15], []),
        (50, [40, 40], []),
        (4, [20, 1, 0, 25], [1]),
        (5, [300], []),
        (3, [60, 60, 60], [0]),
        (1000, [80], []),
    ]:
        idx = TokenIndex()
        for d, n in enumerate(sizes):
            idx.extend(d, [rng.randrange(alphabet) for _ in range(n)])
        for d in removes:
            idx.remove(d)
        if len(out) % 2:
            idx.freeze()  # its file carries the frequent picks
        out.append(idx)
    return out


def query_everything(idx: TokenIndex, rng: random.Random) -> int:
    """Runs every query on a loaded index; returns a digest so nothing is optimized out."""
    digest = len(idx.document_ids()) + idx.num_tokens + idx.num_positions + idx.num_bytes()
    alphabet = 2
    for doc_id in idx.document_ids():
        toks = idx.document(doc_id)
        alphabet = max([alphabet, *[t + 1 for t in toks]])
        for cap in (1, 4, 64):
            cur = idx.match(toks[: rng.randint(0, len(toks))], max_match_tokens=cap)
            digest += cur.match_length + len(cur.occurrences(64))
            for rule in ("frequent", "first", "recent", "vote", "recent2", "recent8"):
                digest += len(cur.continuation(32, rule, max_occurrences=64))
    cur = idx.match([])
    for _ in range(40):
        cur.extend_one(rng.randrange(min(alphabet, 2**31 - 1)))
        digest += cur.match_length + len(cur.continuation(8)) + len(cur.occurrences(8))
        digest += len(cur.continuation(8, "vote"))
    return digest


# ------------------------------------------------------------------------- mutations
def _rand_value(rng: random.Random, n: int) -> int:
    return rng.choice([-2, -1, 0, 1, n - 1, n, n + 1, rng.randrange(max(n, 1)), 2**31 - 1])


def _set_state_field(f: IndexFile, rng: random.Random) -> None:
    if len(f.states):
        s = rng.randrange(len(f.states))
        name = rng.choice(STATE_FIELDS)
        n = len(f.states) if name not in ("own_head", "first_pos", "last_pos") else len(f.pos_doc)
        v = _rand_value(rng, n) if rng.random() < 0.8 else int(f.states[s, F["len"]]) + 1
        f.states[s, F[name]] = v


def _link_cycle(f: IndexFile, rng: random.Random) -> None:
    if len(f.states) >= 3:
        a, b = rng.sample(range(1, len(f.states)), 2)
        f.states[a, F["link"]], f.states[b, F["link"]] = b, a


def _link_to_longer(f: IndexFile, rng: random.Random) -> None:
    if len(f.states) >= 2:
        s = rng.randrange(1, len(f.states))
        f.states[s, F["link"]] = int(np.argmax(f.states[:, F["len"]]))


def _link_minus_one(f: IndexFile, rng: random.Random) -> None:
    if len(f.states) >= 2:
        f.states[rng.randrange(1, len(f.states)), F["link"]] = -1


def _transition_to_root(f: IndexFile, rng: random.Random) -> None:
    has = np.flatnonzero(f.states[:, F["in_tok"]] >= 0)
    if len(has) and rng.random() < 0.6:
        f.states[rng.choice(has.tolist()), F["in_tgt"]] = 0
    elif len(f.vals):
        occupied = np.flatnonzero(f.keys != EMPTY_KEY)
        if len(occupied):
            f.vals[rng.choice(occupied.tolist())] = 0


def _transition_back(f: IndexFile, rng: random.Random) -> None:
    """A transition to a state no longer than its source (a loop the cursor could spin in)."""
    has = np.flatnonzero(f.states[:, F["in_tok"]] >= 0)
    if len(has):
        s = rng.choice(has.tolist())
        f.states[s, F["in_tgt"]] = rng.choice([s, int(f.states[s, F["link"]]), 0])


def _empty_positions(f: IndexFile, rng: random.Random) -> None:
    f.pos_doc = f.pos_doc[:0]
    f.pos_off = f.pos_off[:0]
    f.own_next = f.own_next[:0]
    if rng.random() < 0.5:
        f.states[:, F["own_head"]] = -1
        f.states[:, F["first_pos"]] = 0
        f.states[:, F["last_pos"]] = 0


def _full_table(f: IndexFile, rng: random.Random, *, keep_count: bool = False) -> None:
    """No free slot left: a lookup of a missing key would probe forever."""
    ns = max(len(f.states), 1)
    free = np.flatnonzero(f.keys == EMPTY_KEY)
    for i in free.tolist():
        f.keys[i] = (rng.randrange(ns) << 32) | rng.randrange(1 << 20)
        f.vals[i] = rng.randrange(ns)
    if not keep_count and rng.random() < 0.7:
        f.edges_size = len(f.keys)


def _table_entry(f: IndexFile, rng: random.Random) -> None:
    if len(f.keys):
        i = rng.randrange(len(f.keys))
        if rng.random() < 0.5:
            f.keys[i] = (rng.randrange(len(f.states) + 2) << 32) | rng.randrange(1 << 32)
        else:
            f.vals[i] = _rand_value(rng, len(f.states))
        if rng.random() < 0.3:
            f.edges_size = int(np.count_nonzero(f.keys != EMPTY_KEY))


def _array_entry(f: IndexFile, rng: random.Random) -> None:
    name = rng.choice(["edge_next", "own_next", "edge_token", "pos_doc", "pos_off"])
    arr = getattr(f, name)
    if len(arr):
        n = {"edge_next": len(f.edge_next), "own_next": len(f.pos_doc),
             "pos_doc": len(f.docs)}.get(name, 50)  # fmt: skip
        v = _rand_value(rng, n)
        if arr.dtype == np.uint32:
            v &= 0xFFFFFFFF
        arr[rng.randrange(len(arr))] = v


def _array_length(f: IndexFile, rng: random.Random) -> None:
    name = rng.choice(["states", "edge_next", "own_next", "edge_token", "pos_doc", "pos_off",
                       "keys", "vals"])  # fmt: skip
    arr = getattr(f, name)
    if rng.random() < 0.5 and len(arr):
        setattr(f, name, arr[: rng.randrange(len(arr))])
    else:
        setattr(f, name, np.concatenate([arr, arr[-1:]]) if len(arr) else arr)


def _swap_states(f: IndexFile, rng: random.Random) -> None:
    if len(f.states) >= 3:
        a, b = rng.sample(range(1, len(f.states)), 2)
        f.states[[a, b]] = f.states[[b, a]]


def _doc_field(f: IndexFile, rng: random.Random) -> None:
    if not f.docs:
        return
    d = rng.choice(f.docs)
    what = rng.randrange(6)
    if what == 0:
        d.id = rng.choice([-1, f.docs[0].id, 2**63 - 1])
    elif what == 1:
        d.removed ^= 1
    elif what == 2:
        d.last_state = _rand_value(rng, len(f.states))
    elif what == 3 and len(d.tokens):
        d.tokens[rng.randrange(len(d.tokens))] = rng.choice([-1, 0, 7, 2**31 - 1])
    elif what == 4:
        d.tokens = d.tokens[: rng.randrange(len(d.tokens) + 1)]
    else:
        d.tokens = np.concatenate([d.tokens, np.array([3], np.int32)])


def _epoch(f: IndexFile, rng: random.Random) -> None:
    f.epoch = rng.randrange(1 << 64)


def _pick_entry(f: IndexFile, rng: random.Random) -> None:
    if len(f.picks):
        f.picks[rng.randrange(len(f.picks))] = _rand_value(rng, len(f.pos_doc)) & 0xFFFFFFFF
    elif rng.random() < 0.5:
        f.pick_occurrences = rng.choice([1, 32, 2**63])


MUTATIONS = [
    _set_state_field, _set_state_field, _set_state_field, _link_cycle, _link_to_longer,
    _link_minus_one, _transition_to_root, _transition_back, _empty_positions, _full_table,
    _table_entry, _array_entry, _array_entry, _array_length, _swap_states, _doc_field,
    _doc_field, _epoch, _pick_entry,
]  # fmt: skip


def fuzz_case(bases: list[IndexFile], seed: int, case: int) -> bytes:
    rng = random.Random(seed * 1_000_003 + case)
    f = IndexFile.parse(bases[rng.randrange(len(bases))].to_bytes())  # a fresh copy
    for _ in range(rng.choice([1, 1, 2, 3])):
        rng.choice(MUTATIONS)(f, rng)
    return f.to_bytes()


def fuzz_worker(seed: int, start: int, stop: int, tmp: Path) -> None:
    """Loads and queries cases start..stop-1, one line per case on stdout.

    A case that takes over 5 s makes faulthandler end the process: the parent sees a
    case that started and never finished, and counts it as a hang.
    """
    import faulthandler

    bases = [IndexFile.parse(saved_bytes(idx, tmp)) for idx in base_indexes()]
    path = tmp / "case.agidx"
    for case in range(start, stop):
        print(f"start {case}", flush=True)
        faulthandler.dump_traceback_later(5, exit=True)
        path.write_bytes(fuzz_case(bases, seed, case))
        try:
            idx = TokenIndex.load(path)
        except IndexFormatError:
            verdict = "rejected"
        else:
            query_everything(idx, random.Random(case))
            idx.verify()
            verdict = "loaded"
        faulthandler.cancel_dump_traceback_later()
        print(f"done {case} {verdict}", flush=True)


def run_fuzz(seed: int, num_cases: int, tmp: Path, max_failures: int = 10) -> dict:
    """Runs the worker in subprocesses, restarting after a crash or hang; counts them all."""
    counts = {"rejected": 0, "loaded": 0}
    failures: list[str] = []
    start = 0
    while start < num_cases and len(failures) < max_failures:
        cmd = [sys.executable, str(HERE), "fuzz", str(seed), str(start), str(num_cases), str(tmp)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=child_env())
            out, rc = proc.stdout, proc.returncode
            err = proc.stderr
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            rc, err = None, "timeout"
        last_started = start - 1
        for line in out.splitlines():
            word, case, *rest = line.split()
            if word == "start":
                last_started = int(case)
            elif word == "done":
                counts[rest[0]] += 1
        if rc == 0:
            break
        failures.append(f"case {last_started}: exit {rc}: {err.strip().splitlines()[-3:]}")
        start = last_started + 1
    counts["failures"] = failures
    return counts


# ------------------------------------------------------------------------ hostile files
def _edited(tmp_path: Path, base: int, edit) -> Path:
    f = IndexFile.parse(saved_bytes(base_indexes()[base], tmp_path))
    edit(f)
    path = tmp_path / "edited.agidx"
    path.write_bytes(f.to_bytes())
    return path


def _cycle(f: IndexFile) -> None:
    # Two states of one chain link to each other: a link walk would never reach the root.
    s = int(np.argmax(f.states[:, F["len"]]))
    t = int(f.states[s, F["link"]])
    f.states[t, F["link"]] = s


NAMED_EDITS = {
    "suffix-link cycle": (0, _cycle),
    "link -1": (0, lambda f: f.states.__setitem__((len(f.states) - 1, F["link"]), -1)),
    "transition back to the root": (
        0,
        lambda f: f.states.__setitem__((0, F["in_tgt"]), 0),
    ),  # fmt: skip
    "transition to a shorter state": (
        4,
        lambda f: f.states.__setitem__(
            (int(np.argmax(f.states[:, F["len"]])) // 2, F["in_tgt"]), 1
        ),
    ),  # fmt: skip
    "empty position table": (0, lambda f: _empty_positions(f, random.Random(1))),
    "full transition table": (4, lambda f: _full_table(f, random.Random(1), keep_count=True)),
    "position chain cycle": (2, lambda f: f.own_next.__setitem__(5, 5)),
    "frequent pick out of range": (1, lambda f: f.picks.__setitem__(1, len(f.pos_doc))),
    "frequent picks for another number of states": (
        1,
        lambda f: setattr(f, "picks", f.picks[:-1]),
    ),  # fmt: skip
    "child list cycle": (
        4,
        lambda f: f.states.__setitem__(
            (int(f.states[0, F["first_child"]]), F["next_sib"]), int(f.states[0, F["first_child"]])
        ),
    ),  # fmt: skip
}


def test_the_file_helpers_round_trip(tmp_path):
    """The Python mirror of the format reproduces a saved file byte for byte."""
    for idx in base_indexes():
        data = saved_bytes(idx, tmp_path)
        assert IndexFile.parse(data).to_bytes() == data


def test_a_version_4_file_loads_and_builds_its_frequent_picks(tmp_path):
    """A file of the format before the picks (version 4) loads, and answers "frequent" as
    the index it was saved from; a version 5 file of a frozen index holds one pick per
    state, each a position."""
    idx = base_indexes()[1]
    assert idx.frozen
    f = IndexFile.parse(saved_bytes(idx, tmp_path))
    assert f.pick_occurrences == 32 and len(f.picks) == len(f.states)
    assert int(f.picks[1:].max()) < len(f.pos_doc)
    path = tmp_path / "v4.agidx"
    path.write_bytes(f.to_bytes(version=4))
    old = TokenIndex.load(path)
    for doc_id in idx.document_ids():
        toks = idx.document(doc_id)
        for end in range(1, len(toks)):
            q = toks[max(0, end - 6) : end]
            assert old.match(q).continuation(8, "frequent", max_occurrences=32) == idx.match(
                q
            ).continuation(8, "frequent", max_occurrences=32)


@pytest.mark.parametrize("name", sorted(NAMED_EDITS))
def test_a_structurally_edited_file_with_a_valid_checksum_is_refused(tmp_path, name):
    base, edit = NAMED_EDITS[name]
    path = _edited(tmp_path, base, edit)
    proc = run_script(
        f"""
        import random
        from agspec.index.token_index import IndexFormatError, TokenIndex
        from test_token_index_io import query_everything
        try:
            idx = TokenIndex.load({str(path)!r})
        except IndexFormatError as exc:
            print("refused:", exc)
        else:
            query_everything(idx, random.Random(0))
            print("loaded and answered")
        """,
        timeout=30,
    )
    out = assert_ok(proc)
    assert "refused:" in out and "is corrupt" in out, out


def test_fuzz_load_over_edited_files_with_valid_checksums(tmp_path):
    """At least 1,000 random structural edits: each refused, or loaded and answered."""
    num_cases = int(os.environ.get("AGSPEC_FUZZ_CASES", "1200"))
    result = run_fuzz(seed=12, num_cases=num_cases, tmp=tmp_path)
    assert result["failures"] == [], result
    assert result["rejected"] + result["loaded"] == num_cases, result
    # The edits must reach both outcomes, or the fuzz is not testing the query side.
    assert result["rejected"] > num_cases // 2 and result["loaded"] > 20, result


def test_every_index_the_api_builds_passes_verification(tmp_path):
    """The checks never refuse a real index (random builds, removals, save and load)."""
    rng = random.Random(3)
    for round_ in range(1000):
        idx = TokenIndex()
        alphabet = rng.choice([1, 2, 3, 8, 1000])
        live: set[int] = set()
        removed: set[int] = set()
        for _ in range(rng.randint(1, 25)):
            if live and rng.random() < 0.15:
                d = rng.choice(sorted(live))
                idx.remove(d)
                live.discard(d)
                removed.add(d)
                continue
            d = rng.randrange(6)
            if d not in removed:
                idx.extend(d, [rng.randrange(alphabet) for _ in range(rng.randint(0, 60))])
                live.add(d)
        idx.verify()
        if round_ % 50 == 0:
            idx.save(tmp_path / "r.agidx")
            TokenIndex.load(tmp_path / "r.agidx").verify()


# ----------------------------------------------------------------------------- sizes
def test_out_of_range_sizes_and_wrong_types_are_clear_errors():
    idx = TokenIndex()
    idx.extend(0, [1, 2, 3, 1, 2, 4])
    cur = idx.match([1, 2])
    for n in (2**33, 2**62, 2**64 - 1, -1):
        with pytest.raises(ValueError, match=r"max_count must be in \[0, 2\^31\)"):
            cur.occurrences(n)
    for n in (2**64 - 1, 2**31, -1):
        with pytest.raises(ValueError, match=r"max_tokens must be in \[0, 2\^31\)"):
            cur.continuation(n)
    for bad in (1.7, "2", None, True, np.bool_(True)):
        with pytest.raises(TypeError, match="must be an int"):
            cur.continuation(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="max_occurrences must be an int"):
            cur.continuation(2, max_occurrences=bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="must be an int"):
            cur.occurrences(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_occurrences"):
        cur.continuation(3, max_occurrences=2**64)
    for bad in (1.7, "2", True, None, np.float64(2.0), np.bool_(True)):
        with pytest.raises(TypeError, match="a token id must be an int"):
            cur.extend_one(bad)  # type: ignore[arg-type]
    for bad in (2**70, 2**31, -1):
        with pytest.raises(ValueError, match=r"token ids must be in \[0, 2\^31\)"):
            cur.extend_one(bad)
    assert cur.num_fed == 2  # nothing was fed by the failed calls
    assert 2**70 not in idx and -(2**70) not in idx and 0 in idx
    # Large values that are in range mean "all": they must not be used as a size.
    cur.extend_one(np.int64(1))
    cur.extend_one(2)
    assert cur.occurrences(2**31 - 1) == [(0, 4), (0, 1)]
    assert cur.continuation(2**31 - 1, "first") == [3, 1, 2, 4]
    assert cur._native.continuation(2**64 - 1, 3, 2**64 - 1) == [4]
    assert cur._native.occurrences(2**64 - 1) == [(0, 4), (0, 1)]


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "fuzz":
        fuzz_worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
    else:
        sys.exit("usage: test_token_index_io.py fuzz SEED START STOP TMPDIR")
