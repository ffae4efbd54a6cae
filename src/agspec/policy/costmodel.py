"""What one verification step costs, relative to one plain decoding step, and p* from it.

`step_cost(n_tokens, batch_size)` is the time of one forward pass that verifies `n_tokens`
tokens per sequence at batch size B, divided by the time of one plain decoding step
(n = 1) at the same B, so `step_cost(1, B) == 1.0`. Two sources:

- `RooflineCostModel`: analytic, from the model's shape, bytes per weight and per KV
  element, the context length and the accelerator's bandwidth and FLOP/s.
  `time = max(memory_bytes / bandwidth, flops / flop_rate) + overhead`.
- `ProfileCostModel`: measured, from an `agspec-cost-profile` JSON file (written by
  `agspec costmodel measure` on llama.cpp, or `scripts/gpu_verify_profile.py` on a GPU).

`break_even_accept_prob(model, B)` is p*, the acceptance probability at which one more
draft position pays for its verification (docs/costmodel.md derives it).

Example: a model whose verification costs 1.0, 1.1, 1.2, ... decode steps for n = 1, 2,
3, ... has Δc = 0.1 per extra position, so p* = 0.1: a draft position accepted with
probability above 0.1 is worth verifying.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "CostModel",
    "ModelShape",
    "Accelerator",
    "RooflineCostModel",
    "ProfileCostModel",
    "CostProfileError",
    "MODEL_SHAPES",
    "ACCELERATORS",
    "break_even_accept_prob",
    "get_cost_model",
    "list_cost_models",
    "P_STAR_MIN",
    "P_STAR_MAX",
]

P_STAR_MIN = 0.01
P_STAR_MAX = 0.99
PROFILE_FORMAT = "agspec-cost-profile"
PROFILE_VERSION = 1


@runtime_checkable
class CostModel(Protocol):
    """Cost of verifying `n_tokens` per sequence at `batch_size`, in plain decode steps."""

    def step_cost(self, n_tokens: int, batch_size: int) -> float: ...

    def step_time_ms(self, n_tokens: int, batch_size: int) -> float: ...


def _check_step_args(n_tokens: int, batch_size: int) -> None:
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 1:
        raise ValueError(f"n_tokens must be an int >= 1, got {n_tokens!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")


# --------------------------------------------------------------------------- roofline
@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """A decoder-only transformer's shape, as in its config.json.

    `sliding_window_tokens` / `global_every_layers`: Gemma 3 attends over a 1024-token
    window in 5 of every 6 layers (every 6th layer is global); None means every layer is
    global.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool = False
    sliding_window_tokens: int | None = None
    global_every_layers: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{self.name}: {name} must be >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: num_heads must be a multiple of num_kv_heads")

    @property
    def layer_params(self) -> int:
        """Weights of one layer: q, k, v, o projections and a gated MLP (norms, biases ignored)."""
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        return q + kv + o + mlp

    @property
    def matmul_params(self) -> int:
        """Weights every token multiplies by: all layers and the LM head (not the embedding
        lookup, which reads B·n rows)."""
        return self.num_layers * self.layer_params + self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        embed = self.vocab_size * self.hidden_size
        return self.matmul_params + (0 if self.tied_embeddings else embed)

    def attended_tokens(self, context_tokens: int) -> list[int]:
        """Keys each layer attends over at this context length."""
        out = []
        for i in range(self.num_layers):
            is_global = (
                self.sliding_window_tokens is None
                or self.global_every_layers is None
                or (i + 1) % self.global_every_layers == 0
            )
            window = self.sliding_window_tokens
            out.append(
                context_tokens if is_global or window is None else min(context_tokens, window)
            )
        return out


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    name: str
    memory_bytes_per_s: float
    flop_per_s: float
    source: str = ""


