"""The saved-KV store of `agspec serve`: slot caches kept in host memory for sessions that
have lost their slot (docs/serve-parallel.md, *Prefixes shared across slots and sessions*).

An entry is anything with `tokens` (the tokens whose KV it holds, from position 0) and
`nbytes` (`agspec.adapters.llama_cpp_batch.SavedKV`). The store keeps the most recently
used entries within a byte budget, finds the entry sharing the longest prefix with a
prompt, and never holds two entries where one only extends the other.

Example with concrete tokens: after `put(A = [1, 2, 3])` and `put(B = [1, 2, 3, 4, 5])`
only B is left (it extends A); `best([1, 2, 3, 4, 9])` is B with 4 tokens in common;
`take(B)` hands it out and forgets it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from agspec.adapters.llama_cpp_batch import common_prefix_length

__all__ = ["KVStore"]


class _Entry(Protocol):
    @property
    def tokens(self) -> Sequence[int]: ...
    @property
    def nbytes(self) -> int: ...


class KVStore:
    """LRU entries within `budget_bytes` (> 0)."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be > 0, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[int, Any] = OrderedDict()
        # Each entry's tokens as an array, made once: `best` runs at every admission.
        self._arrays: dict[int, np.ndarray] = {}
        self._next_key = 0
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, prompt: Sequence[int]) -> tuple[int, int]:
        """(key, tokens in common) of the entry sharing the longest prefix with `prompt`;
        (-1, 0) when none shares a token."""
        key, most = -1, 0
        want = np.asarray(prompt, dtype=np.int64)
        for k, arr in self._arrays.items():
            n = common_prefix_length(arr, want)
            if n > most:
                key, most = k, n
        return key, most

    def covers(self, tokens: Sequence[int]) -> bool:
        """Whether an entry holds `tokens` at its start (saving them again adds nothing)."""
        n = len(tokens)
        return any(
            len(e.tokens) >= n and common_prefix_length(e.tokens, tokens) == n
            for e in self._entries.values()
        )

    def take(self, key: int) -> Any:
        """The entry `key`, removed from the store."""
        e = self._entries.pop(key)
        del self._arrays[key]
        self.nbytes -= e.nbytes
        return e

    def put(self, entry: _Entry) -> bool:
        """Keep `entry` (most recent), dropping the entries it extends and then the least
        recently used ones until the budget holds. False (nothing changed) when the entry
        alone exceeds the budget or an entry already covers its tokens."""
        if entry.nbytes > self.budget_bytes or self.covers(entry.tokens):
            return False
        n = len(entry.tokens)
        for k in [
            k
            for k, e in self._entries.items()
            if len(e.tokens) <= n and common_prefix_length(e.tokens, entry.tokens) == len(e.tokens)
        ]:
            self.take(k)
        while self._entries and self.nbytes + entry.nbytes > self.budget_bytes:
            self.take(next(iter(self._entries)))
        self._entries[self._next_key] = entry
        self._arrays[self._next_key] = np.asarray(entry.tokens, dtype=np.int64)
        self._next_key += 1
        self.nbytes += entry.nbytes
        return True
