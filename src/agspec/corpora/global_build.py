"""Building the global corpus from a folder of text files (`agspec index build`), and querying it.

One document per file; binary and non-UTF-8 files are skipped and counted. The index's frozen
form goes to FILE, the document-id -> path mapping to the JSON sidecar `FILE.docs.json`.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agspec._files import atomic_output, atomic_write_text, check_not_input

SIDECAR_SUFFIX = ".docs.json"
SIDECAR_VERSION = 1
# The longest continuation and the most occurrences a query prints (as the drafter's
# propose() bound): a larger number is a typo, not a request.
MAX_QUERY_TOKENS = 1 << 16


@dataclass
class BuildStats:
    """What `build_index` did; `files` counts indexed files (documents)."""

    files: int = 0
    skipped_binary: int = 0
    skipped_empty: int = 0
    tokens: int = 0
    text_bytes: int = 0
    index_bytes: int = 0
    file_bytes: int = 0
    read_tokenize_s: float = 0.0
    index_s: float = 0.0
    save_s: float = 0.0
    paths: list[str] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return self.read_tokenize_s + self.index_s + self.save_s


def sidecar_path(index_path: str | os.PathLike[str]) -> Path:
    """`/tmp/a.idx` -> `/tmp/a.idx.docs.json`."""
    return Path(os.fspath(index_path) + SIDECAR_SUFFIX)


def iter_files(roots: Sequence[str | os.PathLike[str]], globs: Sequence[str] | None) -> list[Path]:
    """Files under `roots` (sorted, deduplicated, hidden names skipped) matching any glob.

    A root that is itself a file is taken as given (globs still apply). For roots `["src"]`
    and globs `["*.py"]`: `[src/a.py, src/pkg/b.py]`, never `src/.cache/c.py`.
    """
    seen: set[Path] = set()
    out: list[Path] = []

    def wanted(path: Path) -> bool:
        return not globs or any(fnmatch.fnmatch(path.name, g) for g in globs)

    def add(path: Path) -> None:
        key = path.resolve()
        if key not in seen and wanted(path):
            seen.add(key)
            out.append(path)

    for root in roots:
        base = Path(root)
        if base.is_file():
            add(base)
            continue
        if not base.is_dir():
            raise FileNotFoundError(f"no such folder: {base}")
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                path = Path(dirpath, name)
                if not name.startswith(".") and path.is_file():
                    add(path)
    return out


def read_text(path: Path) -> str | None:
    """The file's text, or None when it is binary (has a NUL byte) or not UTF-8."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _tokenized(
    files: Sequence[Path], tokenizer_name: str, stats: BuildStats, *, progress: bool
) -> Iterator[tuple[Path, np.ndarray]]:
    from tqdm import tqdm

    from agspec.tokenizers import get_tokenizer

    tok = get_tokenizer(tokenizer_name)
    for path in tqdm(files, desc="tokenize", unit="file", file=sys.stderr, disable=not progress):
        text = read_text(path)
        if text is None:
            stats.skipped_binary += 1
            continue
        ids = np.asarray(tok.encode(text), dtype=np.int32)
        if ids.size == 0:
            stats.skipped_empty += 1
            continue
        stats.text_bytes += len(text.encode("utf-8"))
        yield path, ids


def build_index(
    roots: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    tokenizer_name: str = "qwen2.5",
    globs: Sequence[str] | None = None,
    progress: bool = False,
) -> BuildStats:
    """Indexes the text files under `roots` and writes `output` and its `.docs.json` sidecar.

    Document `i` is the i-th indexed file in `iter_files` order, e.g. a folder holding
    `a.py` ("x = 1\\n" -> qwen2.5 [87, 284, 220, 16, 198]) and `b.bin` (binary) gives one
    document 0 = those 5 tokens, and `stats.skipped_binary == 1`.
    """
    from agspec.index.token_index import TokenIndex

    out = Path(output)
    if out.is_dir():
        raise IsADirectoryError(f"output {out} is a folder; give a file path")
    # A file given by name is an input, never an output to overwrite; an earlier build's
    # output found inside an indexed folder is not a source file.
    check_not_input(out, [r for r in roots if Path(r).is_file()])
    check_not_input(sidecar_path(out), [r for r in roots if Path(r).is_file()])
    own = {out.resolve(), sidecar_path(out).resolve()}
    files = [f for f in iter_files(roots, globs) if f.resolve() not in own]
    if not files:
        pattern = f" matching {', '.join(globs)}" if globs else ""
        raise ValueError(f"no files{pattern} under {', '.join(map(str, roots))}")

    stats = BuildStats()
    index = TokenIndex()
    docs: list[dict[str, object]] = []
    t0 = time.perf_counter()
    for path, ids in _tokenized(files, tokenizer_name, stats, progress=progress):
        t1 = time.perf_counter()
        stats.read_tokenize_s += t1 - t0
        index.extend(len(docs), ids)
        t0 = time.perf_counter()
        stats.index_s += t0 - t1
        docs.append({"path": str(path.resolve()), "num_tokens": int(ids.size)})
    stats.read_tokenize_s += time.perf_counter() - t0
    # Frozen before it is saved: the file then carries the index's frequent picks, which a
    # load of a live index's file would have to build again every time (docs/index.md).
    t0 = time.perf_counter()
    index.freeze()
    stats.index_s += time.perf_counter() - t0
    if not docs:
        raise ValueError(
            f"none of the {len(files)} files is non-empty UTF-8 text "
            f"({stats.skipped_binary} binary or non-UTF-8, {stats.skipped_empty} empty)"
        )

    t0 = time.perf_counter()
    # Each file whole or not at all; the sidecar last, so a sidecar always describes the
    # index beside it (query checks the two agree).
    with atomic_output(out) as tmp:
        index.save(tmp)
    sidecar = {
        "version": SIDECAR_VERSION,
        "tokenizer": tokenizer_name,
        "num_documents": index.num_documents,
        "num_tokens": index.num_tokens,
        "documents": docs,
    }
    atomic_write_text(sidecar_path(out), json.dumps(sidecar, indent=1) + "\n")
    stats.save_s = time.perf_counter() - t0

    stats.files = len(docs)
    stats.tokens = index.num_tokens
    stats.index_bytes = index.num_bytes()
    stats.file_bytes = out.stat().st_size
    stats.paths = [str(d["path"]) for d in docs]
    return stats


