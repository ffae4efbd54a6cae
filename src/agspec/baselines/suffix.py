"""SuffixDecoding on the real engine: arctic-inference 0.3.0's native `SuffixTree`.

SuffixDecoding (Oliaro et al., NeurIPS 2025; `snowflakedb/ArcticInference`) keeps

- a *per-request* suffix tree over the prompt and the response so far, and
- a *global* suffix tree of earlier responses (one sequence per request, FIFO-bounded by
  `max_cached_requests`),

and at each step asks each tree for its best path draft: for every match length of the
context's suffix it follows the most frequent child while the estimated probability stays
>= `min_token_prob`, for at most `min(max_spec_tokens, match_len * max_spec_factor +
max_spec_offset)` tokens, and keeps the draft with the highest score (sum of
probabilities). The request tree's draft wins ties against the global tree's. Draft and
match together never exceed `max_tree_depth`.

We drive the engine's trees directly (`arctic_inference.suffix_decoding._C.SuffixTree`)
instead of `SuffixDecodingCache`, replicating `SuffixDecodingCache.speculate` (local,
then global, ties to local) with these deliberate differences:

- a call's response enters the global tree when the call ends (`end()`), not token by
  token as `add_active_response` does, so sessions replayed side by side never see each
  other's unfinished outputs and a run does not depend on the batch size;
- the context passed to the engine is the last `max_tree_depth` tokens with one extra
  token in front (a sentinel -1 when the request is shorter): the engine only tries match
  lengths up to `len(context) - 1`, so without it the whole context could never match
  (a quirk of 0.3.0); `max_spec_tokens` is always passed (its `None` default crashes).

Drafts are linear (path mode), the published default and the only mode vLLM uses.

Two named configs: `SUFFIX_64` (ArcticInference: `max_tree_depth=64`) and `SUFFIX_24`
(vLLM's `method="suffix"`: `suffix_decoding_max_tree_depth=24`,
`suffix_decoding_max_cached_requests=10000`), both with `max_spec_factor=1.0`,
`min_token_prob=0.1` and 32 tokens at most (vLLM's documented default for
`num_speculative_tokens`; the Arctic plugin defaults to 16). `SUFFIX_64_LOCAL` keeps no
global tree (the per-request tree alone).

Example with concrete tokens (SUFFIX_64, empty global tree):

    >>> server = SuffixDecodingServer(SUFFIX_64)
    >>> call = server.session("s").call("coder", "code", 0)
    >>> call.begin([1, 2, 3, 4, 5, 6, 1, 2, 3])   # "1 2 3" matched, then 4 5 6 ...
    >>> call.propose(8)                           # match 3 x factor 1.0 -> 3 tokens
    [4, 5, 6]
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agspec.baselines._base import (
    CallLifecycle,
    StaticSession,
    check_global_docs,
    check_session_args,
)

_SENTINEL = -1  # never a token id: pads the context so the whole request can match


def import_suffix_tree() -> Any:
    """arctic-inference's native `SuffixTree`, or an ImportError naming the extra."""
    try:
        from arctic_inference.suffix_decoding._C import SuffixTree
    except ImportError as exc:
        raise ImportError(
            "the suffix-* baselines run on arctic-inference 0.3.0, which is not installed: "
            "pip install 'agspec[suffix]' (on a CPU-only machine first install torch==2.13.0 "
            "and the build requirements, then `pip install --no-build-isolation "
            "arctic-inference==0.3.0`; see docs/baselines-suffix.md)"
        ) from exc
    return SuffixTree


@dataclass(frozen=True)
class SuffixConfig:
    """Knobs of `SuffixDecodingCache.speculate` plus the tree depth and the FIFO bound."""

    name: str
    max_tree_depth: int = 64
    max_spec_tokens: int = 32
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1
    # -1: unbounded; 0: no global tree; > 0: FIFO eviction by number of responses.
    max_cached_requests: int = -1

    def __post_init__(self) -> None:
        if self.max_tree_depth < 2:
            raise ValueError(f"max_tree_depth must be >= 2, got {self.max_tree_depth}")
        if self.max_spec_tokens < 1:
            raise ValueError(f"max_spec_tokens must be >= 1, got {self.max_spec_tokens}")
        if self.max_spec_factor < 0 or not 0.0 <= self.min_token_prob <= 1.0:
            raise ValueError("need max_spec_factor >= 0 and min_token_prob in [0, 1]")
        if self.max_cached_requests < -1 or self.max_cached_requests > 0x7FFFFFFF:
            raise ValueError(
                f"max_cached_requests must be -1, 0 or in [1, 2^31), got {self.max_cached_requests}"
            )


