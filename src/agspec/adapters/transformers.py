"""HF transformers adapter (optional extra): any `CallDrafter` as the candidate source of
`model.generate` assisted decoding, at batch 1.

transformers has no public hook for a custom candidate generator: assisted decoding picks
one in `GenerationMixin._get_candidate_generator`. `generate_with_drafter` therefore turns
on assisted mode the documented way (`prompt_lookup_num_tokens=K`) and, for the duration
of that one call only, makes the model's `_get_candidate_generator` return a
`DrafterCandidateGenerator`. Everything else (verification, KV-cache cropping, stopping
criteria, logits processors) is transformers' own code.

The accepted count is fed back through `update_candidate_strategy`: transformers calls it
after each step with the extended `input_ids`, and the new tokens are exactly the step's
committed tokens (accepted draft prefix + the model's own token).

Example with concrete tokens: prompt `[5, 6, 7]`; `get_candidates` asks the drafter, which
proposes `[8, 9, 10, 11]`, and returns `[[5, 6, 7, 8, 9, 10, 11]]`; the model keeps 8 and 9
and writes 12, so `update_candidate_strategy` sees `[[5, 6, 7, 8, 9, 12]]` and the drafter
gets `accept([8, 9, 12])` (accept length 2).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from agspec.drafter.protocol import CallDrafter


def _import_torch_transformers() -> tuple[Any, Any]:
    try:
        import torch
        from transformers.generation import candidate_generator
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ImportError(
            "the transformers adapter needs torch (CPU: torch==2.13.0) and transformers>=4.45"
        ) from exc
    return torch, candidate_generator


def _candidate_generator_base() -> type:
    try:
        from transformers.generation.candidate_generator import CandidateGenerator
    except ImportError:
        return object
    return CandidateGenerator  # type: ignore[no-any-return]


@dataclass
class DraftStats:
    """Per-step counts of one `generate_with_drafter` call (batch 1)."""

    drafted_tokens: list[int] = field(default_factory=list)
    accepted_tokens: list[int] = field(default_factory=list)  # excludes the bonus token
    draft_ms: list[float] = field(default_factory=list)

    @property
    def mean_accept_length(self) -> float:
        steps = len(self.accepted_tokens)
        return sum(self.accepted_tokens) / steps if steps else 0.0


class DrafterCandidateGenerator(_candidate_generator_base()):  # type: ignore[misc]
    """A transformers `CandidateGenerator` that asks a `CallDrafter` for candidates.

    `begin` runs on the first `get_candidates` (with the prompt), `accept` after every
    verification step, and `end` when the caller calls `finish()` (done by
    `generate_with_drafter`).
    """

    requires_model_outputs = False

    def __init__(
        self,
        drafter: CallDrafter,
        *,
        num_draft_tokens: int = 16,
        max_length: int,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        if num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
        self.drafter = drafter
        self.num_draft_tokens = num_draft_tokens
        self.max_length = max_length
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.stats = DraftStats()
        self._seen_tokens: int | None = None  # tokens the drafter knows; None before begin
        self._last_draft_tokens = 0

    @property
    def num_drafting_tokens(self) -> int:
        """The most tokens a step drafts (transformers 5.25 and later ask it, to size
        the recurrent states a cache keeps for rolling back a verification)."""
        return self.num_draft_tokens

    def get_candidates(self, input_ids: Any, **kwargs: Any) -> tuple[Any, None]:
        torch, _ = _import_torch_transformers()
        if input_ids.shape[0] != 1:
            raise ValueError(f"assisted decoding runs at batch 1, got batch {input_ids.shape[0]}")
        cur_len = int(input_ids.shape[1])
        if self._seen_tokens is None:
            self.drafter.begin(input_ids[0].tolist())
            self._seen_tokens = cur_len
        elif self._seen_tokens != cur_len:  # defensive: transformers always reports first
            raise RuntimeError(
                f"drafter saw {self._seen_tokens} tokens but the sequence has {cur_len}; "
                "update_candidate_strategy was not called"
            )
        # The model adds one token of its own, so never draft past max_length - 1.
        want = min(self.num_draft_tokens, self.max_length - cur_len - 1)
        t = time.perf_counter()
        draft = [int(x) for x in self.drafter.propose(want)][:want] if want > 0 else []
        self.stats.draft_ms.append((time.perf_counter() - t) * 1000.0)
        for i, token in enumerate(draft):  # as HF's prompt lookup: never draft past EOS
            if token in self.eos_token_ids:
                draft = draft[:i]
                break
        self._last_draft_tokens = len(draft)
        if not draft:
            return input_ids, None
        tail = torch.tensor([draft], dtype=input_ids.dtype, device=input_ids.device)
        return torch.cat([input_ids, tail], dim=1), None

    def update_candidate_strategy(self, input_ids: Any, scores: Any, num_matches: Any) -> None:
        assert self._seen_tokens is not None
        committed = input_ids[0, self._seen_tokens :].tolist()
        self._seen_tokens = int(input_ids.shape[1])
        self.stats.drafted_tokens.append(self._last_draft_tokens)
        self.stats.accepted_tokens.append(int(num_matches))
        self.drafter.accept(committed)

    def finish(self) -> None:
        if self._seen_tokens is not None:
            self.drafter.end()
        self._seen_tokens = None


@contextlib.contextmanager
def _candidate_generator_override(model: Any, generator: Any) -> Iterator[None]:
    """Make `model._get_candidate_generator` return `generator` inside the block only."""
    had_own = "_get_candidate_generator" in vars(model)
    previous = vars(model).get("_get_candidate_generator")
    model._get_candidate_generator = lambda *args, **kwargs: generator
    try:
        yield
    finally:
        if had_own:
            model._get_candidate_generator = previous
        else:
            del model._get_candidate_generator


def generate_with_drafter(
    model: Any,
    input_ids: Any,
    drafter: CallDrafter,
    *,
    max_new_tokens: int,
    num_draft_tokens: int = 16,
    **generate_kwargs: Any,
) -> tuple[Any, DraftStats]:
    """`model.generate(input_ids, ...)` with candidates from `drafter`; returns
    `(sequences [1, prompt + new], stats)`.

    Greedy by default (`do_sample=False`); any other `generate` keyword passes through.
    """
    _import_torch_transformers()
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must have shape [1, seq_len], got {tuple(input_ids.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    eos = generate_kwargs.get("eos_token_id", model.generation_config.eos_token_id)
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    generator = DrafterCandidateGenerator(
        drafter,
        num_draft_tokens=num_draft_tokens,
        max_length=int(input_ids.shape[1]) + max_new_tokens,
        eos_token_ids=eos_ids,
    )
    generate_kwargs.setdefault("do_sample", False)
    try:
        with _candidate_generator_override(model, generator):
            sequences = model.generate(
                input_ids,
                max_new_tokens=max_new_tokens,
                prompt_lookup_num_tokens=num_draft_tokens,  # selects assisted decoding
                **generate_kwargs,
            )
    finally:
        generator.finish()
    return sequences, generator.stats


def measure_cost_profile(
    model: Any,
    *,
    max_tokens: int = 32,
    context_tokens: int = 1024,
    repeats: int = 3,
    model_name: str = "",
    progress: Any = None,
) -> dict[str, Any]:
    """An `agspec-cost-profile` for `model` on this machine: the median wall time of one
    forward pass verifying n = 1..`max_tokens` tokens after `context_tokens` cached
    tokens (batch 1), in rounds over every n so a slow spell spreads over all of them."""
    torch, _ = _import_torch_transformers()
    if max_tokens < 1 or repeats < 1 or context_tokens < 1:
        raise ValueError("max_tokens, repeats and context_tokens must be >= 1")
    filler_id = 220 if model.config.vocab_size > 220 else 0
    samples: dict[int, list[float]] = {n: [] for n in range(1, max_tokens + 1)}
    with torch.no_grad():
        ctx = torch.full((1, context_tokens), filler_id, dtype=torch.long)
        cache = model(ctx, use_cache=True).past_key_values
        for r in range(repeats):
            for n in samples:
                t = time.perf_counter()
                model(torch.full((1, n), filler_id, dtype=torch.long), past_key_values=cache)
                samples[n].append((time.perf_counter() - t) * 1000.0)
                cache.crop(-n)  # drop the n tokens just added
            if progress is not None:
                progress(f"round {r + 1}/{repeats}: n=1 {samples[1][-1]:.2f} ms")
    ns = sorted(samples)
    step_ms = [round(sorted(samples[n])[len(samples[n]) // 2], 4) for n in ns]
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    return {
        "format": "agspec-cost-profile",
        "version": 1,
        "backend": f"transformers ({dtype})",
        "model": model_name or type(model).__name__,
        "device": f"cpu ({torch.get_num_threads()} threads)",
        "context_tokens": context_tokens,
        "batch_sizes": {"1": {"n_tokens": ns, "step_ms": step_ms}},
    }


def measure_model_cost_profile(
    model: str,
    *,
    max_tokens: int = 32,
    context_tokens: int = 512,
    repeats: int = 5,
    threads: int = 2,
    cache_dir: str | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """The profile of a transformers model: a model folder, or a GGUF (pinned name or
    path) that transformers dequantizes to float32 (needs `gguf` and `accelerate`)."""
    from pathlib import Path

    from agspec.models import resolve_model

    torch, _ = _import_torch_transformers()  # a clear ImportError when absent
    import transformers

    if max_tokens < 1 or repeats < 1 or threads < 1 or context_tokens < 1:
        raise ValueError("--max-tokens, --repeats, --threads, --context-tokens must be >= 1")
    torch.set_num_threads(threads)
    auto = transformers.AutoModelForCausalLM
    if Path(model).is_dir():
        loaded = auto.from_pretrained(model, dtype=torch.float32)
        name = Path(model).name
    else:
        gguf = resolve_model(model, cache_dir)
        loaded = auto.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        name = gguf.name
    loaded.eval()
    return measure_cost_profile(
        loaded,
        max_tokens=max_tokens,
        context_tokens=context_tokens,
        repeats=repeats,
        model_name=name,
        progress=progress,
    )
