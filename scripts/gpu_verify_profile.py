#!/usr/bin/env python3
"""Measure the cost of one verification forward pass on a GPU and write AgSpec cost profiles.

A Qwen2.5-7B-shaped model (the real shape from the model's config.json, random bf16
weights, no downloads) verifies n = 1..33 tokens per sequence on top of a KV cache already
holding `context` tokens, at batch sizes 1 and 16, contexts 4k and 16k. One profile file per
context is written in the `agspec-cost-profile` v1 format (see docs/costmodel-profiles.md), which
`agspec.policy.costmodel.ProfileCostModel` loads.

What is timed, and why it is built this way:
- The KV cache is preallocated per (batch, context) and filled with random values: the
  cost of attention does not depend on the values, so no prefill is run. Each timed
  forward writes its n new keys/values in place at positions context..context+n-1 and
  attends over context+n keys (lower-right causal), like a serving engine's paged cache,
  and unlike transformers' DynamicCache, whose torch.cat would copy the whole cache on
  every step and inflate the cost of n = 1.
- Attention is a registered transformers attention function (`agspec_verify`) so that the
  grouped KV heads are read once (flash attention with GQA when the backend allows it),
  instead of transformers' default `repeat_kv` copy for masked SDPA. The variant used is
  chosen by a self-check against a reference at start and recorded in the profile.
- Each point is timed with CUDA events, after warm-up, as the median of several repeats, in
  two modes: eager (Python launches every kernel) and CUDA-graph replay (what serving
  engines do for decode steps, which removes the launch overhead that dominates small
  batches). The profile's `step_ms` is the graph mode when it worked, eager otherwise;
  both are kept.

Run on one H200:  python scripts/gpu_verify_profile.py --out $OUT/h200-qwen2.5-7b.json
Try on a CPU:     python scripts/gpu_verify_profile.py --tiny --out /tmp/tiny.json
`--out X.json` writes X-ctx<C>.json per context and X.json with everything (raw repeats).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

# Qwen2.5-7B, from its config.json (https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json).
QWEN25_7B_SHAPE: dict[str, Any] = {
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
# A tiny shape of the same family (GQA 4:1 kept) for a CPU check of the whole script.
TINY_SHAPE: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "max_position_embeddings": 4096,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}


@dataclass(frozen=True)
class Grid:
    contexts_tokens: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    n_tokens: tuple[int, ...]
    warmup: int
    repeats: int


FULL_GRID = Grid((4096, 16384), (1, 16), tuple(range(1, 34)), warmup=2, repeats=5)
PICK_N_VALUES = (1, 16, 33)
TINY_GRID = Grid((64, 256), (1, 4), tuple(range(1, 6)), warmup=1, repeats=3)


# --------------------------------------------------------------------------- attention
class KVBuffers:
    """Preallocated KV cache: per layer keys/values [B, kv_heads, context + pad(max_n), head_dim].

    Invariant: positions [0, context) hold the (random) context; each verification step
    writes its n tokens at [context, context + n) and attends over [0, context + n).
    """

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.context_tokens = 0

    def allocate(
        self,
        *,
        layers: int,
        batch: int,
        kv_heads: int,
        head_dim: int,
        context_tokens: int,
        max_n: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.release()
        # Room for the verified tokens plus padding (see _attn_folded).
        shape = (batch, kv_heads, context_tokens + round_up(max_n, 16) + 16, head_dim)
        gen = torch.Generator(device=device).manual_seed(0)
        for _ in range(layers):
            k = torch.empty(shape, dtype=dtype, device=device)
            v = torch.empty(shape, dtype=dtype, device=device)
            k.normal_(generator=gen)
            v.normal_(generator=gen)
            self.keys.append(k)
            self.values.append(v)
        self.context_tokens = context_tokens

    def release(self) -> None:
        self.keys.clear()
        self.values.clear()


KV = KVBuffers()


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _attn_reference(
    q: torch.Tensor, kbuf: torch.Tensor, vbuf: torch.Tensor, s: int, scale: float
) -> torch.Tensor:
    """Math reference: keys [0, s), repeated KV heads, lower-right causal mask, float32."""
    n = q.shape[2]
    group = q.shape[1] // kbuf.shape[1]
    k = kbuf[:, :, :s].repeat_interleave(group, dim=1).float()
    v = vbuf[:, :, :s].repeat_interleave(group, dim=1).float()
    scores = (q.float() @ k.transpose(-1, -2)) * scale
    i = torch.arange(n, device=q.device)[:, None]
    j = torch.arange(s, device=q.device)[None, :]
    scores = scores.masked_fill(j > (s - n) + i, float("-inf"))
    return (scores.softmax(-1) @ v).to(q.dtype)


# Each variant: q [B, H, n, d], KV buffers [B, Hkv, >= round_up(s, 16), d] of which keys
# [0, s) are valid (the last n are the tokens being verified); returns [B, H, n, d].
def _attn_flash_gqa(
    q: torch.Tensor, kbuf: torch.Tensor, vbuf: torch.Tensor, s: int, scale: float
) -> torch.Tensor:
    """Flash attention, lower-right causal, KV heads read once (enable_gqa)."""
    from torch.nn.attention.bias import causal_lower_right

    n = q.shape[2]
    k, v = kbuf[:, :, :s], vbuf[:, :, :s]
    if n == 1:  # one query sees every key: no mask needed
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=causal_lower_right(n, s), scale=scale, enable_gqa=True
    )


def _attn_folded(
    q: torch.Tensor, kbuf: torch.Tensor, vbuf: torch.Tensor, s: int, scale: float
) -> torch.Tensor:
    """Fold the query heads of one KV group into the query axis; explicit boolean mask.

    q [B, H, n, d] -> [B, Hkv, G*n, d] (row g*n + i is head g of the group, token i), so
    each KV head is read once by the memory-efficient kernel. The key axis is padded to a
    multiple of 16 (the padding is masked out): an unaligned mask costs the kernel a copy.
    """
    b, h, n, d = q.shape
    hkv = kbuf.shape[1]
    g = h // hkv
    s_pad = round_up(s, 16)
    qf = q.reshape(b, hkv, g * n, d)
    i = torch.arange(n, device=q.device).repeat(g)[:, None]
    j = torch.arange(s_pad, device=q.device)[None, :]
    mask = j <= (s - n) + i  # [G*n, s_pad]; also False for every padded key j >= s
    out = F.scaled_dot_product_attention(
        qf, kbuf[:, :, :s_pad], vbuf[:, :, :s_pad], attn_mask=mask, scale=scale
    )
    return out.reshape(b, h, n, d)


def _attn_repeat(
    q: torch.Tensor, kbuf: torch.Tensor, vbuf: torch.Tensor, s: int, scale: float
) -> torch.Tensor:
    """transformers' default for masked SDPA: copy KV heads G times, then SDPA."""
    from torch.nn.attention.bias import causal_lower_right

    group = q.shape[1] // kbuf.shape[1]
    k = kbuf[:, :, :s].repeat_interleave(group, dim=1)
    v = vbuf[:, :, :s].repeat_interleave(group, dim=1)
    n = q.shape[2]
    if n == 1:
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n, s), scale=scale)


