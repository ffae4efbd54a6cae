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

from agspec import _native
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
    ingestion then costs O(new text). Without it every message of the prompt is split
    and hashed again, in one native pass whose cost is mostly reading the Python list
    (a few ns a token; benchmarks/bench_ingest.py).
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

        Messages are keyed by a 64-bit hash of their token ids and length (a collision
        would only skip a message, never change an output). All new messages enter in one call, so
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
        try:
            # One native pass splits the prompt and keys its messages (a Python split and
            # hash cost about three times as much a token: benchmarks/bench_ingest.py).
            start, starts, keys = _native.message_keys(
                toks, -1 if sep is None else sep, known_tokens
            )
        except TypeError:
            as_tokens(toks, what="prompt_ids")  # says which id is bad
            raise
        # The tail of the message the known text ends in (known_tokens > 0), up to the
        # next separator, then every message not seen before.
        new: list[int] = toks[known_tokens:start] if known_tokens else []
        new_keys: set[int] = set()
        seen = self._seen
        for i, key in enumerate(keys):
            if key in seen or key in new_keys:
                continue
            new_keys.add(key)
            new.extend(toks[starts[i] : starts[i + 1] if i + 1 < len(starts) else n])
        if new:
            self.index.extend_list(doc_id, new)
        seen |= new_keys
        return len(new)

    def add_output(self, doc_id: int, tokens: np.ndarray | Sequence[int]) -> None:
        self.index.extend(doc_id, tokens)

    @property
    def num_tokens(self) -> int:
        return self.index.num_tokens
