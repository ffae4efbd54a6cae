"""FastCoder-style drafter, **reimplemented from the paper's description** (Zhao et al.,
2025, arXiv 2502.17139); no code of the original was available to us.

What the paper describes, and what we built for it:

- a *multi-source datastore* of general and project-specific code: the global corpus
  (`global_docs`, "common code") and the session's repository files (the workspace
  artifacts opened in the session, tokenized with the server's tokenizer);
- a *cache of generated text* ("context- and LLM preference-aware cache", holding
  sequences the model generated and verified): the outputs of earlier calls (entered
  when a call ends) plus the current call's output so far;
- REST-style retrieval (FastCoder builds on REST): the longest suffix of the request's
  context, between `min_match_tokens = 2` and `max_match_tokens = 16` tokens, that occurs
  in a source; the draft is the most frequent path of the trie of what follows its
  occurrences (`agspec.baselines.rest.most_frequent_path`), with a static cap;
- source order: the cache first (a hit there skips the datastore, the paper's point
  about retrieval cost); otherwise the repository or common code, whichever matches
  longer (ties to the repository).

Choices of ours, not from the paper (its exact values were not retrievable): the static
cap of 10 tokens and the match window (REST's defaults), the cache holding whole outputs
without eviction, and no retrieval-timing rule (we retrieve at every step). Drafts are
linear; the paper verifies draft trees.

Example with concrete tokens (no global corpus, one repository file `[1, 2, 3, 4, 5]`):

    >>> server = FastCoderServer(tokenizer=_ListTokenizer())
    >>> session = server.session("s")
    >>> session.open_artifact("a.py", "1 2 3 4 5")
    >>> call = session.call("coder", "code", 0)
    >>> call.begin([9, 2, 3])          # "2 3" matches the repository file
    >>> call.propose(8)
    [4, 5]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from agspec.baselines._base import (
    CallLifecycle,
    IndexedCorpus,
    check_artifact_args,
    check_call_args,
    check_global_docs,
    check_session_args,
    token_array,
)


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...


class _ListTokenizer:
    """Test tokenizer: whitespace-separated integers (`"1 2 3"` -> `[1, 2, 3]`)."""

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]


@dataclass(frozen=True)
class FastCoderConfig:
    """Knobs of the reimplementation (see the module docstring for where each comes from)."""

    name: str = "fastcoder"
    max_match_tokens: int = 16
    min_match_tokens: int = 2
    draft_tokens: int = 10  # the static cap
    max_occurrences: int = 5000

    def __post_init__(self) -> None:
        if not 1 <= self.min_match_tokens <= self.max_match_tokens:
            raise ValueError("need 1 <= min_match_tokens <= max_match_tokens")
        if self.draft_tokens < 1 or self.max_occurrences < 1:
            raise ValueError("draft_tokens and max_occurrences must be >= 1")


class FastCoderServer:
    """Common code (global corpus) and the cache of earlier outputs live here."""

    def __init__(
        self,
        config: FastCoderConfig = FastCoderConfig(),
        *,
        global_docs: Iterable[Sequence[int]] | None = None,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.tokenizer = tokenizer
        self.common = IndexedCorpus()
        for doc in check_global_docs(global_docs):
            self.common.add_document(doc)
        self.cache = IndexedCorpus()  # outputs of calls that ended

    def session(self, session_id: str, *, emission_format: str = "none") -> FastCoderSession:
        check_session_args(session_id, emission_format)
        return FastCoderSession(self, session_id)


class FastCoderSession:
    """The repository datastore: every artifact the session opens, one document each.

    Re-opening a path with new text adds the new text as another document (indexes are
    append-only); re-opening with the same text adds nothing.
    """

    def __init__(self, server: FastCoderServer, session_id: str) -> None:
        self._server = server
        self.session_id = session_id
        self.repository = IndexedCorpus()
        self._opened: dict[str, str] = {}
        self._ended = False

    def open_artifact(self, path: str, text: str) -> None:
        check_artifact_args(path, text)
        if self._ended:
            raise RuntimeError(f"open_artifact() on session {self.session_id!r}, which ended")
        if self._opened.get(path) == text:
            return
        tokenizer = self._server.tokenizer
        if tokenizer is None:
            raise ValueError(
                "fastcoder indexes repository files and needs a tokenizer: "
                "FastCoderServer(tokenizer=agspec.tokenizers.get_tokenizer('qwen2.5'))"
            )
        self._opened[path] = text
        self.repository.add_document(token_array(tokenizer.encode(text), what=f"tokens of {path}"))

    def call(self, agent: str, role: str, turn: int) -> FastCoderCall:
        check_call_args(agent, role, turn)
        if self._ended:
            raise RuntimeError(f"call() on session {self.session_id!r}, which ended")
        return FastCoderCall(self._server, self)

    def end(self) -> None:
        if self._ended:
            raise RuntimeError(f"session {self.session_id!r} already ended")
        self._ended = True


class FastCoderCall(CallLifecycle):
    """One request: cursors over the four sources, fed the prompt and committed tokens."""

    def __init__(self, server: FastCoderServer, session: FastCoderSession) -> None:
        super().__init__()
        self._server = server
        self._config = server.config
        self._generated = IndexedCorpus()  # doc 0: this call's output so far
        # (source name, corpus, cursor), in the order ties are broken.
        self._sources: list[tuple[str, IndexedCorpus, Any]] = []
        self._session = session
        self._output: list[np.ndarray] = []

    def _begin(self, prompt: np.ndarray) -> None:
        cap = self._config.max_match_tokens
        self._generated.add_document(np.zeros(0, dtype=np.int32))
        corpora = [
            ("generated", self._generated),
            ("cache", self._server.cache),
            ("repository", self._session.repository),
            ("common", self._server.common),
        ]
        self._sources = [
            (name, corpus, corpus.index.match(prompt, max_match_tokens=cap))
            for name, corpus in corpora
        ]

    def _propose(self, max_tokens: int) -> list[int]:
        cfg = self._config
        lengths = [cursor.match_length for _, _, cursor in self._sources]
        # The cache (this call's output, then earlier outputs) first; then the datastore.
        cache_best = 0 if lengths[0] >= lengths[1] else 1
        if lengths[cache_best] >= cfg.min_match_tokens:
            chosen = cache_best
        else:
            chosen = 2 if lengths[2] >= lengths[3] else 3
            if lengths[chosen] < cfg.min_match_tokens:
                return []
        name, corpus, cursor = self._sources[chosen]
        self.last_match_length, self.last_source = lengths[chosen], name
        return corpus.frequent_path(cursor, min(max_tokens, cfg.draft_tokens), cfg.max_occurrences)

    def _accept(self, committed: np.ndarray) -> None:
        self._generated.extend_last(committed)
        self._output.append(committed)
        for _, _, cursor in self._sources:
            cursor.extend(committed)

    def _end(self) -> None:
        if self._output:
            self._server.cache.add_document(np.concatenate(self._output))
        self._sources = []
        self._output = []