# Shapes from each model's config.json on the Hugging Face hub (docs/costmodel-profiles.md).
MODEL_SHAPES: dict[str, ModelShape] = {
    "qwen2.5-7b": ModelShape(
        name="Qwen2.5-7B",
        num_layers=28,
        hidden_size=3584,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=18944,
        vocab_size=152064,
        tied_embeddings=False,
    ),
    "qwen2.5-32b": ModelShape(
        name="Qwen2.5-32B",
        num_layers=64,
        hidden_size=5120,
        num_heads=40,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=27648,
        vocab_size=152064,
        tied_embeddings=False,
    ),
    "gemma3-27b": ModelShape(
        name="Gemma3-27B",
        num_layers=62,
        hidden_size=5376,
        num_heads=32,
        num_kv_heads=16,
        head_dim=128,
        intermediate_size=21504,
        vocab_size=262208,
        tied_embeddings=True,
        sliding_window_tokens=1024,
        global_every_layers=6,
    ),
}

ACCELERATORS: dict[str, Accelerator] = {
    # NVIDIA H200 SXM datasheet: 4.8 TB/s HBM3e, 989 TFLOP/s dense bf16 (1979 with sparsity).
    "h200": Accelerator(
        name="H200",
        memory_bytes_per_s=4.8e12,
        flop_per_s=989e12,
        source="NVIDIA H200 datasheet (dense bf16)",
    ),
}


@dataclass(frozen=True, kw_only=True)
class RooflineCostModel:
    """Analytic step time: max(memory time, compute time) + a fixed overhead.

    Memory: every weight is read once per step, plus the KV cache of all B sequences.
    Compute: 2·params·B·n for the matmuls plus 4·n·keys·heads·head_dim per layer and
    sequence for attention (QKᵀ and PV).

    >>> m = get_cost_model("h200-qwen2.5-7b", context_tokens=4096)
    >>> m.step_cost(1, 1)
    1.0
    >>> round(m.step_time_ms(1, 1), 2)  # 14.1 GB of matmul weights at 4.8 TB/s + 0.3 ms
    3.29
    """

    shape: ModelShape
    accelerator: Accelerator
    context_tokens: int
    weight_bytes_per_param: float = 2.0
    kv_bytes_per_element: float = 2.0
    overhead_ms: float = 0.3

    def __post_init__(self) -> None:
        if self.context_tokens < 0:
            raise ValueError(f"context_tokens must be >= 0, got {self.context_tokens}")
        if self.weight_bytes_per_param <= 0 or self.kv_bytes_per_element <= 0:
            raise ValueError("bytes per weight and per KV element must be > 0")
        if self.accelerator.memory_bytes_per_s <= 0 or self.accelerator.flop_per_s <= 0:
            raise ValueError("accelerator bandwidth and FLOP/s must be > 0")
        if self.overhead_ms < 0:
            raise ValueError(f"overhead_ms must be >= 0, got {self.overhead_ms}")

    def memory_bytes(self, n_tokens: int, batch_size: int) -> float:
        s = self.shape
        weights = s.matmul_params * self.weight_bytes_per_param
        kv_per_token_layer = 2 * s.num_kv_heads * s.head_dim * self.kv_bytes_per_element
        keys = sum(self.shape.attended_tokens(self.context_tokens + n_tokens))
        return weights + batch_size * keys * kv_per_token_layer

    def flops(self, n_tokens: int, batch_size: int) -> float:
        s = self.shape
        tokens = batch_size * n_tokens
        attention = sum(
            4 * n_tokens * keys * s.num_heads * s.head_dim
            for keys in s.attended_tokens(self.context_tokens + n_tokens)
        )
        return 2.0 * s.matmul_params * tokens + batch_size * attention

    def step_time_ms(self, n_tokens: int, batch_size: int) -> float:
        _check_step_args(n_tokens, batch_size)
        memory_s = self.memory_bytes(n_tokens, batch_size) / self.accelerator.memory_bytes_per_s
        compute_s = self.flops(n_tokens, batch_size) / self.accelerator.flop_per_s
        return max(memory_s, compute_s) * 1e3 + self.overhead_ms

    def step_cost(self, n_tokens: int, batch_size: int) -> float:
        return self.step_time_ms(n_tokens, batch_size) / self.step_time_ms(1, batch_size)


# --------------------------------------------------------------------------- profile
class CostProfileError(ValueError):
    """A cost profile file that is not what `ProfileCostModel` expects."""


