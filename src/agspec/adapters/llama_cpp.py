"""llama.cpp adapter (`llama-cpp-python`, optional extra): any `CallDrafter` inside llama.cpp.

Two ways in:

1. `AgSpecLlamaDraftModel(drafter_factory)`, a drop-in `draft_model` for stock
   `Llama(..., draft_model=...)`, so `create_completion` / `create_chat_completion` speed up
   unchanged. llama-cpp-python gives no acceptance callback; the draft model is called
   with the whole sequence after every verification step, so acceptance is inferred from
   the prefix the next call receives (see `AgSpecLlamaDraftModel.__call__`).
2. `generate(llm, prompt_ids, drafter, ...)`, an own greedy loop: evaluate the pending
   token and the draft in one batch, keep the longest prefix where the draft equals the
   argmax, roll the KV cache back to it, and report every step (`StepStats`) to the
   caller and every commit to the drafter.

`llama_cpp` is imported lazily: importing this module never needs it.

Example with concrete tokens (greedy): after the prompt `[5, 6, 7]` the drafter proposes
`[8, 9, 10, 11]`; one batch evaluates `[7, 8, 9, 10, 11]` (7 was pending); the argmax rows
read `[8, 9, 12, ...]`, so 8 and 9 are accepted, 12 is the bonus token, the drafter gets
`accept([8, 9, 12])` (accept length 2), and the KV cache keeps positions up to 9.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from agspec.drafter.protocol import CallDrafter

if TYPE_CHECKING:  # pragma: no cover
    from llama_cpp import Llama


def import_llama_cpp() -> Any:
    """Import `llama_cpp` or raise ImportError saying how to install it."""
    try:
        import llama_cpp
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ImportError(
            "the llama.cpp adapter needs llama-cpp-python==0.3.36; it has no wheel on PyPI, "
            "build it with scripts/install_llama_cpp.sh (about 5 minutes on 2 cores)"
        ) from exc
    return llama_cpp


def _draft_model_base() -> type:
    try:
        from llama_cpp.llama_speculative import LlamaDraftModel
    except ImportError:  # the class still works as a plain callable without llama_cpp
        return object
    return LlamaDraftModel  # type: ignore[no-any-return]


class AgSpecLlamaDraftModel(_draft_model_base()):  # type: ignore[misc]
    """Stock llama-cpp-python speculative hook, fed by any `CallDrafter`.

    llama-cpp-python calls `draft_model(input_ids)` with the whole sequence (prompt +
    every committed token, the last one not evaluated yet) after each verification step.
    The draft it gets back is appended and verified. So when a call's `input_ids` equal
    the previous call's sequence plus a prefix of the previous draft plus one token, that
    suffix is exactly the committed tokens of the step: `accept(suffix)`. Anything else
    starts a new model call: `end()` the old drafter, make a new one with
    `drafter_factory()`, and `begin(input_ids[:-1])` + `accept(input_ids[-1:])` (the first
    call already carries the first generated token).

    Example: call 1 receives `[5, 6, 7, 8]` → `begin([5, 6, 7])`, `accept([8])`, returns
    draft `[9, 10, 11]`; call 2 receives `[5, 6, 7, 8, 9, 10, 4]` → `accept([9, 10, 4])`
    (accept length 2).
    """

    def __init__(
        self,
        drafter_factory: Callable[[], CallDrafter],
        *,
        num_draft_tokens: int = 16,
    ) -> None:
        if num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
        self.drafter_factory = drafter_factory
        self.num_draft_tokens = num_draft_tokens
        self._drafter: CallDrafter | None = None
        # What the drafter has seen (prompt + committed): _seen[:_num_seen], grown by
        # doubling, so a step appends only its new tokens.
        self._seen = np.zeros(0, dtype=np.int64)
        self._num_seen = 0
        self._draft: list[int] = []  # the last draft returned
        # Counters over the object's life, for benchmarks.
        self.num_calls = 0
        self.num_steps = 0
        self.num_drafted_tokens = 0
        self.num_accepted_tokens = 0

    def _continuation(self, ids: np.ndarray) -> list[int] | None:
        """The committed tokens if `ids` continues the previous step, else None.

        One vectorised comparison of the known prefix (no Python ints for it); only the
        new tokens become a list.
        """
        n = self._num_seen
        if self._drafter is None or ids.size <= n:
            return None
        if not np.array_equal(ids[:n], self._seen[:n]):
            return None
        new = ids[n:].tolist()
        if len(new) - 1 > len(self._draft) or new[:-1] != self._draft[: len(new) - 1]:
            return None
        return new

    def _remember(self, ids: np.ndarray, start: int) -> None:
        """_seen becomes `ids` (equal to it before `start`): copies only ids[start:]."""
        if ids.size > self._seen.size:
            grown = np.zeros(max(ids.size, 2 * self._seen.size, 256), dtype=np.int64)
            grown[:start] = self._seen[:start]
            self._seen = grown
        self._seen[start : ids.size] = ids[start:]
        self._num_seen = ids.size

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        ids = np.asarray(input_ids).reshape(-1)
        if ids.size == 0:
            return np.array([], dtype=np.intc)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"input_ids must be integer token ids, got dtype {ids.dtype}")
        committed = self._continuation(ids)
        if committed is None:
            self.finish()
            self._drafter = self.drafter_factory()
            prompt = ids.tolist()
            self._drafter.begin(prompt[:-1])
            self._drafter.accept(prompt[-1:])
            self.num_calls += 1
            self._remember(ids, 0)
        else:
            assert self._drafter is not None
            self._drafter.accept(committed)
            self.num_steps += 1
            self.num_accepted_tokens += len(committed) - 1
            self._remember(ids, self._num_seen)
        self._draft = [int(t) for t in self._drafter.propose(self.num_draft_tokens)]
        self._draft = self._draft[: self.num_draft_tokens]
        self.num_drafted_tokens += len(self._draft)
        return np.array(self._draft, dtype=np.intc)

    def finish(self) -> None:
        """End the current call's drafter (also done implicitly by the next new call)."""
        if self._drafter is not None:
            self._drafter.end()
        self._drafter = None
        self._num_seen = 0
        self._draft = []


