"""REST-style drafter: retrieval from a global datastore only, fixed draft length.

REST (He et al., NAACL 2024; `FasterDecoding/REST`) keeps a datastore built before
serving and, at every step, looks up the longest suffix of the request's context
(spans 16 down to 2 tokens) that occurs in it, collects up to `k = 5000` occurrences,
counts every prefix of the `long = 10` tokens that follow each one in a trie, and verifies
the most frequent branches as a draft tree. Here the datastore is the `global_docs` given
at construction (e.g. outputs of other sessions), indexed in the native
`agspec.index.token_index.TokenIndex`, and the draft is linear: the trie's most frequent path
(at each depth, the next token most occurrences agree on, among the occurrences still on
the path; ties go to the token of the most recent occurrence).

Example with concrete tokens (datastore `[1, 2, 3, 4]`, `[1, 2, 3, 5]`, `[7, 2, 3, 4]`):

    >>> server = RestServer(global_docs=[[1, 2, 3, 4], [1, 2, 3, 5], [7, 2, 3, 4]])
    >>> call = server.session("s").call("coder", "code", 0)
    >>> call.begin([9, 2, 3])        # "2 3" (2 tokens) matches; 4 follows twice, 5 once
    >>> call.propose(8)
    [4]
    >>> call.accept([4, 8])          # model kept 4, wrote 8; "4 8" / "8" never occur
    >>> call.propose(8)
    []
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agspec.baselines._base import (
    CallLifecycle,
    IndexedCorpus,
    StaticSession,
    check_global_docs,
    check_session_args,
)


@dataclass(frozen=True)
class RestConfig:
    """REST's published defaults (`FasterDecoding/REST`, `human_eval/rest_test.py`)."""

    name: str = "rest"
    max_match_tokens: int = 16  # --max-token-span 16: query spans 16, 15, ..., 2
    min_match_tokens: int = 2  # a 1-token match never drafts
    draft_tokens: int = 10  # `long`: the trie depth, i.e. the draft length
    max_occurrences: int = 5000  # `k`: occurrences counted per lookup

    def __post_init__(self) -> None:
        if not 1 <= self.min_match_tokens <= self.max_match_tokens:
            raise ValueError(
                f"need 1 <= min_match_tokens <= max_match_tokens, got "
                f"{self.min_match_tokens}, {self.max_match_tokens}"
            )
        if self.draft_tokens < 1 or self.max_occurrences < 1:
            raise ValueError("draft_tokens and max_occurrences must be >= 1")


class RestServer:
    """REST-style drafter family: one static datastore shared by every session."""

    def __init__(
        self,
        config: RestConfig = RestConfig(),
        *,
        global_docs: Iterable[Sequence[int]] | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self._datastore = IndexedCorpus()
        for doc in check_global_docs(global_docs):
            self._datastore.add_document(doc)

    def session(self, session_id: str, *, emission_format: str = "none") -> StaticSession:
        check_session_args(session_id, emission_format)
        return StaticSession(self, session_id)

    def make_call(self) -> RestCall:
        return RestCall(self.config, self._datastore)


class RestCall(CallLifecycle):
    """One request: a cursor over the datastore fed the prompt and committed tokens."""

    def __init__(self, config: RestConfig, datastore: IndexedCorpus) -> None:
        super().__init__()
        self._config = config
        self._datastore = datastore
        self._cursor: Any = None

    def _begin(self, prompt: np.ndarray) -> None:
        self._cursor = self._datastore.index.match(
            prompt, max_match_tokens=self._config.max_match_tokens
        )

    def _propose(self, max_tokens: int) -> list[int]:
        match_tokens = self._cursor.match_length
        if match_tokens < self._config.min_match_tokens:
            return []
        self.last_match_length, self.last_source = match_tokens, "global"
        num_tokens = min(max_tokens, self._config.draft_tokens)
        return self._datastore.frequent_path(self._cursor, num_tokens, self._config.max_occurrences)

    def _accept(self, committed: np.ndarray) -> None:
        self._cursor.extend(committed)

    def _end(self) -> None:
        self._cursor = None