@dataclass(frozen=True)
class _BatchCurve:
    n_tokens: tuple[int, ...]
    step_ms: tuple[float, ...]

    def at(self, n: float) -> float:
        """Linear in n between measured points. Past the last, the mean slope from the
        point nearest half the last n (never below 0): a CPU's staircase makes the last
        segment fall when it ends on a tile end (31 -> 32 tokens: 188 -> 174 ms), which
        would make every longer step cheaper.

        >>> _BatchCurve((1, 16, 31, 32), (18.0, 92.0, 188.0, 174.0)).at(48)
        256.0
        """
        ns, ts = self.n_tokens, self.step_ms
        if n <= ns[0]:
            if len(ns) == 1 or n == ns[0]:
                return ts[0]
            lo = 0
        elif n >= ns[-1]:
            if len(ns) == 1 or n == ns[-1]:
                return ts[-1]
            half = min(range(len(ns) - 1), key=lambda i: abs(ns[i] - ns[-1] / 2))
            slope = max(0.0, (ts[-1] - ts[half]) / (ns[-1] - ns[half]))
            return ts[-1] + slope * (n - ns[-1])
        else:
            lo = max(i for i in range(len(ns) - 1) if ns[i] <= n)
        n0, n1, t0, t1 = ns[lo], ns[lo + 1], ts[lo], ts[lo + 1]
        return max(t0 + (t1 - t0) * (n - n0) / (n1 - n0), 1e-9)


@dataclass(frozen=True)
class ProfileCostModel:
    """Measured step times, interpolated.

    In n: linear between measured n; beyond the largest measured n, the mean slope of its
    upper half (`_BatchCurve.at`; n = 1 must be measured: it is the unit). In B: linear
    between the two nearest measured batch sizes (the relative cost is the ratio of
    interpolated times); below the smallest, the smallest; above the largest, B_max, a
    step of B requests verifying n tokens each costs what the n * B tokens cost at B_max
    (time(n, B) = time(n * B / B_max, B_max)): a step's cost follows its total tokens,
    so on a compute-bound CPU a draft at B = 32 is priced as dear as it is, not at B_max's
    relative cost.

    >>> m = ProfileCostModel.from_dict({"format": "agspec-cost-profile", "version": 1,
    ...     "backend": "llama.cpp", "model": "m", "device": "cpu", "context_tokens": 512,
    ...     "batch_sizes": {"1": {"n_tokens": [1, 2, 4], "step_ms": [10.0, 12.0, 20.0]}}})
    >>> m.step_cost(3, 1)
    1.6
    >>> m.step_time_ms(1, 2), m.step_cost(2, 2)  # B = 2: 2 and 4 tokens at B = 1
    (12.0, 1.6666666666666667)
    """

    backend: str
    model: str
    device: str
    context_tokens: int
    curves: Mapping[int, _BatchCurve]
    source: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ProfileCostModel:
        p = Path(path)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CostProfileError(f"{p}: no such cost profile file") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CostProfileError(f"{p}: not a readable JSON cost profile ({exc})") from None
        return cls.from_dict(data, source=str(p))

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<dict>") -> ProfileCostModel:
        def fail(msg: str) -> CostProfileError:
            return CostProfileError(f"{source}: {msg}")

        if not isinstance(data, dict):
            raise fail(f"expected a JSON object, got {type(data).__name__}")
        if data.get("format") != PROFILE_FORMAT:
            raise fail(f"format must be {PROFILE_FORMAT!r}, got {data.get('format')!r}")
        if data.get("version") != PROFILE_VERSION:
            raise fail(f"unsupported version {data.get('version')!r} (expected 1)")
        for key in ("backend", "model", "device", "context_tokens", "batch_sizes"):
            if key not in data:
                raise fail(f"missing field {key!r}")
        ctx = data["context_tokens"]
        if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 0:
            raise fail(f"context_tokens must be an int >= 0, got {ctx!r}")
        batches = data["batch_sizes"]
        if not isinstance(batches, dict) or not batches:
            raise fail("batch_sizes must be a non-empty object keyed by batch size")
        curves: dict[int, _BatchCurve] = {}
        for key, entry in batches.items():
            try:
                b = int(key)
            except (TypeError, ValueError):
                raise fail(f"batch size key {key!r} is not an integer") from None
            if b < 1:
                raise fail(f"batch size {b} must be >= 1")
            where = f"batch_sizes[{key!r}]"
            if not isinstance(entry, dict) or "n_tokens" not in entry or "step_ms" not in entry:
                raise fail(f"{where} must have 'n_tokens' and 'step_ms' lists")
            ns, ts = entry["n_tokens"], entry["step_ms"]
            if not isinstance(ns, list) or not isinstance(ts, list) or len(ns) != len(ts):
                raise fail(f"{where}: n_tokens and step_ms must be lists of equal length")
            if not ns:
                raise fail(f"{where}: no measurements")
            if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in ns):
                raise fail(f"{where}: n_tokens must be ints >= 1")
            if any(a >= c for a, c in zip(ns, ns[1:])):
                raise fail(f"{where}: n_tokens must be strictly increasing, got {ns}")
            if ns[0] != 1:
                raise fail(f"{where}: n_tokens must start at 1 (the plain decode step)")
            if any(
                isinstance(t, bool)
                or not isinstance(t, (int, float))
                or not math.isfinite(t)
                or t <= 0
                for t in ts
            ):
                raise fail(f"{where}: step_ms must be finite numbers > 0")
            curves[b] = _BatchCurve(tuple(ns), tuple(float(t) for t in ts))
        known = {"format", "version", "backend", "model", "device", "context_tokens", "batch_sizes"}
        return cls(
            backend=str(data["backend"]),
            model=str(data["model"]),
            device=str(data["device"]),
            context_tokens=ctx,
            curves=dict(sorted(curves.items())),
            source=source,
            extra={k: v for k, v in data.items() if k not in known},
        )

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(self.curves)

    def step_time_ms(self, n_tokens: int, batch_size: int) -> float:
        _check_step_args(n_tokens, batch_size)
        bs = self.batch_sizes
        if batch_size <= bs[0]:
            return self.curves[bs[0]].at(n_tokens)
        if batch_size >= bs[-1]:
            return self.curves[bs[-1]].at(n_tokens * batch_size / bs[-1])
        hi = min(b for b in bs if b >= batch_size)
        lo = max(b for b in bs if b <= batch_size)
        t_lo = self.curves[lo].at(n_tokens)
        if hi == lo:
            return t_lo
        t_hi = self.curves[hi].at(n_tokens)
        return t_lo + (t_hi - t_lo) * (batch_size - lo) / (hi - lo)

    def step_cost(self, n_tokens: int, batch_size: int) -> float:
        return self.step_time_ms(n_tokens, batch_size) / self.step_time_ms(1, batch_size)


