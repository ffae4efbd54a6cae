"""The session corpus: every message and output of one agent session (paper §3.1).

Example (token ids, with 0 as the message separator):
    >>> s = SessionCorpus(separator_id=0)
    >>> s.add_prompt(1, [0, 5, 6, 0, 7, 8])     # two messages, both new
    6
    >>> s.add_prompt(2, [0, 5, 6, 0, 7, 8, 0, 9])  # repeats both: only "0 9" is new
    2
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agspec.index.engines import IndexFactory
from agspec.index.token_index import TokenIndex, as_tokens


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

    A caller that knows how many leading prompt tokens the session has seen (the
    session resolver of `agspec.drafter.session_inference` does) passes `known_tokens`:
    ingestion then costs O(new text). Without it every message of the prompt is hashed
    again (about 16 ns a token here; finding a shared prefix by comparing with the
    previous prompt instead costs as much: a comparison of Python ints is no cheaper
    than hashing them, benchmarks/bench_ingest.py).
    """

    def __init__(
        self, *, separator_id: int | None, index_factory: IndexFactory = TokenIndex
    ) -> None:
        self.index = index_factory()
        self.separator_id = separator_id
        self._seen: set[int] = set()

    def add_prompt(
        self,
        doc_id: int,
        prompt_ids: np.ndarray | Sequence[int],
        *,
        known_tokens: int = 0,
    ) -> int:
        """Indexes the messages of this prompt not seen before; returns tokens added.

        Messages are keyed by a 64-bit hash of their token ids (a collision would only
        skip a message, never change an output). All new messages enter in one call, so
        a bad token id leaves the corpus as it was.

        `known_tokens`: the caller vouches that the prompt's first `known_tokens` tokens
        are text this session already holds (an earlier prompt of it, or a prompt and its
        answer). They are neither hashed nor indexed; the rest of the message they end in
        is indexed as it is, and the messages after it as usual.

        >>> s = SessionCorpus(separator_id=0)
        >>> s.add_prompt(1, [0, 5, 6, 0, 7])
        5
        >>> s.add_prompt(2, [0, 5, 6, 0, 7, 8, 0, 9], known_tokens=5)   # "8", then "0 9"
        3
        """
        toks = prompt_ids if isinstance(prompt_ids, list) else as_tokens(prompt_ids).tolist()
        n = len(toks)
        if isinstance(known_tokens, bool) or not isinstance(known_tokens, int):
            raise TypeError(f"known_tokens must be an int, got {type(known_tokens).__name__}")
        if not 0 <= known_tokens <= n:
            raise ValueError(f"known_tokens must be in [0, {n}] (the prompt's length)")
        sep = self.separator_id
        new: list[int] = []
        start = 0  # messages are split from here on
        if known_tokens:
            # The tail of the message the known text ends in, up to the next separator.
            start = n
            if sep is not None:
                try:
                    start = toks.index(sep, known_tokens)
                except ValueError:
                    pass
            new.extend(toks[known_tokens:start])
        # Message starts from `start` on: separators (and `start`, a separator or 0, or
        # the prompt's end after known text).
        starts = [start]
        if sep is not None:
            i = start
            while True:
                try:
                    i = toks.index(sep, i + 1)
                except ValueError:
                    break
                starts.append(i)
        new_keys: set[int] = set()
        seen = self._seen
        for a, b in zip(starts, [*starts[1:], n]):
            if b <= a:
                continue
            part = toks[a:b]
            key = hash(tuple(part))
            if key in seen or key in new_keys:
                continue
            new_keys.add(key)
            new.extend(part)
        if new:
            self.index.extend_list(doc_id, new)
        seen |= new_keys
        return len(new)

    def add_output(self, doc_id: int, tokens: np.ndarray | Sequence[int]) -> None:
        self.index.extend(doc_id, tokens)

    @property
    def num_tokens(self) -> int:
        return self.index.num_tokens
