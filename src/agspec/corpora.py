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

import numpy as np

from agspec.emission import emission_forms
from agspec.token_index import MatchCursor, TokenIndex, as_tokens


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

    def __init__(self, *, separator_id: int | None) -> None:
        self.index = TokenIndex()
        self.separator_id = separator_id
        self._seen: set[bytes] = set()

    def add_prompt(self, doc_id: int, prompt_ids: np.ndarray | Sequence[int]) -> int:
        """Indexes the messages of this prompt not seen before; returns tokens added."""
        arr = as_tokens(prompt_ids, what="prompt_ids")
        new = []
        for msg in split_messages(arr, self.separator_id):
            key = msg.tobytes()
            if key not in self._seen:
                self._seen.add(key)
                new.append(msg)
        if not new:
            return 0
        joined = np.concatenate(new)
        self.index.extend(doc_id, joined)
        return int(joined.size)

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
    ) -> None:
        emission_forms("", emission_format)  # validates the format name up front
        self.index = TokenIndex()
        self._encode = encode
        self.emission_format = emission_format
        self.with_emission_forms = with_emission_forms
        self._versions: dict[str, set[int]] = {}
        self._next_doc = 0

    def open_artifact(self, path: str, text: str) -> int:
        """Indexes the artifact unless this exact text was indexed; returns tokens added.

        A later, changed version of the same path is indexed too (both stay).
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
        forms = emission_forms(text, self.emission_format) if self.with_emission_forms else [text]
        ids = [self._encode(form) for form in forms]
        seen.add(key)
        added = 0
        for toks in ids:
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


class GlobalCorpus:
    """Static reference text, built offline, read-only while serving."""

    def __init__(self, index: TokenIndex) -> None:
        self.index = index

    @classmethod
    def build(cls, docs: Iterable[Sequence[int] | np.ndarray]) -> GlobalCorpus:
        index = TokenIndex()
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
