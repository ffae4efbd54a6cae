"""HF transformers: verify a token tree in one forward (greedy, batch 1).

`generate_with_tree_drafter` runs its own greedy loop over a causal LM with a KV cache:
each step feeds the last committed token and every node of the drafter's tree
(`propose_tree`, `agspec.drafter.tree`) in one forward, with a tree attention mask (a
node sees the cache, the last token, its ancestors and itself) and tree position ids
(the last token's position plus the node's depth). The model's greedy token after the
last token and after every node is read from that one pass; the committed tokens are the
longest root path the model agrees with plus its own next token (the bonus), exactly
what plain greedy decoding writes. The cache then keeps the last token and the accepted
path's entries only, so the next step starts as if the path had been decoded token by
token.

A drafter without `propose_tree` is verified as a chain (`propose`). Sampled decoding is
not verified as a tree here: at temperature > 0 use `generate_with_drafter` (chains,
transformers' own rejection sampling).

Example with concrete tokens: the prompt ends in 7; the tree `[8, 9, 4]`, parents
`[-1, 0, 0]` is fed as `[7, 8, 9, 4]` at positions `p, p+1, p+2, p+2`; the model's
argmax after 7 is 8, after 8 is 4, after 4 is 2: commit `[8, 4, 2]`, keep the cache of
7, 8 and 4.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

from agspec.adapters.transformers import DraftStats, _import_torch_transformers
from agspec.drafter.protocol import CallDrafter
from agspec.drafter.tree import DraftTree, check_tree, greedy_tree_path

__all__ = ["generate_with_tree_drafter", "tree_attention"]


def tree_attention(parents: list[int], past_tokens: int) -> tuple[list[list[int]], list[int]]:
    """For the last token (row 0) and each node (row i + 1): the rows it attends to among
    the new ones (its ancestors and itself) and its depth (0 for the last token).

    >>> tree_attention([-1, 0, 0], 5)
    ([[0], [0, 1], [0, 1, 2], [0, 1, 3]], [0, 1, 2, 2])
    """
    rows = [[0]]
    depth = [0]
    for i, par in enumerate(parents):
        up = par + 1  # the parent's row (0: the last token)
        rows.append([*rows[up], i + 1])
        depth.append(depth[up] + 1)
    return rows, depth


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def _keep_cache(cache: Any, keep: Any) -> None:
    """Keeps only the cache entries at positions `keep` (a LongTensor), in every layer."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        for layer in layers:
            layer.keys = layer.keys.index_select(2, keep)
            layer.values = layer.values.index_select(2, keep)
        return
    keys, values = getattr(cache, "key_cache", None), getattr(cache, "value_cache", None)
    if keys is None or values is None:
        raise TypeError(f"cannot select entries of a {type(cache).__name__} cache")
    for i in range(len(keys)):
        keys[i] = keys[i].index_select(2, keep)
        values[i] = values[i].index_select(2, keep)


def generate_with_tree_drafter(
    model: Any,
    input_ids: Any,
    drafter: CallDrafter,
    *,
    max_new_tokens: int,
    max_nodes: int = 16,
    eos_token_id: int | list[int] | None = None,
) -> tuple[list[int], DraftStats]:
    """Greedy generation of up to `max_new_tokens` tokens after `input_ids` ([1, n]),
    each step verifying the drafter's tree (at most `max_nodes` nodes) in one forward.
    Returns (the new tokens, per-step stats: nodes drafted, accept length). Stops after
    an EOS token (`eos_token_id`, default the model's generation config's)."""
    torch, _ = _import_torch_transformers()
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(
            f"input_ids must have shape [1, seq_len >= 1], got {tuple(input_ids.shape)}"
        )
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or max_new_tokens < 1
    ):
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or not 0 <= max_nodes <= 256:
        raise ValueError(f"max_nodes must be an int in [0, 256], got {max_nodes!r}")
    if eos_token_id is None:
        eos_token_id = getattr(model.generation_config, "eos_token_id", None)
    eos = (
        set()
        if eos_token_id is None
        else ({eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id))
    )
    # transformers 5 names the cache argument `cache`, earlier ones `past_key_values`.
    cache_kw = (
        "cache" if "cache" in inspect.signature(model.forward).parameters else ("past_key_values")
    )
    propose_tree = getattr(drafter, "propose_tree", None)
    prompt = [int(t) for t in input_ids[0].tolist()]
    device = input_ids.device
    min_value = torch.finfo(model.dtype).min
    stats = DraftStats()
    generated: list[int] = []
    drafter.begin(prompt)
    try:
        with torch.no_grad():
            cache = None
            past = len(prompt) - 1  # tokens in the cache; the last one is fed next
            if past:
                cache = _cache_of(model(input_ids[:, :-1], use_cache=True))
            last = prompt[-1]
            while len(generated) < max_new_tokens:
                t0 = time.perf_counter()
                if propose_tree is not None:
                    tree = propose_tree(max_nodes)
                    if not isinstance(tree, DraftTree):
                        raise TypeError(
                            f"propose_tree must return a DraftTree, got {type(tree).__name__}"
                        )
                    check_tree(tree.token_ids, tree.parents, what="the drafter's tree")
                else:
                    tree = DraftTree.chain(drafter.propose(max_nodes))
                stats.draft_ms.append((time.perf_counter() - t0) * 1e3)
                tokens, parents = tree.token_ids, tree.parents
                if len(tokens) > max_nodes:
                    raise ValueError(
                        f"the drafter proposed {len(tokens)} nodes, more than the {max_nodes} "
                        "asked for"
                    )
                rows, depth = tree_attention(parents, past)
                n = len(rows)
                allowed = torch.zeros(n, past + n, dtype=torch.bool, device=device)
                allowed[:, :past] = True
                for r, seen in enumerate(rows):
                    allowed[r, [past + j for j in seen]] = True
                mask = torch.zeros(1, 1, n, past + n, dtype=model.dtype, device=device)
                mask.masked_fill_(~allowed, min_value)
                positions = torch.tensor([[past + d for d in depth]], device=device)
                feed = torch.tensor([[last, *tokens]], device=device)
                out = model(
                    feed,
                    attention_mask=mask,
                    position_ids=positions,
                    use_cache=True,
                    **{cache_kw: cache},
                )
                cache = _cache_of(out)
                argmax = out.logits[0].argmax(-1).tolist()  # [n]: the model's next tokens
                # Walk down the tree while the model agrees: row 0 is the last token.
                path = greedy_tree_path(tree, argmax)
                committed = [tokens[i] for i in path] + [argmax[path[-1] + 1 if path else 0]]
                keep = torch.tensor(
                    [*range(past + 1), *(past + 1 + i for i in path)], device=device
                )
                _keep_cache(cache, keep)
                past += 1 + len(path)
                committed = committed[: max_new_tokens - len(generated)]
                stop = next((k for k, t in enumerate(committed) if t in eos), None)
                if stop is not None:
                    committed = committed[: stop + 1]
                stats.drafted_tokens.append(len(tokens))
                stats.accepted_tokens.append(min(len(path), len(committed)))
                drafter.accept(committed)
                generated += committed
                last = committed[-1]
                if stop is not None or len(committed) <= len(path):
                    # An EOS, or the budget ended inside the accepted path (the bonus
                    # token was not kept): nothing more to decode.
                    break
    finally:
        drafter.end()
    return generated, stats
