"""`agspec index build | query` on folders of files written here, against hand-computed
answers and a brute-force matcher over the tokenizer's own output."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from agspec.cli import main
from agspec.corpora.global_build import build_index, iter_files, query_index, sidecar_path
from agspec.index.token_index import TokenIndex
from agspec.tokenizers import get_tokenizer

TOK = get_tokenizer("qwen2.5")


def _write(root: Path, files: dict[str, bytes | str]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            path.write_text(data, encoding="utf-8")
        else:
            path.write_bytes(data)


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    _write(
        root,
        {
            "a.py": "a = 1\na = 2\na = 3\n",
            "b.bin": b"\x7fELF\x00\x01\x02",  # NUL byte: binary
            "c.txt": b"caf\xe9\n",  # latin-1, not UTF-8
            "e.txt": "",  # empty
            ".hidden/h.py": "a = 9\n",  # hidden folder: skipped
            "sub/d.py": "def f(x):\n    return x + 1\n\nprint(f(2))\n",
            "sub/u.md": "naïve — 🚀 ünïcödé\n",
        },
    )
    return root


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_build_indexes_text_files_one_document_each(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "i.idx"
    stats = build_index([folder], out)
    names = [Path(p).relative_to(folder.resolve()).as_posix() for p in stats.paths]
    assert names == ["a.py", "sub/d.py", "sub/u.md"]  # sorted walk, binary/empty/hidden gone
    assert (stats.files, stats.skipped_binary, stats.skipped_empty) == (3, 2, 1)

    index = TokenIndex.load(out)
    texts = [(folder / n).read_text(encoding="utf-8") for n in names]
    for doc_id, text in enumerate(texts):
        assert index.document(doc_id) == TOK.encode(text)
    assert stats.tokens == index.num_tokens == sum(len(TOK.encode(t)) for t in texts)
    assert stats.text_bytes == sum(len(t.encode()) for t in texts)

    meta = json.loads(sidecar_path(out).read_text())
    assert meta["tokenizer"] == "qwen2.5"
    assert [d["path"] for d in meta["documents"]] == stats.paths
    assert [d["num_tokens"] for d in meta["documents"]] == [len(TOK.encode(t)) for t in texts]


def test_build_saves_a_frozen_index_with_its_frequent_picks(folder: Path, tmp_path: Path) -> None:
    """The builder freezes the index before saving it, so its file carries the frequent
    picks (a load of a live index's file would build them again every time)."""
    from index_file import IndexFile

    out = tmp_path / "i.idx"
    build_index([folder], out)
    f = IndexFile.parse(out.read_bytes())
    assert f.pick_occurrences == 32 and len(f.picks) == len(f.states)


def test_rebuild_into_the_indexed_folder_skips_its_own_output(folder: Path) -> None:
    out = folder / "own.idx"
    first = build_index([folder], out)
    second = build_index([folder], out)  # own.idx.docs.json is UTF-8 text: must not be indexed
    assert second.paths == first.paths and second.tokens == first.tokens


def test_glob_and_file_roots(folder: Path) -> None:
    got = iter_files([folder], ["*.md", "a.*"])
    assert [p.name for p in got] == ["a.py", "u.md"]
    # a file given directly is taken as is; overlapping roots are not indexed twice
    got = iter_files([folder / "sub" / "d.py", folder / "sub"], ["*.py"])
    assert [p.name for p in got] == ["d.py"]


def test_query_hand_computed(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "i.idx"
    build_index([folder / "a.py"], out)
    # "\na =" is 3 tokens and occurs twice with a successor (before " 2" and " 3")
    assert TOK.encode("\na =") == [198, 64, 284]
    res = query_index(out, "x\na =", max_tokens=3)
    assert res["match_tokens"] == 3 and res["match_text"] == "\na ="
    assert [(o["line"], o["end_offset"]) for o in res["occurrences"]] == [(3, 11), (2, 6)]
    assert res["continuation_text"] == " 3\n"  # two groups of one: the most recent wins
    res = query_index(out, "x\na =", max_tokens=3, rule="first")
    assert res["continuation_text"] == " 2\n"
    assert res["continuation_tokens"] == [220, 17, 198]
    # "a = 3\n" ends the file: its "\n" has no successor, so only the suffix "\n" matches
    # (after "1" and "2"), and the continuation copies from the most recent one
    res = query_index(out, "a = 3\n")
    assert res["match_tokens"] == 1 and res["continuation_text"] == "a = 3\n"
    # nothing in common
    res = query_index(out, "zzz")
    assert res["match_tokens"] == 0 and res["occurrences"] == [] and res["continuation_text"] == ""


def test_cli_round_trip_prints_paths_lines_and_continuation(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "i.idx"
    rc, stdout, _ = _run(capsys, "index", "build", str(folder), "-o", str(out), "--quiet")
    assert rc == 0
    assert "files 3 (skipped: 2 binary or non-UTF-8, 1 empty)" in stdout
    rc, stdout, _ = _run(capsys, "index", "query", str(out), "def f(x):\n", "--max-tokens", "4")
    assert rc == 0
    lines = stdout.splitlines()
    assert lines[0] == "match 4 tokens: 'def f(x):\\n'"
    assert lines[2] == f"  {(folder / 'sub' / 'd.py').resolve()}:2"
    assert lines[3] == "continuation (4 tokens, rule frequent):"
    assert "\n".join(lines[4:]) == "    return x +"
    rc, stdout, _ = _run(capsys, "index", "query", str(out), "naïve", "--json")
    assert rc == 0
    res = json.loads(stdout)
    assert res["occurrences"][0]["path"].endswith("u.md")
    assert res["continuation_text"].startswith(" — 🚀")


def _brute_match(docs: list[list[int]], fed: list[int]) -> tuple[int, set[tuple[int, int]]]:
    """Longest suffix of fed occurring with a successor; its (doc, end_offset) set."""
    for n in range(len(fed), 0, -1):
        s = fed[-n:]
        ends = {
            (d, i + n - 1)
            for d, doc in enumerate(docs)
            for i in range(len(doc) - n)  # i + n < len(doc): a successor exists
            if doc[i : i + n] == s
        }
        if ends:
            return n, ends
    return 0, set()


def test_query_against_brute_force(tmp_path: Path) -> None:
    rng = random.Random(7)
    words = ["def", "return", "x", "y", "self", "(", ")", ":", "\n", "    ", "=", "+", "1"]
    texts = ["".join(rng.choice(words) + rng.choice([" ", ""]) for _ in range(150)) for _ in "abc"]
    root = tmp_path / "r"
    _write(root, {f"{i}.txt": t for i, t in enumerate(texts)})
    out = tmp_path / "r.idx"
    build_index([root], out)
    docs = [TOK.encode(t) for t in texts]
    for _ in range(40):
        t = rng.choice(texts)
        i = rng.randrange(len(t))
        query = "@" + t[max(0, i - rng.randrange(1, 40)) : i]
        res = query_index(out, query, max_occurrences=10_000)
        n, ends = _brute_match(docs, TOK.encode(query))
        assert res["match_tokens"] == n, query
        got = {(o["doc_id"], o["end_offset"]) for o in res["occurrences"]}
        assert got == ends, query
        for o in res["occurrences"]:
            # line oracle: newlines in the file's text up to the end of the matched tokens
            doc = docs[o["doc_id"]]
            chars = len(TOK.decode(doc[: o["end_offset"] + 1]))
            assert o["line"] == texts[o["doc_id"]][:chars].count("\n") + 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["index", "build", "{tmp}/missing", "-o", "{tmp}/x.idx"], "no such folder"),
        (["index", "build", "{src}", "-o", "{tmp}/x.idx", "--glob", "*.rs"], "no files matching"),
        (["index", "build", "{src}", "-o", "{tmp}/x.idx", "--tokenizer", "nope"], "unknown token"),
        (["index", "query", "{tmp}/absent.idx", "a"], "build the index"),
        (["index", "query", "{tmp}/good.idx", "a", "--max-tokens", "-1"], "--max-tokens"),
    ],
)
def test_bad_input_is_one_line_error(
    folder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    build_index([folder], tmp_path / "good.idx")
    argv = [a.format(tmp=tmp_path, src=folder) for a in argv]
    rc, _, err = _run(capsys, *argv)
    assert rc == 1
    assert err.startswith("agspec index: error:") and message in err, err
    assert "Traceback" not in err


def test_only_binary_files_is_an_error(tmp_path: Path) -> None:
    _write(tmp_path / "bin", {"x.bin": b"\x00\x00", "y.txt": b"\xff"})
    with pytest.raises(ValueError, match="none of the 2 files"):
        build_index([tmp_path / "bin"], tmp_path / "x.idx")


def test_corrupt_index_or_mismatched_sidecar(folder: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a.idx", tmp_path / "b.idx"
    build_index([folder], a)
    build_index([folder / "a.py"], b)
    sidecar_path(b).write_text(sidecar_path(a).read_text())  # sidecar of another index
    with pytest.raises(ValueError, match="does not describe"):
        query_index(b, "a")
    data = a.read_bytes()
    a.write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(ValueError):
        query_index(a, "a")
    sidecar_path(a).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        query_index(a, "a")
