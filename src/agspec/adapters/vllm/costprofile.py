"""A cost profile of a vLLM engine, measured by vLLM itself: how long one engine step takes
when every request of a batch of B verifies n tokens (its bonus token plus n - 1 drafts).

The profile is what AgSpec's cost-aware draft length (`length_mode="cost"`) plans with
(`agspec.policy.costmodel.ProfileCostModel`, format `agspec-cost-profile`). It is measured inside
a real `LLM(...)`: a `custom_class` proposer (`FixedDraftProposer`) drafts n tokens the
model does not predict for every row, with n changing every step in a fixed cycle, so all
lengths are measured interleaved under the same machine load; the step of length n is the
time from one `propose` call to the next (scheduling, the forward pass over 1 + n tokens
per request, rejection sampling, output processing: everything a step costs the engine).

    $VPY -m agspec.adapters.vllm profile FOLDER --out vllm-cpu.json

Only steps where exactly B requests were decoding (none in prefill, none finishing) count;
the figure per (B, n) is the median over the cycles.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ENV_OUT = "AGSPEC_VLLM_PROFILE_OUT"
ENV_CYCLE = "AGSPEC_VLLM_PROFILE_CYCLE"
PROPOSER = f"{__name__}.FixedDraftProposer"
DEFAULT_DRAFTS = (0, 1, 2, 3, 4, 6, 8, 12, 16)


class FixedDraftProposer:
    """Drafts `cycle[step % len(cycle)]` copies of a token the model does not predict for
    every decoding row, and appends one JSON line per step to $AGSPEC_VLLM_PROFILE_OUT:
    the step's start time, the draft length it asked the next step to verify, and the rows
    (request ids) it drafted for."""

    def __init__(self, vllm_config: Any) -> None:
        cycle = os.environ.get(ENV_CYCLE, "")
        self.cycle = [int(x) for x in cycle.split(",") if x] or list(DEFAULT_DRAFTS)
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        if max(self.cycle) > self.k or min(self.cycle) < 0:
            raise ValueError(f"draft lengths {self.cycle} must be in [0, {self.k}]")
        # The highest id of the embedding table: padding past the tokenizer's vocabulary,
        # never the greedy choice of a trained model, so every draft token is rejected.
        self.token = int(vllm_config.model_config.get_vocab_size()) - 1
        self.step = 0
        out = os.environ.get(ENV_OUT)
        self._out = open(out, "a", encoding="utf-8") if out else None  # noqa: SIM115
        self._runner: Any = None

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No model."""

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: Any,
        token_ids_cpu: Any,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        t = time.perf_counter()
        n = self.cycle[self.step % len(self.cycle)]
        self.step += 1
        decoding = [i for i, s in enumerate(sampled_token_ids) if s]
        rows = len(sampled_token_ids)
        if self._out is not None:
            self._out.write(
                json.dumps(
                    {
                        "t": t,
                        "n": n,
                        "rows": rows,
                        "decoding": len(decoding),
                        "committed": [len(sampled_token_ids[i]) for i in decoding],
                    }
                )
                + "\n"
            )
            self._out.flush()
        draft = [self.token] * n
        return [list(draft) if s else [] for s in sampled_token_ids]


def step_times(records: Sequence[dict[str, Any]], batch_size: int) -> dict[int, list[float]]:
    """Step times (ms) per draft length from the proposer's records: record j's length
    is verified by the step that ends at record j + 1; both must have all `batch_size`
    rows decoding, and the step must have committed one token per row (every draft
    token rejected, as the proposer intends)."""
    out: dict[int, list[float]] = {}
    for a, b in zip(records, records[1:]):
        if a["decoding"] != batch_size or a["rows"] != batch_size:
            continue
        if b["decoding"] != batch_size or b["rows"] != batch_size:
            continue
        if any(c != 1 for c in b["committed"]):
            continue
        out.setdefault(int(a["n"]) + 1, []).append(1e3 * (b["t"] - a["t"]))
    return out