SUFFIX_64 = SuffixConfig(name="suffix-64", max_tree_depth=64, max_cached_requests=-1)
SUFFIX_24 = SuffixConfig(name="suffix-24", max_tree_depth=24, max_cached_requests=10000)
SUFFIX_64_LOCAL = SuffixConfig(name="suffix-64-local", max_tree_depth=64, max_cached_requests=0)


class SuffixDecodingServer:
    """The process-level state: the global tree of earlier responses.

    `global_docs`, when given, are cached as earlier responses before any session runs
    (they count towards `max_cached_requests`). The replay cross-check leaves them out:
    there the global tree holds only responses of sessions replayed earlier.
    """

    def __init__(
        self,
        config: SuffixConfig = SUFFIX_64,
        *,
        global_docs: Iterable[Sequence[int]] | None = None,
    ) -> None:
        self._suffix_tree = import_suffix_tree()
        self.config = config
        self.name = config.name
        self._global_tree = self._suffix_tree(config.max_tree_depth)
        self._cached: OrderedDict[int, None] = OrderedDict()  # seq_ids, oldest first
        self._next_seq_id = 0
        for doc in check_global_docs(global_docs):
            self.cache_response(doc)

    @property
    def num_cached_responses(self) -> int:
        return len(self._cached)

    def session(self, session_id: str, *, emission_format: str = "none") -> StaticSession:
        check_session_args(session_id, emission_format)
        # SuffixDecoding keeps no per-session state: artifacts are not indexed.
        return StaticSession(self, session_id)

    def make_call(self) -> SuffixCall:
        """One request's drafter (used by the shared `StaticSession`)."""
        return SuffixCall(self)

    def new_tree(self) -> Any:
        return self._suffix_tree(self.config.max_tree_depth)

    def global_tree(self) -> Any | None:
        """The global tree, or None while it is disabled or empty."""
        return self._global_tree if self._cached else None

    def cache_response(self, tokens: np.ndarray) -> None:
        """Adds one response to the global tree, evicting the oldest beyond the bound."""
        limit = self.config.max_cached_requests
        if limit == 0 or tokens.size == 0:
            return
        seq_id = self._next_seq_id
        self._next_seq_id = (self._next_seq_id + 1) & 0x7FFFFFFF
        if seq_id in self._cached:  # wrapped around after 2^31 responses
            self._global_tree.remove(seq_id)
            del self._cached[seq_id]
        self._global_tree.extend_ndarray(seq_id, tokens)
        self._cached[seq_id] = None
        while limit > 0 and len(self._cached) > limit:
            oldest, _ = self._cached.popitem(last=False)
            self._global_tree.remove(oldest)


class SuffixCall(CallLifecycle):
    """One request: its own tree (prompt + response) and the server's global tree."""

    accepts_lists = True

    def __init__(self, server: SuffixDecodingServer) -> None:
        super().__init__()
        self._server = server
        self._config = server.config
        self._local: Any = None
        self._response: list[int] = []
        # The last max_tree_depth + 1 tokens of the request, sentinel-padded in front.
        self._context = np.full(self._config.max_tree_depth + 1, _SENTINEL, dtype=np.int32)

    def _push_context(self, tokens: Any) -> None:
        n = self._context.size
        k = len(tokens)
        if k >= n:
            self._context[:] = tokens[-n:]
        else:
            self._context[: n - k] = self._context[k:]
            self._context[n - k :] = tokens

    def _begin(self, prompt: np.ndarray) -> None:
        self._local = self._server.new_tree()
        if prompt.size:
            self._local.extend_ndarray(0, prompt)
        self._push_context(prompt)

    def _propose(self, max_tokens: int) -> list[int]:
        cfg = self._config
        args = (
            min(max_tokens, cfg.max_spec_tokens),
            cfg.max_spec_factor,
            cfg.max_spec_offset,
            cfg.min_token_prob,
            False,  # path draft, not tree
        )
        best = self._local.speculate_ndarray(self._context, *args)
        source = "request"
        global_tree = self._server.global_tree()
        if global_tree is not None:
            other = global_tree.speculate_ndarray(self._context, *args)
            if other.score > best.score:  # ties go to the request tree, as in the cache
                best, source = other, "global"
        draft = list(best.token_ids)
        if draft:
            self.last_match_length, self.last_source = int(best.match_len), source
        return draft

    def _accept(self, committed: Any) -> None:
        # A list goes through the engine's list overload, as vLLM's sampled ids do.
        if isinstance(committed, list):
            self._local.extend(0, committed)
        else:
            self._local.extend_ndarray(0, committed)
        self._response.extend(committed)
        self._push_context(committed)

    def _end(self) -> None:
        if self._response:
            self._server.cache_response(np.array(self._response, dtype=np.int32))
        self._local = None
        self._response = []