# --------------------------------------------------------------------------- p*
def break_even_accept_prob(
    cost_model: CostModel,
    batch_size: int,
    n_tokens: int | tuple[int, int] = (1, 16),
) -> float:
    """p*: the acceptance probability at which one more draft position pays for itself.

    Verifying one more position costs Δc = step_cost(n+1, B) − step_cost(n, B) decode
    steps and returns one token with probability p; a decode step returns one token per
    unit of cost, so the position pays when p > Δc: p* = Δc, clipped to [0.01, 0.99].
    `n_tokens=(lo, hi)` averages Δc over n = lo..hi (the range a drafter uses; default
    1..16); an int takes Δc at that n.

    Example: costs 1.0 at n=1 and 2.5 at n=17 give Δc = 1.5 / 16 ≈ 0.094, so p* ≈ 0.094.
    """
    if isinstance(n_tokens, tuple):
        lo, hi = n_tokens
        if lo < 1 or hi < lo:
            raise ValueError(f"n_tokens range must satisfy 1 <= lo <= hi, got {n_tokens}")
    else:
        lo = hi = n_tokens
    delta = (cost_model.step_cost(hi + 1, batch_size) - cost_model.step_cost(lo, batch_size)) / (
        hi + 1 - lo
    )
    return min(max(delta, P_STAR_MIN), P_STAR_MAX)


# --------------------------------------------------------------------------- presets
_SHIPPED = "data/costmodels"