@dataclass(frozen=True)
class StepStats:
    """One verification step of `generate`.

    `drafted_tokens` were proposed, `accepted_tokens` of them matched the argmax (accept
    length: the bonus token is not counted), `committed_tokens` = accepted + 1 unless
    the output hit EOS or `max_new_tokens`.
    """

    drafted_tokens: int
    accepted_tokens: int
    committed_tokens: int
    evaluated_tokens: int  # batch size of the forward pass (pending + draft)
    draft_ms: float
    verify_ms: float


@dataclass
class GenerationResult:
    """Output of `generate`: the new tokens and per-step statistics."""

    tokens: list[int]
    steps: list[StepStats] = field(default_factory=list)
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0  # prompt prefix found in the KV cache
    prefill_ms: float = 0.0
    total_ms: float = 0.0
    stopped_by: str = "length"  # "length", "eos", "context" or "cancelled"

    @property
    def num_drafted_tokens(self) -> int:
        return sum(s.drafted_tokens for s in self.steps)

    @property
    def num_accepted_tokens(self) -> int:
        return sum(s.accepted_tokens for s in self.steps)

    @property
    def mean_accept_length(self) -> float:
        return self.num_accepted_tokens / len(self.steps) if self.steps else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """New tokens per second of decoding (prefill excluded)."""
        decode_ms = self.total_ms - self.prefill_ms
        return 1000.0 * len(self.tokens) / decode_ms if decode_ms > 0 else 0.0


def _eval_batch(
    llm: Llama, tokens: Sequence[int], *, all_logits: bool, argmax_only: bool = False
) -> np.ndarray:
    """Append `tokens` to the KV cache in one `llama_decode` per `n_batch` chunk.

    Returns logits `[len(tokens), n_vocab]` when `all_logits`, else `[1, n_vocab]` for the
    last token; with `argmax_only`, just the argmax id of each of those rows (no copy of
    the logits: 600 KB per row for Qwen2.5). Works like `Llama.eval` but without
    `logits_all=True`, whose score buffer is `n_ctx x n_vocab` floats.
    """
    n_vocab = llm.n_vocab()
    rows: list[np.ndarray] = []
    llm._ctx.kv_cache_seq_rm(-1, llm.n_tokens, -1)  # drop anything after n_tokens
    for start in range(0, len(tokens), llm.n_batch):
        chunk = list(tokens[start : start + llm.n_batch])
        is_last_chunk = start + llm.n_batch >= len(tokens)
        llm._batch.set_batch(batch=chunk, n_past=llm.n_tokens, logits_all=all_logits)
        llm._ctx.decode(llm._batch)
        llm.input_ids[llm.n_tokens : llm.n_tokens + len(chunk)] = chunk
        llm.n_tokens += len(chunk)
        num_rows = len(chunk) if all_logits else 1
        if all_logits or is_last_chunk:
            view = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(num_rows * n_vocab,))
            view = view.reshape(num_rows, n_vocab)
            rows.append(view.argmax(axis=1) if argmax_only else view.copy())
    return np.concatenate(rows, axis=0)


