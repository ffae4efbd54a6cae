"""SAM-Decoding: a request automaton plus a static automaton, on the native index.

SAM-Decoding (Hu et al., ACL 2025; `hyx1999/SAM-Decoding`) keeps two suffix automata:

- the *dynamic* one over the request (prompt plus every committed token), rebuilt per
  request; here a per-call `TokenIndex` holding one document, the request's tokens;
- the *static* one over a corpus built before serving; here the `global_docs` given at
  construction, one `TokenIndex` shared by every session.

Each step it takes the longest suffix match in each (`match_dyn`, `match_static`),
subtracts `len_bias = 5` from the static one, and drafts from the request automaton when
`match_dyn >= match_static - len_bias` (so the static corpus wins only when its match is
longer by more than `len_bias`). Below `len_threshold` the original hands over to an
auxiliary drafter (Token Recycling / EAGLE); there is none here, so it drafts nothing.

The continuation is copied from the **earliest** occurrence of the match (the automaton's
`min_endpos`), i.e. `MatchCursor.continuation(rule="first")`. Two length rules:

- `SAM_FIXED` (`samd/`, `SamdConfig`: `n_predicts=40`, `len_threshold=5`, `len_bias=5`):
  the draft is `[start_token] + input_ids[endpos+1 : endpos+n_predicts]`, so 39 draft
  tokens after the token the model just produced;
- `SAM_SCALED` (`samd_sam_only/`: `max_predicts=60`, `alpha=4.0`, `len_bias=5`):
  `n = min(max_predicts, 1 + int(match * alpha))`, i.e. `min(59, int(4 * match))` draft
  tokens, with `match` the (biased, for static) length of the chosen match. That variant
  drafts a frequency-weighted top-K tree from the static automaton and a sequence or tree
  from the dynamic one; linearized here as the static trie's most frequent path
  (`agspec.baselines.rest.most_frequent_path`) and the dynamic earliest-occurrence copy,
  at every match length >= 1.

Example with concrete tokens (SAM_FIXED, empty static corpus):

    >>> server = SamServer(SAM_FIXED)
    >>> call = server.session("s").call("coder", "code", 0)
    >>> call.begin([1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5])   # "1 2 3 4 5" matched at 0
    >>> call.propose(3)
    [6, 7, 1]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from agspec.baselines._base import (
    CallLifecycle,
    IndexedCorpus,
    StaticSession,
    check_global_docs,
    check_session_args,
    import_token_index,
)


@dataclass(frozen=True)
class SamConfig:
    """One SAM-Decoding variant (see the module docstring for the published sources)."""

    name: str
    length_rule: Literal["fixed", "scaled"]
    n_predicts: int = 40  # fixed: draft = n_predicts - 1 tokens after the start token
    max_predicts: int = 60  # scaled: n = min(max_predicts, 1 + int(match * alpha))
    alpha: float = 4.0
    len_bias: int = 5
    len_threshold: int = 5  # below it the original uses an auxiliary drafter; we draft nothing
    static_rule: Literal["first", "frequent"] = "first"
    # The automata's matches are unbounded; the index caps them. 256 only matters when
    # both matches exceed it.
    max_match_tokens: int = 256
    max_occurrences: int = 5000  # for static_rule="frequent"

    def __post_init__(self) -> None:
        if self.length_rule not in ("fixed", "scaled"):
            raise ValueError(f"length_rule must be 'fixed' or 'scaled', got {self.length_rule!r}")
        if self.static_rule not in ("first", "frequent"):
            raise ValueError(f"static_rule must be 'first' or 'frequent', got {self.static_rule!r}")
        if self.n_predicts < 2 or self.max_predicts < 2 or self.alpha <= 0:
            raise ValueError("need n_predicts >= 2, max_predicts >= 2 and alpha > 0")
        if self.len_bias < 0 or self.len_threshold < 1 or self.max_match_tokens < 1:
            raise ValueError("need len_bias >= 0, len_threshold >= 1, max_match_tokens >= 1")

    def draft_tokens(self, match_tokens: int) -> int:
        """Draft length for a chosen match (biased for the static automaton).

        >>> SAM_SCALED.draft_tokens(3), SAM_SCALED.draft_tokens(20), SAM_FIXED.draft_tokens(3)
        (12, 59, 39)
        """
        if self.length_rule == "fixed":
            return self.n_predicts - 1
        return min(self.max_predicts, 1 + int(match_tokens * self.alpha)) - 1


SAM_FIXED = SamConfig(name="sam-fixed", length_rule="fixed")
SAM_SCALED = SamConfig(
    name="sam-scaled", length_rule="scaled", len_threshold=1, static_rule="frequent"
)


class SamServer:
    """SAM-Decoding family: the static automaton over the global corpus, shared."""

    def __init__(
        self,
        config: SamConfig = SAM_FIXED,
        *,
        global_docs: Iterable[Sequence[int]] | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self._static = IndexedCorpus()
        for doc in check_global_docs(global_docs):
            self._static.add_document(doc)

    def session(self, session_id: str, *, emission_format: str = "none") -> StaticSession:
        check_session_args(session_id, emission_format)
        return StaticSession(self, session_id)

    def make_call(self) -> SamCall:
        return SamCall(self.config, self._static)


class SamCall(CallLifecycle):
    """One request: its own automaton (index) plus a cursor over the static one."""

    def __init__(self, config: SamConfig, static: IndexedCorpus) -> None:
        super().__init__()
        self._config = config
        self._static = static
        self._request: Any = None  # TokenIndex: doc 0 = prompt + committed tokens
        self._request_cursor: Any = None
        self._static_cursor: Any = None

    def _begin(self, prompt: np.ndarray) -> None:
        cap = self._config.max_match_tokens
        self._request = import_token_index()()
        if prompt.size:
            self._request.extend(0, prompt)
        self._request_cursor = self._request.match(prompt, max_match_tokens=cap)
        if self._static.num_documents:
            self._static_cursor = self._static.index.match(prompt, max_match_tokens=cap)

    def _propose(self, max_tokens: int) -> list[int]:
        cfg = self._config
        match_dyn = self._request_cursor.match_length
        match_static = -cfg.len_bias
        if self._static_cursor is not None:
            match_static += self._static_cursor.match_length
        if match_dyn >= match_static:
            if match_dyn < cfg.len_threshold or match_dyn == 0:
                return []
            num_tokens = min(max_tokens, cfg.draft_tokens(match_dyn))
            self.last_match_length, self.last_source = match_dyn, "request"
            draft: list[int] = self._request_cursor.continuation(num_tokens, rule="first")
            return draft
        if match_static < cfg.len_threshold:
            return []
        num_tokens = min(max_tokens, cfg.draft_tokens(match_static))
        self.last_match_length = match_static + cfg.len_bias
        self.last_source = "global"
        if cfg.static_rule == "first":
            draft = self._static_cursor.continuation(num_tokens, rule="first")
            return draft
        return self._static.frequent_path(self._static_cursor, num_tokens, cfg.max_occurrences)

    def _accept(self, committed: np.ndarray) -> None:
        self._request.extend(0, committed)
        self._request_cursor.extend(committed)
        if self._static_cursor is not None:
            self._static_cursor.extend(committed)

    def _end(self) -> None:
        self._request = self._request_cursor = self._static_cursor = None
