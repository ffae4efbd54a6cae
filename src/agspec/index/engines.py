"""Retrieval engines by name: a factory of empty indexes (`AgSpecConfig.engine`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agspec._registry import Registry
from agspec.index.token_index import TokenIndex

# Makes an empty index. The native `TokenIndex` by default; any object with the same
# `extend / extend_list / match / num_tokens` interface works (docs/design.md,
# "Retrieval engines"), e.g. `agspec.index.suffix_tree.SuffixTreeIndex`.
IndexFactory = Callable[[], Any]


def _native_index() -> Any:
    return TokenIndex()


def _suffix_tree_index() -> Any:
    from agspec.index.suffix_tree import SuffixTreeIndex

    # Depth 96 = AgSpec's longest match (64) + SuffixDecoding's longest draft (32): at the
    # tree's default depth 64 a long match leaves no room to draft (docs/baselines-suffix.md).
    return SuffixTreeIndex(max_depth=96)


ENGINES: Registry[IndexFactory] = Registry("index engine")
ENGINES.register("native", _native_index, help="the native token index (C++)")
ENGINES.register(
    "suffix-tree",
    _suffix_tree_index,
    help="SuffixDecoding's suffix tree, depth 96 (arctic-inference, the `suffix` extra)",
)
