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
