"""The three corpora by source: session, workspace, global (paper §3.1).

Each corpus is its own `TokenIndex`. Live corpora (session, workspace) belong to one
session and are dropped with it; the global corpus is built offline and loaded
read-only.

Example (token ids, with 0 as the message separator):
    >>> s = SessionCorpus(separator_id=0)
    >>> s.add_prompt(1, [0, 5, 6, 0, 7, 8])     # two messages, both new
    6
    >>> s.add_prompt(2, [0, 5, 6, 0, 7, 8, 0, 9])  # repeats both: only "0 9" is new
    2
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from agspec.emission import emission_forms
from agspec.token_index import MatchCursor, TokenIndex, as_tokens

# Makes an empty index. The native `TokenIndex` by default; any object with the same
# `extend / extend_list / match / num_tokens` interface works (see docs/design.md,
# "Retrieval engines"), e.g. `agspec.engines.arctic.SuffixTreeIndex`.
IndexFactory = Callable[[], Any]


def split_messages(tokens: np.ndarray, separator_id: int | None) -> list[np.ndarray]:
    """Splits a prompt before each separator token (e.g. `<|im_start|>`)."""
    if separator_id is None or tokens.size == 0:
        return [tokens] if tokens.size else []
    starts = np.flatnonzero(tokens == separator_id)
    if starts.size == 0 or starts[0] != 0:
        starts = np.concatenate(([0], starts))
    bounds = np.append(starts, tokens.size)
    return [tokens[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


class SessionCorpus:
    """All text of one session, shared by its calls and agents; each text enters once.

    A call's document holds the prompt messages no earlier call sent (messages are
    split at `separator_id`), then the tokens it generates as they are accepted.
    """

    def __init__(
        self, *, separator_id: int | None, index_factory: IndexFactory = TokenIndex
    ) -> None:
        self.index = index_factory()
        self.separator_id = separator_id
        self._seen: set[int] = set()

    def add_prompt(self, doc_id: int, prompt_ids: np.ndarray | Sequence[int]) -> int:
        """Indexes the messages of this prompt not seen before; returns tokens added.

        Messages are keyed by a 64-bit hash of their token ids (a collision would only
        skip a message, never change an output). All new messages enter in one call, so
        a bad token id leaves the corpus as it was.
        """
        toks = prompt_ids if isinstance(prompt_ids, list) else as_tokens(prompt_ids).tolist()
        sep = self.separator_id
        starts = [0]
        if sep is not None:
            i = 0
            while True:
                try:
                    i = toks.index(sep, i + 1)
                except ValueError:
                    break
                starts.append(i)
        new_keys: set[int] = set()
        new: list[int] = []
        for a, b in zip(starts, [*starts[1:], len(toks)]):
            if b <= a:
                continue
            part = toks[a:b]
            key = hash(tuple(part))
            if key in self._seen or key in new_keys:
                continue
            new_keys.add(key)
            new.extend(part)
        if new:
            self.index.extend_list(doc_id, new)
        self._seen |= new_keys
        return len(new)

    def add_output(self, doc_id: int, tokens: np.ndarray | Sequence[int]) -> None:
        self.index.extend(doc_id, tokens)

    @property
    def num_tokens(self) -> int:
        return self.index.num_tokens


class WorkspaceCorpus:
    """The artifacts the session opened, each indexed once, in the forms the agent emits."""

    def __init__(
        self,
        encode: Callable[[str], list[int]],
        emission_format: str,
        *,
        with_emission_forms: bool = True,
        index_factory: IndexFactory = TokenIndex,
    ) -> None:
        emission_forms("", emission_format)  # validates the format name up front
        self.index = index_factory()
        self._encode = encode
        self.emission_format = emission_format
        self.with_emission_forms = with_emission_forms
        self._versions: dict[str, set[int]] = {}
        self._lines: dict[str, set[str]] = {}
        self._next_doc = 0

    def open_artifact(self, path: str, text: str) -> int:
        """Indexes what this artifact shows that was not indexed yet; returns tokens added.

        The first view of a path is indexed whole. A later, different view of the same
        path (an agent scrolling through a file, or the file after an edit) adds only its
        runs of lines not seen in earlier views of that path: blank and very short lines
        ("}", "") never split a run. Each run is indexed in every emission form.
        """
        if not isinstance(path, str) or not path:
            raise ValueError("artifact path must be a non-empty str")
        if not isinstance(text, str):
            raise TypeError(
                f"artifact {path!r}: text must be str, got {type(text).__name__} "
                "(decode binary files before opening them, or skip them)"
            )
        if "\x00" in text:
            raise ValueError(f"artifact {path!r} holds NUL bytes: not a text file")
        key = hash(text)
        seen = self._versions.setdefault(path, set())
        if key in seen:
            return 0
        seen.add(key)
        lines = text.splitlines(keepends=True)
        known = self._lines.setdefault(path, set())
        runs = [text] if not known else _new_runs(lines, known)
        known.update(lines)
        added = 0
        for run in runs:
            forms = emission_forms(run, self.emission_format) if self.with_emission_forms else [run]
            for form in forms:
                toks = self._encode(form)
                if toks:
                    self.index.extend(self._next_doc, toks)
                    self._next_doc += 1
                    added += len(toks)
        return added

    @property
    def num_tokens(self) -> int:
        return self.index.num_tokens

    @property
    def paths(self) -> list[str]:
        return sorted(self._versions)


def _new_runs(lines: list[str], known: set[str]) -> list[str]:
    """Maximal runs of lines not in `known`; short lines never split a run.

    >>> _new_runs(["a = 1\\n", "b = 2\\n", "\\n", "c = 3\\n", "a = 1\\n"], {"a = 1\\n", "\\n"})
    ['b = 2\\n\\nc = 3\\n']
    """
    runs: list[str] = []
    cur: list[str] = []
    for line in lines:
        if line in known and len(line.strip()) >= 4:
            if any(len(x.strip()) >= 4 for x in cur):
                runs.append("".join(cur))
            cur = []
        else:
            cur.append(line)
    if any(len(x.strip()) >= 4 for x in cur):
        runs.append("".join(cur))
    return runs


class GlobalCorpus:
    """Static reference text, built offline, read-only while serving."""

    def __init__(self, index: Any) -> None:
        self.index = index

    @classmethod
    def build(
        cls, docs: Iterable[Sequence[int] | np.ndarray], index_factory: IndexFactory = TokenIndex
    ) -> GlobalCorpus:
        index = index_factory()
        for i, doc in enumerate(docs):
            if len(doc):
                index.extend(i, doc)
        return cls(index)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> GlobalCorpus:
        return cls(TokenIndex.load(path))

    def save(self, path: str | os.PathLike[str]) -> None:
        self.index.save(path)

    @property
    def num_tokens(self) -> int:
        return self.index.num_tokens

    def cursor(self, max_match_tokens: int) -> MatchCursor:
        return self.index.match(max_match_tokens=max_match_tokens)
