"""Every baseline drafter family by name, each a `DrafterServer` built the same way.

    make_family(name, *, global_docs=..., tokenizer=..., cost_model=..., batch_size=...)

`global_docs` is the global corpus as a list of token-id lists (e.g. outputs of other
sessions); families that keep no global corpus (PLD, SuffixDecoding's per-request tree)
ignore it, except SuffixDecoding, which caches them as earlier responses (see
`agspec.baselines.suffix`). `tokenizer` (an object with `.encode(text)`, or a name for
`agspec.tokenizers.get_tokenizer`) turns artifact text into tokens; only `fastcoder` reads
artifacts. `cost_model` and `batch_size` are accepted so every drafter factory has one
signature; no baseline uses them (their draft lengths are fixed before serving, which is
what the comparison is about).

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

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from agspec.drafter.protocol import DrafterServer

FAMILY_NAMES: tuple[str, ...] = (
    "pld-hf",
    "pld-vllm",
    "rest",
    "sam-fixed",
    "sam-scaled",
    "suffix-64",
    "suffix-24",
    "suffix-64-local",
    "suffix-cache",
    "suffix-cache-24",
    "suffix-cache-local",
    "fastcoder",
)


def _pld(name: str, docs: list[Sequence[int]], tokenizer: Any) -> DrafterServer:
    from agspec.baselines.pld import PLD_HF, PLD_VLLM, PLDServer

    return PLDServer(PLD_HF if name == "pld-hf" else PLD_VLLM)


def _rest(name: str, docs: list[Sequence[int]], tokenizer: Any) -> DrafterServer:
    from agspec.baselines.rest import RestServer

    return RestServer(global_docs=docs)


def _sam(name: str, docs: list[Sequence[int]], tokenizer: Any) -> DrafterServer:
    from agspec.baselines.sam import SAM_FIXED, SAM_SCALED, SamServer

    return SamServer(SAM_FIXED if name == "sam-fixed" else SAM_SCALED, global_docs=docs)


def _suffix(name: str, docs: list[Sequence[int]], tokenizer: Any) -> DrafterServer:
    from agspec.baselines.suffix import (
        SUFFIX_24,
        SUFFIX_64,
        SUFFIX_64_LOCAL,
        SuffixDecodingServer,
    )

    config = {"suffix-64": SUFFIX_64, "suffix-24": SUFFIX_24, "suffix-64-local": SUFFIX_64_LOCAL}
    # The per-request-only variant keeps no global tree, so no global corpus either.
    return SuffixDecodingServer(config[name], global_docs=docs if name != "suffix-64-local" else [])


def _suffix_cache(name: str, docs: list[Sequence[int]], tokenizer: Any) -> DrafterServer:
    from agspec.baselines.suffix_cache import (
        SUFFIX_CACHE_24,
        SUFFIX_CACHE_64,
        SUFFIX_CACHE_LOCAL,
        SuffixCacheServer,
    )

    config = {
        "suffix-cache": SUFFIX_CACHE_64,
        "suffix-cache-24": SUFFIX_CACHE_24,
        "suffix-cache-local": SUFFIX_CACHE_LOCAL,
    }[name]
    return SuffixCacheServer(config, global_docs=docs if name != "suffix-cache-local" else [])


def _fastcoder(name: str, docs: list[Sequence[int]], tokenizer: Any) -> DrafterServer:
    from agspec.baselines.fastcoder import FastCoderServer

    return FastCoderServer(global_docs=docs, tokenizer=tokenizer)


_FACTORIES: dict[str, Callable[[str, list[Sequence[int]], Any], DrafterServer]] = {
    "pld-hf": _pld,
    "pld-vllm": _pld,
    "rest": _rest,
    "sam-fixed": _sam,
    "sam-scaled": _sam,
    "suffix-64": _suffix,
    "suffix-24": _suffix,
    "suffix-64-local": _suffix,
    "suffix-cache": _suffix_cache,
    "suffix-cache-24": _suffix_cache,
    "suffix-cache-local": _suffix_cache,
    "fastcoder": _fastcoder,
}


def make_family(
    name: str,
    *,
    global_docs: Iterable[Sequence[int]] | None = None,
    tokenizer: Any = None,
    cost_model: Any = None,
    batch_size: int = 1,
) -> DrafterServer:
    """A fresh server of the named baseline family (names: `FAMILY_NAMES`)."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown baseline {name!r}; known: {', '.join(FAMILY_NAMES)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if isinstance(tokenizer, str):
        from agspec.tokenizers import get_tokenizer

        tokenizer = get_tokenizer(tokenizer)
    if tokenizer is not None and not callable(getattr(tokenizer, "encode", None)):
        raise TypeError("tokenizer must have .encode(text) -> list[int] (or be a tokenizer name)")
    if isinstance(global_docs, (str, bytes)):
        raise TypeError("global_docs must be a list of token-id lists")
    docs = list(global_docs) if global_docs is not None else []
    return _FACTORIES[name](name, docs, tokenizer)