def _rollback(llm: Llama, num_tokens: int) -> None:
    """Keep the first `num_tokens` positions of the KV cache."""
    llm.n_tokens = num_tokens
    llm._ctx.kv_cache_seq_rm(-1, num_tokens, -1)


def prefill(llm: Llama, prompt_ids: Sequence[int], *, reuse_prefix: bool = True) -> tuple[int, int]:
    """Evaluate the prompt except its last token; return (next position's token, reused).

    The last prompt token stays pending so the first verification batch evaluates it
    together with the first draft. With `reuse_prefix`, the longest common prefix of the
    KV cache and the prompt is kept (llama.cpp's own prefix cache does the same).
    """
    prompt = [int(t) for t in prompt_ids]
    reused = 0
    if reuse_prefix and llm.n_tokens > 0:
        cached = llm.input_ids[: llm.n_tokens].tolist()
        limit = min(len(cached), len(prompt) - 1)
        while reused < limit and cached[reused] == prompt[reused]:
            reused += 1
    _rollback(llm, reused)
    if len(prompt) - 1 > reused:
        _eval_batch(llm, prompt[reused:-1], all_logits=False)
    return prompt[-1], reused


@dataclass(frozen=True)
class Sampling:
    """Sampling settings of the own loop (`generate(..., sampling=Sampling(...))`).

    The logits are divided by `temperature`, cut to the `top_k` largest (0: all), then
    to the smallest set whose probability reaches `top_p` (1.0: all), and a token is drawn
    by inverse CDF with one `rng.random()` draw.

    Speculation stays exact: at each drafted position the loop draws the token the model
    would sample there and keeps the draft token only if it is that token; the first
    mismatching draw is committed and the rest of the draft dropped. A point-mass draft
    accepted with probability p(draft) and, on rejection, the token drawn from p given
    "not the draft" is exactly what rejection sampling prescribes, and since one draw is
    consumed per committed token in order, the same seed gives the same tokens with or
    without a drafter (up to logits that differ by rounding between batch sizes).

    >>> s = Sampling(temperature=1.0, top_k=2)
    >>> s.sample(np.array([0.0, 3.0, 3.0, -1.0]), random.Random(0))   # one of the top 2
    2
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be > 0 (use sampling=None for greedy), "
                             f"got {self.temperature}")  # fmt: skip
        if self.top_k < 0 or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_k must be >= 0 and top_p in (0, 1], got {self.top_k}, "
                             f"{self.top_p}")  # fmt: skip

    def sample(self, logits: np.ndarray, rng: random.Random) -> int:
        """One token, drawn with one `rng.random()`. Only the few most likely tokens are
        sorted (the draw almost always lands among them: a full sort of a 150k vocabulary
        costs more than a decode step); when it does not, the full sort decides. Both give
        the token of `sample_full_sort` for the same draw."""
        z = logits.astype(np.float64) / self.temperature
        u = rng.random()
        n = len(z)
        m = self.top_k or _SAMPLE_CANDIDATES
        if m >= n:
            return self._pick(z, np.argsort(-z, kind="stable"), u)
        # Every token at least as likely as the m-th: the full sort's first m tokens, ties
        # included, in the same order (stable over ascending ids: ties lower id first).
        part = np.argpartition(-z, m - 1)[:m]
        cand = np.flatnonzero(z >= z[part].min())
        order = cand[np.argsort(-z[cand], kind="stable")]
        if self.top_k:
            return self._pick(z, order[: self.top_k], u)
        top = z[order]
        weights = np.exp(top - top[0])
        total = float(np.exp(z - top[0]).sum())  # the normaliser over every token
        cum = np.cumsum(weights) / total
        reach = self.top_p if self.top_p < 1.0 else u
        if cum[-1] <= reach:  # the nucleus (or the draw) goes past the candidates
            return self._pick(z, np.argsort(-z, kind="stable"), u)
        probs = weights / total
        if self.top_p < 1.0:
            keep = int(np.searchsorted(cum, self.top_p) + 1)
            probs = probs[:keep] / probs[:keep].sum()
        i = int(np.searchsorted(np.cumsum(probs), u, side="right"))
        return int(order[min(i, len(probs) - 1)])

    def sample_full_sort(self, logits: np.ndarray, u: float) -> int:
        """The reference rule, sorting every token: the token whose probability interval
        (most likely first, ties lower id first) holds `u`."""
        z = logits.astype(np.float64) / self.temperature
        return self._pick(z, np.argsort(-z, kind="stable"), u)

    def _pick(self, z: np.ndarray, order: np.ndarray, u: float) -> int:
        if self.top_k:
            order = order[: self.top_k]
        zs = z[order]
        probs = np.exp(zs - zs[0])
        probs /= probs.sum()
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), self.top_p) + 1)
            probs = probs[:keep] / probs[:keep].sum()
        i = int(np.searchsorted(np.cumsum(probs), u, side="right"))
        return int(order[min(i, len(probs) - 1)])


_SAMPLE_CANDIDATES = 256


def generate(
    llm: Llama,
    prompt_ids: Sequence[int],
    drafter: CallDrafter | None,
    max_new_tokens: int,
    *,
    num_draft_tokens: int = 16,
    eos_token_ids: Sequence[int] | None = None,
    reuse_prefix: bool = True,
    on_step: Callable[[StepStats], None] | None = None,
    sampling: Sampling | None = None,
    on_commit: Callable[[list[int]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    trees: bool = True,
) -> GenerationResult:
    """Greedy speculative decoding with `drafter`; `drafter=None` is plain greedy decoding.
    With `sampling`, sampled decoding instead, exactly (see `Sampling`).

    A drafter that drafts token trees (`propose_tree`: AgSpec's calls) is verified as a
    tree, every node in one batch (`agspec.adapters.llama_cpp_tree`), when decoding is
    greedy and `trees` is True; sampled decoding, and `trees=False`, verify its chain
    (`propose`). Where its cost rule says no tree pays, the tree is that chain.

    Every step evaluates the pending token plus the draft in one batch; the committed
    tokens are the draft's longest prefix that equals the argmax, plus the argmax after it.
    The output equals greedy decoding token for token, except where llama.cpp's batched
    kernels flip a near-tie (see docs/live.md).

    `on_commit(tokens)` sees each step's committed tokens as soon as they are known (a
    server streams them); `should_stop()` is asked before every step, and when it returns
    True the loop ends with `stopped_by="cancelled"` (a client that went away, a timeout,
    a stop string the caller found): a cancellation takes effect within one step.
    """
    llama_cpp = import_llama_cpp()
    if not isinstance(llm, llama_cpp.Llama):
        raise TypeError(f"llm must be a llama_cpp.Llama, got {type(llm).__name__}")
    if max_new_tokens < 0 or num_draft_tokens < 0:
        raise ValueError(
            f"max_new_tokens and num_draft_tokens must be >= 0, got {max_new_tokens} "
            f"and {num_draft_tokens}"
        )
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("prompt_ids is empty: llama.cpp needs at least one token (e.g. BOS)")
    n_ctx = llm.n_ctx()
    if len(prompt) >= n_ctx:
        raise ValueError(f"prompt has {len(prompt)} tokens; the context holds {n_ctx}")
    eos = set(eos_token_ids) if eos_token_ids is not None else {llm.token_eos()}
    if trees and sampling is None and getattr(drafter, "propose_tree", None) is not None:
        from agspec.adapters.llama_cpp_tree import generate_tree

        assert drafter is not None
        return generate_tree(
            llm, prompt, drafter, max_new_tokens, max_nodes=num_draft_tokens,
            eos_token_ids=sorted(eos), reuse_prefix=reuse_prefix, on_step=on_step,
            on_commit=on_commit, should_stop=should_stop,
        )  # fmt: skip

    rng = random.Random(sampling.seed) if sampling is not None else None
    t0 = time.perf_counter()
    pending, reused = prefill(llm, prompt, reuse_prefix=reuse_prefix)
    prefill_ms = (time.perf_counter() - t0) * 1000.0
    result = GenerationResult(tokens=[], prompt_tokens=len(prompt), reused_prompt_tokens=reused)
    if drafter is not None:
        drafter.begin(prompt)
    try:
        while len(result.tokens) < max_new_tokens:
            if should_stop is not None and should_stop():
                result.stopped_by = "cancelled"
                break
            room = n_ctx - llm.n_tokens - 1  # positions left after the pending token
            if room < 0:
                result.stopped_by = "context"
                break
            want = min(num_draft_tokens, max_new_tokens - len(result.tokens) - 1, room)
            t_draft = time.perf_counter()
            draft: list[int] = []
            if drafter is not None and want > 0:
                draft = [int(t) for t in drafter.propose(want)][:want]
            t_verify = time.perf_counter()
            base = llm.n_tokens
            if sampling is None:
                # [1 + len(draft)] when drafting, else [1]
                chosen = _eval_batch(
                    llm, [pending, *draft], all_logits=bool(draft), argmax_only=True
                )
                accepted = 0
                while accepted < len(draft) and int(chosen[accepted]) == draft[accepted]:
                    accepted += 1
                committed = [*draft[:accepted], int(chosen[accepted])]
            else:
                assert rng is not None
                rows = _eval_batch(llm, [pending, *draft], all_logits=bool(draft))
                # One draw per committed token, in order: stop at the first draw that is
                # not the draft token (it is committed; the rest of the draft is dropped).
                committed = []
                for i in range(len(rows)):
                    token = sampling.sample(rows[i], rng)
                    committed.append(token)
                    if i >= len(draft) or token != draft[i]:
                        break
                accepted = len(committed) - 1
            # KV keeps the pending token and the accepted draft; the bonus is pending now.
            _rollback(llm, base + 1 + accepted)
            t_end = time.perf_counter()
            committed, stop = record_step(
                result, committed, accepted=accepted, drafted=len(draft),
                draft_ms=(t_verify - t_draft) * 1000.0, verify_ms=(t_end - t_verify) * 1000.0,
                eos=eos, max_new_tokens=max_new_tokens, on_step=on_step, drafter=drafter,
                on_commit=on_commit,
            )  # fmt: skip
            pending = committed[-1]
            if stop is not None:
                break
    finally:
        if drafter is not None:
            drafter.end()
    result.prefill_ms = prefill_ms
    result.total_ms = (time.perf_counter() - t0) * 1000.0
    return result


def record_step(
    result: GenerationResult, committed: list[int], *, accepted: int, drafted: int,
    draft_ms: float, verify_ms: float, eos: Collection[int], max_new_tokens: int,
    on_step: Callable[[StepStats], None] | None, drafter: CallDrafter | None,
    on_commit: Callable[[list[int]], None] | None,
) -> tuple[list[int], str | None]:  # fmt: skip
    """One verified step's bookkeeping, for chains and trees alike: `committed` cut after
    its first EOS and at `max_new_tokens`, appended to `result` with the step's
    `StepStats`, then given to `on_step`, the drafter's `accept` and `on_commit`. Returns
    what was committed and "eos" when an EOS ended the generation (also set as
    `result.stopped_by`), else None."""
    stop = None
    for i, token in enumerate(committed):
        if token in eos:
            committed, stop = committed[: i + 1], "eos"
            break
    if len(result.tokens) + len(committed) > max_new_tokens:
        committed = committed[: max_new_tokens - len(result.tokens)]
    result.tokens.extend(committed)
    stats = StepStats(
        drafted_tokens=drafted,
        # Capped at what was committed: a draft can run past an EOS that stopped it.
        accepted_tokens=min(accepted, len(committed)),
        committed_tokens=len(committed),
        evaluated_tokens=1 + drafted,
        draft_ms=draft_ms,
        verify_ms=verify_ms,
    )
    result.steps.append(stats)
    if on_step is not None:
        on_step(stats)
    if drafter is not None:
        drafter.accept(committed)
    if on_commit is not None:
        on_commit(committed)
    if stop is not None:
        result.stopped_by = stop
    return committed, stop


def time_verification_step(
    llm: Llama, context_ids: Sequence[int], num_tokens: int, *, repeats: int = 3
) -> float:
    """Median wall time (ms) of one forward pass verifying `num_tokens` tokens after
    `context_ids` (already evaluated once; the KV cache is rolled back after each pass)."""
    if num_tokens < 1 or repeats < 1:
        raise ValueError(f"num_tokens and repeats must be >= 1, got {num_tokens}, {repeats}")
    pending, _ = prefill(llm, context_ids, reuse_prefix=True)
    base = llm.n_tokens
    filler = [int(t) for t in context_ids]  # the content barely matters for the time
    batch = [pending] + [filler[i % len(filler)] for i in range(num_tokens - 1)]
    times_ms = []
    for _ in range(repeats):
        t = time.perf_counter()
        _eval_batch(llm, batch, all_logits=True, argmax_only=True)  # as `generate` does
        times_ms.append((time.perf_counter() - t) * 1000.0)
        _rollback(llm, base)
    return float(np.median(times_ms))


def measure_cost_profile(
    model: str,
    *,
    max_tokens: int = 32,
    context_tokens: int = 512,
    repeats: int = 5,
    threads: int = 2,
    cache_dir: str | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """The `agspec-cost-profile` of llama.cpp running `model` (a pinned name or a .gguf
    path) on this machine: for n = 1 … max_tokens, the median wall time of one forward pass
    verifying n tokens after a `context_tokens` context, batch 1 (`agspec costmodel
    measure`, and `agspec serve` when it has no profile for its model)."""
    import platform
    import statistics
    from pathlib import Path

    from agspec.models import resolve_model

    if max_tokens < 1 or repeats < 1 or threads < 1:
        raise ValueError("--max-tokens, --repeats and --threads must be >= 1")
    if context_tokens < 1:
        raise ValueError(f"--context-tokens must be >= 1, got {context_tokens}")
    llama_cpp = import_llama_cpp()
    path = resolve_model(model, cache_dir)
    n_ctx = context_tokens + max_tokens + 8
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, n_batch=max(512, max_tokens), n_threads=threads,
        n_threads_batch=threads,  # the default (all cores) spin-waits badly on a busy machine
        seed=0, verbose=False,
    )  # fmt: skip
    # A real-looking context: code tokenized by the model itself, repeated to length.
    seed_ids = llm.tokenize(b"def step(state, action):\n    return state + action  # noqa\n")
    context = (seed_ids * (context_tokens // len(seed_ids) + 1))[:context_tokens]
    time_verification_step(llm, context, 1, repeats=1)  # warm-up: prefill + first pass
    n_tokens = list(range(1, max_tokens + 1))
    # Rounds over every n, not n after n: a slow spell on a shared machine then spreads
    # over all n (the median drops it) instead of bending one stretch of the curve.
    samples: dict[int, list[float]] = {n: [] for n in n_tokens}
    for r in range(repeats):
        for n in n_tokens:
            samples[n].append(time_verification_step(llm, context, n, repeats=1))
        if progress is not None:
            progress(f"round {r + 1}/{repeats}: n=1 {samples[1][-1]:.2f} ms, "
                     f"n={max_tokens} {samples[max_tokens][-1]:.2f} ms")  # fmt: skip
    step_ms = [round(statistics.median(samples[n]), 4) for n in n_tokens]
    name = model if not str(model).endswith(".gguf") else Path(model).name
    return {
        "format": "agspec-cost-profile",
        "version": 1,
        "backend": "llama.cpp",
        "model": name,
        "device": f"cpu {platform.machine()} ({threads} threads)",
        "build": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "context_tokens": context_tokens,
        "batch_sizes": {"1": {"n_tokens": n_tokens, "step_ms": step_ms}},
    }


def logit_gap(llm: Any, prompt: list[int], prefix: list[int], a: int, b: int) -> float:
    """|logit(a) - logit(b)| for the token after prompt + prefix, by one-token decoding:
    how near a tie two candidate tokens were (a small gap: a flip between the batched
    verify pass and one-token decoding)."""
    pending, _ = prefill(llm, prompt + prefix, reuse_prefix=True)
    logits = _eval_batch(llm, [pending], all_logits=False)[0]
    return float(abs(logits[a] - logits[b]))