def _shipped_profiles() -> dict[str, list[tuple[int, str]]]:
    """Measured profiles shipped with the package: preset name -> [(context, file name)]."""
    out: dict[str, list[tuple[int, str]]] = {}
    root = resources.files("agspec").joinpath(_SHIPPED)
    if not root.is_dir():
        return out
    for entry in root.iterdir():
        name = entry.name
        if not name.endswith(".json") or "-ctx" not in name:
            continue
        base, _, ctx = name[: -len(".json")].rpartition("-ctx")
        if ctx.isdigit():
            out.setdefault(f"{base}-measured", []).append((int(ctx), name))
    return out


def list_cost_models() -> list[str]:
    """Preset names for `get_cost_model`."""
    roofline = [f"{a}-{m}" for a in ACCELERATORS for m in MODEL_SHAPES]
    return sorted(roofline + list(_shipped_profiles()))


def get_cost_model(name: str, *, context_tokens: int = 4096, **overrides: Any) -> CostModel:
    """A preset: `"<accelerator>-<model>"` (roofline, e.g. `"h200-qwen2.5-32b"`) or
    `"<accelerator>-<model>-measured"` (a shipped profile; the one measured at the
    context nearest to `context_tokens`). Roofline overrides: any `RooflineCostModel` field.
    """
    shipped = _shipped_profiles()
    if name in shipped:
        if overrides:
            raise ValueError(f"{name}: a measured profile takes no overrides ({set(overrides)})")
        _, fname = min(shipped[name], key=lambda cf: (abs(cf[0] - context_tokens), cf[0]))
        path = resources.files("agspec").joinpath(_SHIPPED).joinpath(fname)
        return ProfileCostModel.from_dict(
            json.loads(path.read_text(encoding="utf-8")), source=f"agspec/{_SHIPPED}/{fname}"
        )
    accel_name, _, model_name = name.partition("-")
    if accel_name not in ACCELERATORS or model_name not in MODEL_SHAPES:
        raise ValueError(f"unknown cost model {name!r}; known: {', '.join(list_cost_models())}")
    return RooflineCostModel(
        shape=MODEL_SHAPES[model_name],
        accelerator=ACCELERATORS[accel_name],
        context_tokens=context_tokens,
        **overrides,
    )


def relative_costs(cost_model: CostModel, batch_size: int, n_values: Sequence[int]) -> list[float]:
    """`step_cost(n, B)` for each n (a convenience for tables)."""
    return [cost_model.step_cost(n, batch_size) for n in n_values]


def _table(profile: str, roofline: str, n_values: Sequence[int]) -> str:
    """Markdown: measured vs roofline relative costs and p* at each shipped context."""
    shipped = _shipped_profiles().get(profile)
    if not shipped:
        raise ValueError(f"no shipped profile {profile!r}; known: {sorted(_shipped_profiles())}")
    head = " | ".join(f"n={n}" for n in n_values)
    lines = [
        f"| context | B | source | n=1 ms | {head} | p* (n 1..16) |",
        "|---|---|---|---|" + "---|" * len(n_values) + "---|",
    ]
    for ctx, _ in sorted(shipped):
        measured = get_cost_model(profile, context_tokens=ctx)
        analytic = get_cost_model(roofline, context_tokens=ctx)
        batch_sizes = measured.batch_sizes if isinstance(measured, ProfileCostModel) else (1,)
        for b in batch_sizes:
            for label, m in (("measured", measured), ("roofline", analytic)):
                costs = " | ".join(f"{m.step_cost(n, b):.2f}" for n in n_values)
                lines.append(
                    f"| {ctx} | {b} | {label} | {m.step_time_ms(1, b):.2f} | {costs} | "
                    f"{break_even_accept_prob(m, b):.3f} |"
                )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m agspec.policy.costmodel table`: measured against roofline costs and p*
    (docs/costmodel-profiles.md)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m agspec.policy.costmodel")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="measured vs roofline relative costs and p*")
    t.add_argument("--profile", default="h200-qwen2.5-7b-measured")
    t.add_argument("--roofline", default="h200-qwen2.5-7b")
    t.add_argument("--n", default="1,2,4,8,16,32")
    sub.add_parser("list", help="preset names")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        print("\n".join(list_cost_models()))
        return 0
    n_values = [int(x) for x in args.n.split(",")]
    print(_table(args.profile, args.roofline, n_values))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
