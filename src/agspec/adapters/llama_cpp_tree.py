"""llama.cpp: verify a drafter's token tree in one `llama_decode` (greedy, one request).

`generate` (`agspec.adapters.llama_cpp`) comes here when its drafter drafts trees
(`propose_tree`, `agspec.drafter.tree`) and decoding is greedy. Each step evaluates the
pending token and every node of the tree in one batch: each branch of the tree (one per
leaf) is a llama.cpp sequence that holds the prefix by reference, a node is tagged with
the sequences of the branches through it at position prefix + its depth, so it sees the
prefix, its ancestors and itself (`SlotDecoder.decode`). The walk down the tree is
`agspec.drafter.tree.greedy_tree_path`, the transformers adapter's; then only the
accepted path's KV stays (`SlotDecoder.keep_path`). A tree that is a chain is decoded as
a chain, in one sequence.

A `llama_cpp.Llama` context has one sequence (llama-cpp-python sets no `n_seq_max`), so
trees run in a second context on the same model weights: one slot of the Llama's
`n_ctx` tokens with one sequence id per possible branch, in one unified KV buffer (a
branch's copy of the prefix changes the cells' sequence sets, no KV data is copied). It is
made once per `Llama` and kept (`tree_decoder`); like the Llama's own cache, it keeps the
last call's tokens, and the next prompt that shares a prefix evaluates only the rest.

Example with concrete tokens: the prompt ends in 7, the tree is `[8, 9, 4]`, parents
`[-1, 0, 0]`; one batch evaluates 7 at position p (branches 0 and 1), 8 at p + 1 (0, 1),
9 and 4 at p + 2 (0; 1); the argmax rows read 8 after 7, 4 after 8 and 2 after 4:
commit `[8, 4, 2]`, keep the KV of 7, 8 and 4.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from agspec.adapters.llama_cpp import GenerationResult, StepStats, record_step
from agspec.adapters.llama_cpp_batch import SlotDecoder, common_prefix_length
from agspec.drafter.protocol import CallDrafter
from agspec.drafter.tree import DraftTree, check_tree, greedy_tree_path

__all__ = ["fit_branches", "generate_tree", "prefill_tree", "tree_decoder"]

_DECODER_ATTR = "_agspec_tree_decoder"


def tree_decoder(llm: Any, *, max_branches: int) -> SlotDecoder:
    """The tree context of `llm` (made on first use, kept on the Llama object): one slot
    of `llm.n_ctx()` tokens, `max_branches` sequence ids, `llm.n_batch` tokens a batch."""
    dec = getattr(llm, _DECODER_ATTR, None)
    if dec is not None and dec.branches_per_slot >= max_branches and not dec._closed:
        return dec  # type: ignore[no-any-return]
    if dec is not None:
        dec.close()
    dec = SlotDecoder(
        llm,
        num_slots=1,
        slot_ctx_tokens=int(llm.n_ctx()),
        n_batch=int(llm.n_batch),
        threads=int(llm.n_threads),
        branches_per_slot=max(1, max_branches),
        # The Llama's own attention kernels, so a tree step computes what its chain
        # step would (llama-cpp-python turns flash attention off unless asked).
        flash_attn_type=int(llm.context_params.flash_attn_type),
    )
    setattr(llm, _DECODER_ATTR, dec)
    return dec


def prefill_tree(
    llm: Any, prompt_ids: Sequence[int], *, max_branches: int, reuse_prefix: bool = True
) -> int:
    """Evaluates the prompt but its last token in `llm`'s tree context (`tree_decoder`),
    keeping the longest cached prefix when `reuse_prefix`; returns how many prompt tokens
    were reused. `generate_tree` starts with it; a benchmark that prefills before timing
    the decoding calls it too."""
    dec = tree_decoder(llm, max_branches=max_branches)
    prompt = [int(t) for t in prompt_ids]
    reused = common_prefix_length(dec.cached[0], prompt[:-1]) if reuse_prefix else 0
    dec.keep(0, reused)
    for start in range(reused, len(prompt) - 1, dec.n_batch):
        dec.decode([(0, prompt[start : min(start + dec.n_batch, len(prompt) - 1)], 0, 0)])
    return reused


def fit_branches(tree: DraftTree, max_branches: int) -> DraftTree:
    """The longest node prefix of `tree` with at most `max_branches` leaves (a prefix in
    node order is a tree; its root paths are the tree's).

    >>> fit_branches(DraftTree([7, 8, 4, 5], [-1, 0, -1, -1]), 2)
    DraftTree([7, 8, 4], [-1, 0, -1])
    """
    parents = tree.parents
    leaves = 0
    has_child = [False] * len(parents)
    for i, par in enumerate(parents):
        # Node i is a new leaf; its parent stops being one.
        leaves += 1
        if par >= 0 and not has_child[par]:
            has_child[par] = True
            leaves -= 1
        if leaves > max_branches:
            return DraftTree(tree.token_ids[:i], parents[:i], check=False)
    return tree


def generate_tree(
    llm: Any,
    prompt_ids: Sequence[int],
    drafter: CallDrafter,
    max_new_tokens: int,
    *,
    max_nodes: int = 16,
    eos_token_ids: Sequence[int] | None = None,
    reuse_prefix: bool = True,
    on_step: Callable[[StepStats], None] | None = None,
    on_commit: Callable[[list[int]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> GenerationResult:
    """Greedy speculative decoding with a tree drafter (see the module docstring): the
    output equals plain greedy decoding token for token, up to llama.cpp's batched
    kernels flipping a near-tie. `StepStats.drafted_tokens` counts tree nodes."""
    propose_tree = getattr(drafter, "propose_tree", None)
    if propose_tree is None:
        raise TypeError(f"{type(drafter).__name__} has no propose_tree(): use generate()")
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("prompt_ids is empty: llama.cpp needs at least one token (e.g. BOS)")
    dec = tree_decoder(llm, max_branches=max(1, max_nodes))
    n_ctx = dec.slot_ctx_tokens
    if len(prompt) >= n_ctx:
        raise ValueError(f"prompt has {len(prompt)} tokens; the context holds {n_ctx}")
    eos = set(eos_token_ids) if eos_token_ids is not None else {llm.token_eos()}
    t0 = time.perf_counter()
    reused = prefill_tree(llm, prompt, max_branches=max(1, max_nodes), reuse_prefix=reuse_prefix)
    prefill_ms = (time.perf_counter() - t0) * 1000.0
    result = GenerationResult(tokens=[], prompt_tokens=len(prompt), reused_prompt_tokens=reused)
    pending = prompt[-1]
    drafter.begin(prompt)
    try:
        while len(result.tokens) < max_new_tokens:
            if should_stop is not None and should_stop():
                result.stopped_by = "cancelled"
                break
            base = len(dec.cached[0])
            room = n_ctx - base - 1  # positions left after the pending token
            if room < 0:
                result.stopped_by = "context"
                break
            want = min(max_nodes, max_new_tokens - len(result.tokens) - 1, room)
            t_draft = time.perf_counter()
            tree = propose_tree(want) if want > 0 else DraftTree([], [])
            if not isinstance(tree, DraftTree):
                raise TypeError(f"propose_tree must return a DraftTree, got {type(tree).__name__}")
            # Refused before anything is decoded: a parent out of range or not earlier.
            check_tree(tree.token_ids, tree.parents, what="the drafter's tree")
            if len(tree) > max(want, 0):
                raise ValueError(
                    f"the drafter proposed {len(tree)} nodes, more than the {want} asked for"
                )
            tree = fit_branches(tree, dec.branches_per_slot)
            t_verify = time.perf_counter()
            tokens = tree.token_ids
            chain = tree.is_chain
            rows = dec.decode(
                [(0, [pending, *tokens], 0, 1 + len(tokens))],
                trees=None if chain else {0: tree.parents},
            )
            argmax = rows.argmax(axis=1).tolist()  # [1 + nodes]: the model's next tokens
            path = greedy_tree_path(tree, argmax)
            committed = [tokens[i] for i in path] + [argmax[path[-1] + 1 if path else 0]]
            # KV keeps the pending token and the accepted path; the bonus is pending now.
            if chain:
                dec.keep(0, base + 1 + len(path))
            else:
                dec.keep_path(0, path)
            t_end = time.perf_counter()
            committed, stop = record_step(
                result, committed, accepted=len(path), drafted=len(tokens),
                draft_ms=(t_verify - t_draft) * 1000.0, verify_ms=(t_end - t_verify) * 1000.0,
                eos=eos, max_new_tokens=max_new_tokens, on_step=on_step, drafter=drafter,
                on_commit=on_commit,
            )  # fmt: skip
            pending = committed[-1]
            if stop is not None:
                break
    finally:
        drafter.end()
    result.prefill_ms = prefill_ms
    result.total_ms = (time.perf_counter() - t0) * 1000.0
    return result
