"""The global corpus: a static index built offline (`agspec index build`), loaded read-only."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from agspec.index.engines import IndexFactory
from agspec.index.token_index import MatchCursor, TokenIndex


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
        # Read-only from now on, as a loaded one is (engines without the notion skip it).
        freeze = getattr(index, "freeze", None)
        if freeze is not None:
            freeze()
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