def measure(
    model: str | os.PathLike[str],
    *,
    batch_sizes: Sequence[int] = (1, 8),
    drafts: Sequence[int] = DEFAULT_DRAFTS,
    context_tokens: int = 1024,
    cycles: int = 12,
    warmup_cycles: int = 2,
    num_speculative_tokens: int = 16,
    max_model_len: int = 2048,
    dtype: str = "bfloat16",
    model_name: str | None = None,
) -> dict[str, Any]:
    """Runs one engine and returns an `agspec-cost-profile` dict (n_tokens = 1 + draft)."""
    drafts = sorted(set(int(d) for d in drafts))
    if not drafts or drafts[0] != 0:
        raise ValueError(f"drafts must include 0 (the plain decode step), got {drafts}")
    if drafts[-1] > num_speculative_tokens:
        raise ValueError(f"drafts must be <= num_speculative_tokens ({num_speculative_tokens})")
    steps = (cycles + warmup_cycles) * len(drafts) + 2
    if context_tokens + steps + 2 > max_model_len:
        raise ValueError(
            f"context_tokens + {steps} measured steps exceeds max_model_len {max_model_len}"
        )
    from vllm import LLM, SamplingParams

    with tempfile.TemporaryDirectory(prefix="agspec-vllm-profile-") as tmp:
        path = Path(tmp) / "steps.jsonl"
        os.environ[ENV_OUT] = str(path)
        os.environ[ENV_CYCLE] = ",".join(map(str, drafts))
        try:
            llm = LLM(
                model=str(model),
                enforce_eager=True,
                max_model_len=max_model_len,
                dtype=dtype,
                seed=0,
                enable_prefix_caching=False,
                speculative_config={
                    "method": "custom_class",
                    "model": PROPOSER,
                    "num_speculative_tokens": num_speculative_tokens,
                },
            )
        finally:
            os.environ.pop(ENV_OUT, None)
            os.environ.pop(ENV_CYCLE, None)
        curves: dict[str, Any] = {}
        raw: dict[str, Any] = {}
        ctx = context_tokens
        try:
            for b in batch_sizes:
                start = _count_lines(path)
                # Distinct prompts (no prefix sharing), tokens of ordinary text ids.
                prompts = [
                    {"prompt_token_ids": [1000 + (7 * i + 13 * r) % 20000 for i in range(ctx)]}
                    for r in range(b)
                ]
                params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)
                llm.generate(prompts, params, use_tqdm=False)
                records = _read_lines(path)[start:]
                times = step_times(records, b)
                # Drop the warm-up cycles: the first steps of each length.
                ns, ms = [], []
                for n in sorted(times):
                    kept = times[n][warmup_cycles:]
                    if kept:
                        ns.append(n)
                        ms.append(round(statistics.median(kept), 4))
                if not ns or ns[0] != 1:
                    raise RuntimeError(
                        f"batch {b}: no plain decode steps measured ({len(records)} records)"
                    )
                curves[str(b)] = {"n_tokens": ns, "step_ms": ms}
                raw[str(b)] = {str(n): [round(x, 3) for x in times[n]] for n in sorted(times)}
        finally:
            llm.llm_engine.engine_core.shutdown()
    import vllm

    return {
        "format": "agspec-cost-profile",
        "version": 1,
        "backend": "vllm",
        "model": model_name or Path(str(model)).name,
        "device": f"cpu {platform.machine()} ({os.cpu_count()} cores)",
        "build": f"vllm {vllm.__version__}",
        "context_tokens": context_tokens,
        "batch_sizes": curves,
        "notes": (
            f"agspec.adapters.vllm.costprofile: engine step time (ms, median of {cycles} "
            f"interleaved cycles) when each of B requests verifies n tokens; "
            f"num_speculative_tokens={num_speculative_tokens}, enforce_eager, {dtype}"
        ),
        "raw_step_ms": raw,
    }


def _count_lines(path: Path) -> int:
    return len(_read_lines(path))


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_profile(profile: dict[str, Any], out: str | os.PathLike[str]) -> None:
    """Writes the profile whole or not at all (agspec._files.atomic_write_text)."""
    from agspec._files import atomic_write_text

    atomic_write_text(out, json.dumps(profile, indent=1) + "\n")
