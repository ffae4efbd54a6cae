"""SuffixDecoding driven the way vLLM drives it: arctic-inference's `SuffixDecodingCache`.

`suffix.py` runs SuffixDecoding on the engine's bare trees with the lab's conventions (a
response enters the global tree when its call ends). This module is the cross-check: it
makes no decision of its own and calls `arctic_inference.suffix_decoding.SuffixDecodingCache`
in the order and with the arguments of vLLM's `SuffixDecodingProposer`
(`vllm/v1/spec_decode/suffix_decoding.py`, method `"suffix"`):

- first sight of a request: `start_request(req_id, prompt)` with the prompt as a 1-D int32
  numpy array (vLLM passes a slice of `input_batch.token_ids_cpu`, which takes the cache's
  zero-copy path);
- every step: `add_active_response(req_id, sampled_ids)` with the tokens the step
  committed as a Python list (vLLM's `sampled_token_ids` rows), then
  `speculate(req_id, pattern, max_spec_tokens, max_spec_factor, min_token_prob)` with
  `pattern` the last `max_tree_depth` tokens of prompt + output as an int32 array view;
- a request that left the batch: `stop_request(req_id)`.

`suffix-cache-tree` is the same drive with `use_tree_spec=True`, SuffixDecoding's tree
mode (its paper's main configuration, which vLLM does not run: its proposer verifies
chains): `propose_tree` returns the cache's token tree (`DraftTree`, the same ids and
parents) and the lab verifies it as a tree; `propose` returns its first branch.

So a response enters the global tree token by token (it helps the request itself and any
request running beside it at once), and the pattern has no extra token in front: the
engine tries match lengths up to `max_tree_depth - 1`. Those are the two differences from
`suffix-64`. `global_docs`, when given, are served first as earlier requests with an
empty prompt (`start_request`, `add_active_response`, `stop_request`), which leaves the
cache holding them as cached responses, as `suffix-64` does.

In the lab's protocol `begin` is vLLM's first sight and `accept` the next step's
`add_active_response`; the first draft of a call comes from the prompt alone (vLLM drafts
first after the prefill's token, the lab's simulator before it; both count that token).

Example with concrete tokens (`SUFFIX_CACHE_64`, empty cache):

    >>> server = SuffixCacheServer(SUFFIX_CACHE_64)
    >>> call = server.session("s").call("coder", "code", 0)
    >>> call.begin([1, 2, 3, 4, 5, 6, 1, 2, 3])   # "1 2 3" occurred, then 4 5 6 ...
    >>> call.propose(8)                           # match 3 x factor 1.0 -> 3 tokens
    [4, 5, 6]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from agspec.baselines._base import (
    CallLifecycle,
    StaticSession,
    check_global_docs,
    check_session_args,
)
from agspec.baselines.suffix import SuffixConfig
from agspec.drafter.tree import DraftTree

SUFFIX_CACHE_64 = SuffixConfig(name="suffix-cache", max_tree_depth=64, max_cached_requests=-1)
SUFFIX_CACHE_24 = SuffixConfig(name="suffix-cache-24", max_tree_depth=24, max_cached_requests=10000)
SUFFIX_CACHE_TREE = SuffixConfig(
    name="suffix-cache-tree", max_tree_depth=64, max_cached_requests=-1
)
SUFFIX_CACHE_LOCAL = SuffixConfig(
    name="suffix-cache-local", max_tree_depth=64, max_cached_requests=0
)


def import_suffix_cache() -> Any:
    """arctic-inference's `SuffixDecodingCache`, or an ImportError naming the extra."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as exc:
        raise ImportError(
            "the suffix-cache baselines run on arctic-inference 0.3.0, which is not installed: "
            "pip install 'agspec[suffix]' (see docs/baselines-suffix.md for a CPU-only machine)"
        ) from exc
    return SuffixDecodingCache


class SuffixCacheServer:
    """One `SuffixDecodingCache` for every session of the server, as one vLLM engine has."""

    def __init__(
        self,
        config: SuffixConfig = SUFFIX_CACHE_64,
        *,
        global_docs: Iterable[Sequence[int]] | None = None,
        use_tree_spec: bool = False,
    ) -> None:
        self.config = config
        self.use_tree_spec = bool(use_tree_spec)
        self.name = config.name
        self.cache = import_suffix_cache()(
            max_tree_depth=config.max_tree_depth,
            max_cached_requests=config.max_cached_requests,
        )
        self._next_request = 0
        for doc in check_global_docs(global_docs):
            if config.max_cached_requests == 0 or doc.size == 0:
                continue
            req_id = self.new_request_id()
            self.cache.start_request(req_id, doc[:0])
            self.cache.add_active_response(req_id, doc)
            self.cache.stop_request(req_id)

    def new_request_id(self) -> int:
        """A request id never used before in this server (vLLM's ids are unique too)."""
        self._next_request += 1
        return self._next_request

    def session(self, session_id: str, *, emission_format: str = "none") -> StaticSession:
        check_session_args(session_id, emission_format)
        # SuffixDecoding keeps no per-session state: artifacts are not indexed.
        return StaticSession(self, session_id)

    def make_call(self) -> SuffixCacheCall:
        """One request's drafter (used by the shared `StaticSession`)."""
        if self.use_tree_spec:
            return SuffixCacheTreeCall(self)
        return SuffixCacheCall(self)