ATTENTION_VARIANTS: dict[str, Callable[..., torch.Tensor]] = {
    "flash_gqa_lower_right": _attn_flash_gqa,
    "folded_gqa_mask": _attn_folded,
    "repeat_kv_lower_right": _attn_repeat,
}
CHOSEN: dict[str, Any] = {"variant": None, "passing": []}


def check_attention(
    device: torch.device, dtype: torch.dtype, *, heads: int, kv_heads: int, head_dim: int
) -> dict[str, Any]:
    """Which variants run here and match the reference (garbage beyond s must be ignored)."""
    report: dict[str, Any] = {}
    gen = torch.Generator(device=device).manual_seed(1)
    scale = head_dim**-0.5
    for name, fn in ATTENTION_VARIANTS.items():
        errs = []
        try:
            for n, s in ((1, 300), (5, 301), (33, 1000)):
                buf = (2, kv_heads, round_up(s, 16) + 16, head_dim)
                q = torch.randn(2, heads, n, head_dim, generator=gen, device=device, dtype=dtype)
                k = torch.randn(buf, generator=gen, device=device, dtype=dtype)
                v = torch.randn(buf, generator=gen, device=device, dtype=dtype)
                k[:, :, s:] = 1e4  # never attended: would dominate any output that used it
                got = fn(q, k, v, s, scale).float()
                ref = _attn_reference(q, k, v, s, scale).float()
                errs.append(float((got - ref).abs().max()))
        except Exception as exc:  # a backend refusing a layout is expected on some setups
            report[name] = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
            continue
        tol = 0.05 if dtype in (torch.bfloat16, torch.float16) else 1e-4
        report[name] = {"max_abs_err": max(errs), "ok": max(errs) <= tol}
    passing = [n for n, r in report.items() if isinstance(r, dict) and r["ok"]]
    if not passing:
        raise RuntimeError(f"no attention variant passed the self-check: {report}")
    CHOSEN["passing"] = passing
    CHOSEN["variant"] = passing[0]
    return {"checks": report, "passing": passing}