def load_sidecar(index_path: str | os.PathLike[str]) -> dict[str, object]:
    """Reads and checks `FILE.docs.json`; raises ValueError / FileNotFoundError if unusable."""
    path = sidecar_path(index_path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no {path.name} next to {index_path}: build the index with `agspec index build`"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("version") != SIDECAR_VERSION:
        raise ValueError(f"{path}: expected a version {SIDECAR_VERSION} document list")
    docs = data.get("documents")
    if not isinstance(docs, list) or not isinstance(data.get("tokenizer"), str):
        raise ValueError(f"{path}: missing 'documents' list or 'tokenizer' name")
    return data


def _line_after(decode: Callable[[list[int]], str], doc_tokens: list[int], offset: int) -> int:
    """1-based line on which the text after token `offset` starts (where a continuation goes).

    For tokens ["a", " =", " ", "1", "\\n", "a", " ="] and offset 4 (the "\\n"): line 2.
    """
    return decode(doc_tokens[: offset + 1]).count("\n") + 1


def query_index(
    index_path: str | os.PathLike[str],
    text: str,
    *,
    max_tokens: int = 16,
    rule: str = "frequent",
    max_occurrences: int = 10,
) -> dict[str, object]:
    """Matches the end of `text` against the index; a JSON-ready result.

    Each occurrence's `line` is the line where the text after it starts, i.e. where its
    continuation goes. For an index of one file "a = 1\\na = 2\\na = 3\\n" and text "x\\na =":
    match_tokens 3 ("\\na =" is 3 qwen2.5 tokens), occurrences on lines 3 then 2 (most recent
    first), continuation " 3\\n" (tokens [220, 18, 198]) with rule "frequent" (two groups of
    one: the most recent wins) or " 2\\n" with rule "first".
    """
    from agspec.index.token_index import TokenIndex
    from agspec.tokenizers import get_tokenizer

    if not 0 <= max_tokens <= MAX_QUERY_TOKENS:
        raise ValueError(f"--max-tokens must be in [0, {MAX_QUERY_TOKENS}], got {max_tokens}")
    if not 0 <= max_occurrences <= MAX_QUERY_TOKENS:
        raise ValueError(
            f"--max-occurrences must be in [0, {MAX_QUERY_TOKENS}], got {max_occurrences}"
        )
    meta = load_sidecar(index_path)
    docs = meta["documents"]
    assert isinstance(docs, list)
    index = TokenIndex.load(index_path)
    if index.num_documents != len(docs) or index.num_tokens != meta.get("num_tokens"):
        raise ValueError(
            f"{sidecar_path(index_path).name} does not describe {index_path} "
            f"({len(docs)} documents listed, {index.num_documents} indexed); rebuild both"
        )
    tok = get_tokenizer(str(meta["tokenizer"]))
    query_tokens = tok.encode(text)
    cursor = index.match(query_tokens, max_match_tokens=min(max(1, len(query_tokens)), 1 << 20))
    length = cursor.match_length
    occurrences: list[dict[str, object]] = []
    continuation: list[int] = []
    if length > 0:
        doc_cache: dict[int, list[int]] = {}
        for doc_id, end_offset in cursor.occurrences(max_occurrences):
            if doc_id not in doc_cache:
                doc_cache[doc_id] = index.document(doc_id)
            start = end_offset - length + 1
            occurrences.append(
                {
                    "doc_id": doc_id,
                    "path": str(docs[doc_id]["path"]),
                    "line": _line_after(tok.decode, doc_cache[doc_id], end_offset),
                    "start_offset": start,
                    "end_offset": end_offset,
                }
            )
        continuation = cursor.continuation(max_tokens, rule)  # type: ignore[arg-type]
    return {
        "query_tokens": len(query_tokens),
        "match_tokens": length,
        "match_text": tok.decode(query_tokens[len(query_tokens) - length :]) if length else "",
        "occurrences": occurrences,
        "rule": rule,
        "continuation_tokens": continuation,
        "continuation_text": tok.decode(continuation),
    }