class SuffixCacheCall(CallLifecycle):
    """One request, driven through the server's cache as vLLM's proposer drives it."""

    accepts_lists = True  # committed tokens reach the cache as the list the lab hands over

    def __init__(self, server: SuffixCacheServer) -> None:
        super().__init__()
        self._server = server
        self._cache = server.cache
        self._config = server.config
        self._req_id: int | None = None
        # vLLM's `token_ids_cpu` row: prompt + output so far, int32, grown by doubling.
        self._tokens = np.zeros(0, dtype=np.int32)
        self._num_tokens = 0

    def _begin(self, prompt: np.ndarray) -> None:
        self._req_id = self._server.new_request_id()
        self._tokens = np.zeros(max(2 * prompt.size, 1024), dtype=np.int32)
        self._tokens[: prompt.size] = prompt
        self._num_tokens = prompt.size
        self._cache.start_request(self._req_id, self._tokens[: prompt.size])

    def _speculate(self, max_tokens: int, use_tree_spec: bool) -> Any:
        cfg = self._config
        n = self._num_tokens
        pattern = self._tokens[max(0, n - cfg.max_tree_depth) : n]
        kwargs = {"use_tree_spec": True} if use_tree_spec else {}
        draft = self._cache.speculate(
            self._req_id,
            pattern,
            max_spec_tokens=min(max_tokens, cfg.max_spec_tokens),
            max_spec_factor=cfg.max_spec_factor,
            min_token_prob=cfg.min_token_prob,
            **kwargs,
        )
        if draft.token_ids:
            self.last_match_length = int(draft.match_len)
            # The cache does not say which tree won; recorded as SuffixDecoding's.
            self.last_source = "suffix-cache"
        return draft

    def _propose(self, max_tokens: int) -> list[int]:
        tokens: list[int] = self._speculate(max_tokens, False).token_ids
        return tokens

    def _accept(self, committed: Any) -> None:
        self._cache.add_active_response(self._req_id, committed)
        n = self._num_tokens
        need = n + len(committed)
        if need > self._tokens.size:
            grown = np.zeros(2 * need, dtype=np.int32)
            grown[:n] = self._tokens[:n]
            self._tokens = grown
        self._tokens[n:need] = committed
        self._num_tokens = need

    def _end(self) -> None:
        if self._req_id is not None:
            self._cache.stop_request(self._req_id)
        self._req_id = None
        self._tokens = np.zeros(0, dtype=np.int32)
        self._num_tokens = 0


class SuffixCacheTreeCall(SuffixCacheCall):
    """`SuffixCacheCall` in the cache's tree mode: `propose_tree` drafts a token tree.

    >>> server = SuffixCacheServer(SUFFIX_CACHE_TREE, use_tree_spec=True)
    >>> call = server.session("s").call("coder", "code", 0)
    >>> call.begin([1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 6, 7, 1, 2, 3, 4, 6, 8, 1, 2, 3])
    >>> call.propose_tree(8)         # after "1 2 3": 4, then 6 (seen twice) or 5
    DraftTree([4, 6, 5], [-1, 0, 0])
    >>> call.propose(8)              # a chain: the first branch
    [4, 6]
    """

    def propose_tree(self, max_nodes: int) -> DraftTree:
        self._require_begun("propose_tree")
        if isinstance(max_nodes, bool) or not isinstance(max_nodes, (int, np.integer)):
            raise TypeError(f"max_nodes must be an int, got {type(max_nodes).__name__}")
        if max_nodes < 0:
            raise ValueError(f"max_nodes must be >= 0, got {max_nodes}")
        self.last_match_length, self.last_source = None, None
        if max_nodes == 0:
            return DraftTree([], [], check=False)
        draft = self._speculate(int(max_nodes), True)
        # The cache's trees are topological (a parent before its children): checked.
        return DraftTree(draft.token_ids, draft.parents)

    def _propose(self, max_tokens: int) -> list[int]:
        # An engine that takes chains: the tree's first branch.
        return self.propose_tree(max_tokens).first_branch()
