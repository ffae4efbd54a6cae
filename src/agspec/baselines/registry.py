"""Every baseline drafter family by name: `BASELINES`, a registry of drafter factories.

    make_family(name, *, global_docs=..., tokenizer=..., cost_model=..., batch_size=...)
    BASELINES.get(name)(DrafterContext(...))       # the same, from a built context

Each entry is a `DrafterFactory` (`agspec.drafter.factory`): it reads the context's
`global_docs` (the global corpus as token-id lists, e.g. outputs of other sessions;
families that keep no global corpus, PLD and SuffixDecoding's per-request tree, ignore
it, and SuffixDecoding caches them as earlier responses, see `agspec.baselines.suffix`)
and `tokenizer` (an object with `.encode(text)`; only `fastcoder` reads artifacts). No
baseline reads `cost_model`, `batch_size` or `caps`: their draft lengths are fixed before
serving, which is what the comparison is about.

Engines are imported when a family is made, so a missing optional engine fails there,
with the extra to install.

Example:
    >>> server = make_family("rest", global_docs=[[1, 2, 3, 4]])
    >>> call = server.session("s").call("coder", "code", 0)
    >>> call.begin([7, 2, 3])
    >>> call.propose(4)
    [4]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from agspec._registry import Registry
from agspec.drafter.factory import DrafterContext, DrafterFactory
from agspec.drafter.protocol import DrafterServer


def _pld(name: str, ctx: DrafterContext) -> DrafterServer:
    from agspec.baselines.pld import PLD_HF, PLD_VLLM, PLDServer

    return PLDServer(PLD_HF if name == "pld-hf" else PLD_VLLM)


def _rest(ctx: DrafterContext) -> DrafterServer:
    from agspec.baselines.rest import RestServer

    return RestServer(global_docs=list(ctx.global_docs))


def _sam(name: str, ctx: DrafterContext) -> DrafterServer:
    from agspec.baselines.sam import SAM_FIXED, SAM_SCALED, SamServer

    config = SAM_FIXED if name == "sam-fixed" else SAM_SCALED
    return SamServer(config, global_docs=list(ctx.global_docs))


def _suffix(name: str, ctx: DrafterContext) -> DrafterServer:
    from agspec.baselines.suffix import (
        SUFFIX_24,
        SUFFIX_64,
        SUFFIX_64_LOCAL,
        SuffixDecodingServer,
    )

    config = {"suffix-64": SUFFIX_64, "suffix-24": SUFFIX_24, "suffix-64-local": SUFFIX_64_LOCAL}
    # The per-request-only variant keeps no global tree, so no global corpus either.
    docs = list(ctx.global_docs) if name != "suffix-64-local" else []
    return SuffixDecodingServer(config[name], global_docs=docs)


def _suffix_cache(name: str, ctx: DrafterContext) -> DrafterServer:
    from agspec.baselines.suffix_cache import (
        SUFFIX_CACHE_24,
        SUFFIX_CACHE_64,
        SUFFIX_CACHE_LOCAL,
        SUFFIX_CACHE_TREE,
        SuffixCacheServer,
    )

    config = {
        "suffix-cache": SUFFIX_CACHE_64,
        "suffix-cache-tree": SUFFIX_CACHE_TREE,
        "suffix-cache-24": SUFFIX_CACHE_24,
        "suffix-cache-local": SUFFIX_CACHE_LOCAL,
    }[name]
    docs = list(ctx.global_docs) if name != "suffix-cache-local" else []
    return SuffixCacheServer(config, global_docs=docs, use_tree_spec=name == "suffix-cache-tree")


def _fastcoder(ctx: DrafterContext) -> DrafterServer:
    from agspec.baselines.fastcoder import FastCoderServer

    return FastCoderServer(global_docs=list(ctx.global_docs), tokenizer=ctx.tokenizer)


BASELINES: Registry[DrafterFactory] = Registry("baseline")
_register = BASELINES.register
_register(
    "pld-hf",
    partial(_pld, "pld-hf"),
    help="prompt lookup (HF settings): n-gram in prompt + output, 10 tokens",
)
_register(
    "pld-vllm",
    partial(_pld, "pld-vllm"),
    help="prompt lookup (vLLM settings): n-gram in prompt + output, 5 tokens",
)
_register("rest", _rest, help="REST: datastore of global_docs, 10 tokens")
_register(
    "sam-fixed",
    partial(_sam, "sam-fixed"),
    help="SAM-Decoding: static + request automata, 39 tokens",
)
_register(
    "sam-scaled",
    partial(_sam, "sam-scaled"),
    help="SAM-Decoding: static + request automata, min(59, 4 x match)",
)
_register(
    "suffix-64",
    partial(_suffix, "suffix-64"),
    help="SuffixDecoding: global + per-request trees, depth 64",
)
_register(
    "suffix-24",
    partial(_suffix, "suffix-24"),
    help="SuffixDecoding: depth 24, FIFO of 10,000 responses",
)
_register(
    "suffix-64-local",
    partial(_suffix, "suffix-64-local"),
    help="SuffixDecoding, the per-request tree only (no global corpus)",
)
_register(
    "suffix-cache",
    partial(_suffix_cache, "suffix-cache"),
    help="as suffix-64 via SuffixDecodingCache, responses added token by token",
)
_register(
    "suffix-cache-tree",
    partial(_suffix_cache, "suffix-cache-tree"),
    help="as suffix-cache in SuffixDecoding's tree mode (use_tree_spec=True), verified as a tree",
)
_register(
    "suffix-cache-24",
    partial(_suffix_cache, "suffix-cache-24"),
    help="as suffix-24 via SuffixDecodingCache",
)
_register(
    "suffix-cache-local",
    partial(_suffix_cache, "suffix-cache-local"),
    help="as suffix-64-local via SuffixDecodingCache",
)
_register(
    "fastcoder",
    _fastcoder,
    help="FastCoder: repository files, common code, earlier outputs; 10 tokens",
)
del _register


def make_family(
    name: str,
    *,
    global_docs: Iterable[Sequence[int]] | None = None,
    tokenizer: Any = None,
    cost_model: Any = None,
    batch_size: int = 1,
) -> DrafterServer:
    """A fresh server of the named baseline family (names: `BASELINES.names()`)."""
    factory = BASELINES.get(name)
    if isinstance(tokenizer, str):
        from agspec.tokenizers import get_tokenizer

        tokenizer = get_tokenizer(tokenizer)
    if tokenizer is not None and not callable(getattr(tokenizer, "encode", None)):
        raise TypeError("tokenizer must have .encode(text) -> list[int] (or be a tokenizer name)")
    if isinstance(global_docs, (str, bytes)):
        raise TypeError("global_docs must be a list of token-id lists")
    docs = list(global_docs) if global_docs is not None else []
    ctx = DrafterContext(
        global_docs=docs, tokenizer=tokenizer, cost_model=cost_model, batch_size=batch_size
    )
    return factory(ctx)