def pick_attention(
    device: torch.device, *, heads: int, n_values: tuple[int, ...]
) -> dict[str, float]:
    """Time the passing variants on layer 0's real KV buffers (this batch and context) for a
    few n; keep the fastest in total. Which kernel SDPA picks is not visible from here, and
    the best one differs between batch 1 and 16."""
    kbuf, vbuf = KV.keys[0], KV.values[0]
    b, _, _, d = kbuf.shape
    timer = Timer(device)
    totals: dict[str, float] = {}
    for name in CHOSEN["passing"]:
        total = 0.0
        for n in n_values:
            q = torch.randn(b, heads, n, d, device=device, dtype=kbuf.dtype)
            call = functools.partial(
                ATTENTION_VARIANTS[name], q, kbuf, vbuf, KV.context_tokens + n, d**-0.5
            )
            total += statistics.median(timer.time_ms(call, warmup=2, repeats=5))
        totals[name] = total
    CHOSEN["variant"] = min(totals, key=lambda k: totals[k])
    return totals


def verify_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: write the n new K/V in place, attend over ctx + n."""
    layer = module.layer_idx
    n = query.shape[2]
    c = KV.context_tokens
    kbuf, vbuf = KV.keys[layer], KV.values[layer]
    kbuf[:, :, c : c + n].copy_(key)
    vbuf[:, :, c : c + n].copy_(value)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = ATTENTION_VARIANTS[CHOSEN["variant"]](query, kbuf, vbuf, c + n, scale)
    return out.transpose(1, 2).contiguous(), None


# --------------------------------------------------------------------------- timing
class Timer:
    """CUDA events on a GPU; perf_counter (after nothing to sync) on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def time_ms(self, fn: Callable[[], Any], *, warmup: int, repeats: int) -> list[float]:
        for _ in range(warmup):
            fn()
        if not self.cuda:
            out = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e3)
            return out
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for s, e in zip(starts, ends, strict=True):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def device_ceilings(device: torch.device) -> dict[str, float]:
    """Copy bandwidth and bf16 matmul rate measured here (the roofline's ceilings)."""
    if device.type != "cuda":
        return {}
    timer = Timer(device)

    def copy_ms() -> float:
        src = torch.empty(2 * 1024**3, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        return statistics.median(timer.time_ms(lambda: dst.copy_(src), warmup=2, repeats=5))

    def matmul_ms() -> float:
        m = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        return statistics.median(timer.time_ms(lambda: m @ m, warmup=3, repeats=10))

    c_ms, mm_ms = copy_ms(), matmul_ms()
    torch.cuda.empty_cache()
    return {
        "copy_bytes_per_s": 2 * 2 * 1024**3 / (c_ms / 1e3),  # read + write
        "bf16_matmul_flop_per_s": 2 * 8192**3 / (mm_ms / 1e3),
    }


def build_model(shape: dict[str, Any], device: torch.device, dtype: torch.dtype) -> Any:
    from transformers import AttentionInterface, Qwen2Config, Qwen2ForCausalLM

    AttentionInterface.register("agspec_verify", verify_attention)
    cfg = Qwen2Config(**shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM._from_config(cfg, dtype=dtype, attn_implementation="agspec_verify")
    model.eval()
    return model


def check_forward(
    model: Any, device: torch.device, *, context: int = 48, n: int = 5, batch: int = 2
) -> dict[str, float]:
    """The timed forward computes real verification logits: compare with transformers' SDPA.

    Reference: a plain causal forward over context + n tokens (no cache). Ours: the context's
    K/V from a DynamicCache prefill copied into KVBuffers, then the n tokens verified by
    `verify_attention`. Returns the largest absolute logit difference and the logit scale.
    """
    from transformers import DynamicCache

    shape = model.config
    ids = torch.randint(0, shape.vocab_size, (batch, context + n), device=device)
    model.set_attn_implementation("sdpa")
    ref = model(input_ids=ids, use_cache=False).logits[:, context:].float()
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True)
    model.set_attn_implementation("agspec_verify")
    head_dim = shape.hidden_size // shape.num_attention_heads
    KV.allocate(
        layers=shape.num_hidden_layers,
        batch=batch,
        kv_heads=shape.num_key_value_heads,
        head_dim=head_dim,
        context_tokens=context,
        max_n=n,
        dtype=model.dtype,
        device=device,
    )
    for i, layer in enumerate(cache.layers):
        KV.keys[i][:, :, :context].copy_(layer.keys)
        KV.values[i][:, :, :context].copy_(layer.values)
    pos = (torch.arange(n, device=device) + context).unsqueeze(0).expand(batch, n)
    mask = torch.ones(batch, 1, n, n, dtype=torch.bool, device=device)
    ours = model(
        input_ids=ids[:, context:], position_ids=pos, attention_mask=mask, use_cache=False
    ).logits.float()
    KV.release()
    return {
        "max_abs_diff": float((ours - ref).abs().max()),
        "logit_abs_max": float(ref.abs().max()),
        "argmax_agree": float((ours.argmax(-1) == ref.argmax(-1)).float().mean()),
    }


def measure_point(
    model: Any,
    timer: Timer,
    *,
    batch: int,
    context: int,
    n: int,
    grid: Grid,
    device: torch.device,
    use_graphs: bool,
) -> dict[str, Any]:
    """Time one verification forward of n tokens per sequence, eager and (GPU) graph replay."""
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, n), device=device)
    pos = (torch.arange(n, device=device) + context).unsqueeze(0).expand(batch, n).contiguous()
    # A prepared 4D mask is passed through untouched by transformers; verify_attention
    # ignores it (it applies the lower-right causal mask itself).
    mask = torch.ones(batch, 1, n, n, dtype=torch.bool, device=device)

    def step() -> Any:
        return model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=False).logits

    eager = timer.time_ms(step, warmup=grid.warmup, repeats=grid.repeats)
    point: dict[str, Any] = {"eager_ms": eager}
    if use_graphs:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        point["graph_ms"] = timer.time_ms(g.replay, warmup=grid.warmup, repeats=2 * grid.repeats)
        del g
    return point


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--out",
        required=True,
        type=Path,
        help="X.json: writes X-ctx<C>.json per context and X.json (raw)",
    )
    ap.add_argument("--tiny", action="store_true", help="tiny model and grid (CPU check)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--no-graphs", action="store_true", help="eager timing only")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="stop measuring new points after this many seconds (files still written)",
    )
    ap.add_argument(
        "--pick-per-config",
        action="store_true",
        help="one attention variant per (context, batch) instead of per n (the behaviour "
        "of the run that produced the shipped H200 profile)",
    )
    args = ap.parse_args(argv)

    t_start = time.perf_counter()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if not args.tiny and device.type != "cuda":
        print("the full grid needs a GPU; use --tiny on a CPU", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = TINY_SHAPE if args.tiny else QWEN25_7B_SHAPE
    grid = TINY_GRID if args.tiny else FULL_GRID
    use_graphs = device.type == "cuda" and not args.no_graphs
    timer = Timer(device)

    import transformers

    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "dtype": str(dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
    }
    print(f"[profile] {env}", flush=True)
    attention = check_attention(
        device,
        dtype,
        heads=shape["num_attention_heads"],
        kv_heads=shape["num_key_value_heads"],
        head_dim=head_dim,
    )
    print(f"[profile] attention: {attention}", flush=True)
    ceilings = device_ceilings(device)
    print(f"[profile] ceilings: {ceilings}", flush=True)
    # The code path, checked on a tiny float32 model first with every passing attention
    # variant (cheap on any device). Recorded, not fatal: one GPU run must still come back.
    tiny = build_model(TINY_SHAPE, device, torch.float32)
    forward_check: dict[str, Any] = {}
    with torch.inference_mode():
        for name in list(CHOSEN["passing"]):
            CHOSEN["variant"] = name
            fc: dict[str, Any] = check_forward(tiny, device)
            fc["ok"] = fc["max_abs_diff"] <= 1e-3 * max(1.0, fc["logit_abs_max"])
            forward_check[name] = fc
            if not fc["ok"]:
                print(f"[profile] WARNING: {name}: forward differs from SDPA", flush=True)
                CHOSEN["passing"].remove(name)
    del tiny
    print(f"[profile] forward check (tiny, float32): {forward_check}", flush=True)
    if not CHOSEN["passing"]:
        raise RuntimeError(f"no attention variant passed the forward check: {forward_check}")
    model = build_model(shape, device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"[profile] model built: {n_params / 1e9:.3f}B params "
        f"({time.perf_counter() - t_start:.1f} s)",
        flush=True,
    )

    results: dict[str, Any] = {}
    chosen_by_config: dict[str, str] = {}
    graph_error: str | None = None
    stopped_early = False
    with torch.inference_mode():
        for context in grid.contexts_tokens:
            for batch in grid.batch_sizes:
                KV.allocate(
                    layers=shape["num_hidden_layers"],
                    batch=batch,
                    kv_heads=shape["num_key_value_heads"],
                    head_dim=head_dim,
                    context_tokens=context,
                    max_n=max(grid.n_tokens),
                    dtype=dtype,
                    device=device,
                )
                pick_n = tuple(sorted({min(x, max(grid.n_tokens)) for x in PICK_N_VALUES}))
                picked = pick_attention(device, heads=shape["num_attention_heads"], n_values=pick_n)
                chosen_by_config[f"{context}/{batch}"] = CHOSEN["variant"]
                print(
                    f"[profile] ctx={context} B={batch}: attention {CHOSEN['variant']} "
                    f"(ms for n={pick_n}, one layer: {picked})",
                    flush=True,
                )
                attention.setdefault("picked", {})[f"{context}/{batch}"] = picked
                rows: dict[str, Any] = {}
                for n in grid.n_tokens:
                    if time.perf_counter() - t_start > args.budget_s:
                        stopped_early = True
                        break
                    per_n: dict[str, float] | None = None
                    if not args.pick_per_config:
                        # The fastest kernel can change with n (e.g. SDPA's GQA flash path
                        # for n = 1 has no masked counterpart): pick for this very n.
                        per_n = pick_attention(
                            device, heads=shape["num_attention_heads"], n_values=(n,)
                        )
                    try:
                        point = measure_point(
                            model,
                            timer,
                            batch=batch,
                            context=context,
                            n=n,
                            grid=grid,
                            device=device,
                            use_graphs=use_graphs,
                        )
                    except Exception as exc:
                        if not use_graphs:
                            raise
                        graph_error = f"{type(exc).__name__}: {str(exc)[:300]}"
                        print(f"[profile] CUDA graphs off: {graph_error}", flush=True)
                        use_graphs = False
                        torch.cuda.synchronize()
                        point = measure_point(
                            model,
                            timer,
                            batch=batch,
                            context=context,
                            n=n,
                            grid=grid,
                            device=device,
                            use_graphs=False,
                        )
                    point["attention"] = CHOSEN["variant"]
                    if per_n is not None:
                        point["attention_layer_ms"] = per_n
                    rows[str(n)] = point
                    med_e = statistics.median(point["eager_ms"])
                    med_g = (
                        statistics.median(point["graph_ms"]) if "graph_ms" in point else math.nan
                    )
                    print(
                        f"[profile] ctx={context} B={batch} n={n}: eager {med_e:.3f} ms, "
                        f"graph {med_g:.3f} ms",
                        flush=True,
                    )
                results[f"{context}/{batch}"] = rows
                KV.release()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                if stopped_early:
                    break
            if stopped_early:
                break

    elapsed = time.perf_counter() - t_start
    raw = {
        "format": "agspec-cost-profile-raw",
        "version": 1,
        "env": env,
        "shape": shape,
        "attention": attention,
        "forward_check": forward_check,
        "ceilings": ceilings,
        "graph_error": graph_error,
        "grid": grid.__dict__,
        "stopped_early": stopped_early,
        "elapsed_s": elapsed,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(raw, indent=1))
    model_name = "tiny-qwen2" if args.tiny else "Qwen2.5-7B-shape (random bf16 weights)"
    for context in grid.contexts_tokens:
        batch_sizes: dict[str, Any] = {}
        for batch in grid.batch_sizes:
            rows = results.get(f"{context}/{batch}", {})
            if not rows:
                continue
            ns = sorted(int(k) for k in rows)
            all_graph = all("graph_ms" in rows[str(k)] for k in ns)
            key = "graph_ms" if all_graph else "eager_ms"
            batch_sizes[str(batch)] = {
                "n_tokens": ns,
                "step_ms": [round(statistics.median(rows[str(k)][key]), 4) for k in ns],
                "step_ms_eager": [
                    round(statistics.median(rows[str(k)]["eager_ms"]), 4) for k in ns
                ],
                "timing": "cuda_graph" if all_graph else "eager",
                "attention": [rows[str(k)]["attention"] for k in ns],
            }
        if not batch_sizes:
            continue
        profile = {
            "format": "agspec-cost-profile",
            "version": 1,
            "backend": f"transformers {env['transformers']} / torch {env['torch']}",
            "model": model_name,
            "device": env["device_name"],
            "context_tokens": context,
            "batch_sizes": batch_sizes,
            "notes": (
                f"median of {grid.repeats} (eager) / {2 * grid.repeats} (graph) timed "
                f"forwards after {grid.warmup} warm-ups, CUDA events; attention variant per "
                f"point as recorded; written by scripts/gpu_verify_profile.py"
            ),
        }
        path = args.out.with_name(f"{args.out.stem}-ctx{context}{args.out.suffix}")
        path.write_text(json.dumps(profile, indent=1))
        print(f"[profile] wrote {path}", flush=True)
    print(f"[profile] done in {elapsed:.1f} s (stopped_early={stopped_early})", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
