"""A cost profile that heals: the start-up profile, corrected by the server's own steps.

The default drafter `agspec` sizes every draft by what verifying it costs
(`docs/costmodel.md`). A profile measured while the machine was busy, or a wrong
`--cost-profile`, would make it draft too little (or too much) for good. So `agspec serve`
times its own decoding steps and keeps the medians per batch size and step size:
`LiveCostProfile` answers the cost model's questions from those medians where it holds
enough of them and from the start-up profile elsewhere (scaled to the live level), and
the server reprices the drafter with it as samples come in.

A wrong profile that says drafting never pays would never see a drafted step, so the
server also *probes*: now and then a decoding request's step carries filler tokens after
its pending token (their logits are ignored and their KV dropped at once; the pending
token's own logits cannot see them, so the output is unchanged), at the step sizes that
have too few samples. The probes stop once every probed size has `min_samples`, and
resume for a size whose samples are older than `refresh_steps` steps.

Times are keyed by (batch size B, total tokens T of the step); the cost model's
`step_time_ms(n, B)` reads the curve of B at T = n * B (n tokens per request).

>>> live = LiveCostProfile(None, min_samples=1)
>>> for t, ms in [(1, 10.0), (2, 12.0), (4, 16.0)]:
...     live.add(1, t, ms)
>>> live.step_time_ms(3, 1), live.step_cost(4, 1)
(14.0, 1.6)
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterator
from typing import Any

__all__ = ["LiveCostProfile", "PROBE_TOKENS", "describe_profile"]

# Step sizes (tokens per request) the probes measure at each live batch size: the plain
# step and the draft lengths the cost rule weighs most (1 + draft tokens).
PROBE_TOKENS = (1, 2, 3, 5, 9, 17)


class LiveCostProfile:
    """Medians of the server's own step times per (batch size, step tokens), over a
    `prior` cost model (None: live samples only; a curve without samples at B then costs
    every step the same). Monotone in tokens: a step of more tokens never reads cheaper.

    Not thread-safe: the decode worker adds and reads; other threads read `summary()`,
    which copies what it reads.
    """

    def __init__(
        self,
        prior: Any,
        *,
        min_samples: int = 3,
        window: int = 31,
        refresh_steps: int = 5000,
        source: str = "",
        provisional: bool = False,
    ) -> None:
        if min_samples < 1 or window < min_samples:
            raise ValueError(
                f"min_samples must be >= 1 and window >= min_samples, got {min_samples}, {window}"
            )
        self.prior = prior
        self.min_samples = min_samples
        self.window = window
        self.refresh_steps = refresh_steps
        self.source = source
        self.provisional = provisional
        self._samples: dict[int, dict[int, collections.deque[float]]] = {}
        self._last_step: dict[tuple[int, int], int] = {}
        self._curves: dict[int, list[tuple[int, float]]] = {}  # B -> [(T, ms)], monotone
        self.num_samples = 0
        self.version = 0  # bumped when a curve the cost model reads changes

    # --- samples --------------------------------------------------------------------------

    def add(self, batch_size: int, total_tokens: int, ms: float, *, step: int = 0) -> None:
        """One timed step: `batch_size` requests, `total_tokens` evaluated, `ms` wall."""
        if batch_size < 1 or total_tokens < batch_size or not ms > 0:
            return
        per_b = self._samples.setdefault(batch_size, {})
        q = per_b.get(total_tokens)
        if q is None:
            q = per_b[total_tokens] = collections.deque(maxlen=self.window)
        q.append(float(ms))
        self._last_step[(batch_size, total_tokens)] = step
        self.num_samples += 1
        if len(q) >= self.min_samples:
            self._curves.pop(batch_size, None)
            self.version += 1

    def wanted_probe(self, batch_size: int, step: int) -> int:
        """Tokens a probe at `batch_size` should add to one request's step (0: none is
        needed): the smallest probed size with too few or too old samples."""
        per_b = self._samples.get(batch_size, {})
        for n in PROBE_TOKENS[1:]:
            total = batch_size - 1 + n  # one request steps n tokens, the others one
            q = per_b.get(total)
            stale = step - self._last_step.get((batch_size, total), -(10**9)) > self.refresh_steps
            if q is None or len(q) < self.min_samples or stale:
                return n - 1
        return 0

    def _curve(self, batch_size: int) -> list[tuple[int, float]]:
        curve = self._curves.get(batch_size)
        if curve is None:
            per_b = self._samples.get(batch_size, {})
            points = sorted(
                (t, statistics.median(q)) for t, q in per_b.items() if len(q) >= self.min_samples
            )
            # Monotone in tokens (the running maximum): noise never makes more tokens cheaper.
            curve, top = [], 0.0
            for t, ms in points:
                top = max(top, ms)
                curve.append((t, top))
            self._curves[batch_size] = curve
        return curve

    # --- the cost model -----------------------------------------------------------------

    def _prior_ms(self, total_tokens: float, batch_size: int) -> float | None:
        if self.prior is None:
            return None
        n = max(1, round(total_tokens / batch_size))
        return float(self.prior.step_time_ms(n, batch_size))

    def step_time_ms(self, n_tokens: int, batch_size: int) -> float:
        total = n_tokens * batch_size
        curve = self._curve(batch_size)
        if not curve:
            prior = self._prior_ms(total, batch_size)
            return prior if prior is not None else 1.0
        if total <= curve[0][0]:
            return curve[0][1]
        for (t0, m0), (t1, m1) in zip(curve, curve[1:]):
            if total <= t1:
                return m0 + (m1 - m0) * (total - t0) / (t1 - t0)
        # Past the last live point: the prior's growth from there, at the live level.
        t_last, m_last = curve[-1]
        p_last = self._prior_ms(t_last, batch_size)
        p_here = self._prior_ms(total, batch_size)
        if p_last is not None and p_here is not None and p_last > 0:
            return m_last * max(1.0, p_here / p_last)
        if len(curve) >= 2:
            (t0, m0), (t1, m1) = curve[-2], curve[-1]
            return m_last + max(0.0, (m1 - m0) / (t1 - t0)) * (total - t_last)
        return m_last

    def step_cost(self, n_tokens: int, batch_size: int) -> float:
        return self.step_time_ms(n_tokens, batch_size) / self.step_time_ms(1, batch_size)

    # --- reports ------------------------------------------------------------------------

    def batch_sizes(self) -> Iterator[int]:
        yield from sorted(self._samples)

    def summary(self) -> dict[str, Any]:
        """What /health shows: the source, the live sample counts and the step costs in
        use at each batch size seen (n = 2, 4, 8, 16 tokens per request)."""
        live = {
            str(b): {str(t): len(q) for t, q in sorted(per_b.items())}
            for b, per_b in sorted(self._samples.items())
        }
        costs = {
            str(b): {str(n): round(self.step_cost(n, b), 3) for n in (2, 4, 8, 16)}
            for b in sorted({1, *self._samples})
        }
        return {
            "source": self.source,
            "provisional": self.provisional,
            "live_samples": self.num_samples,
            "live_samples_by_batch_size": live,
            "step_cost": costs,
        }


def describe_profile(cost: Any) -> str:
    """One line on what a profile implies for drafting at batch size 1.

    >>> class Flat:
    ...     def step_cost(self, n, b): return 1.0 + 0.05 * (n - 1)
    >>> describe_profile(Flat()).split(": ")[1]
    'drafting pays once about 5% of an 8-token draft is accepted'
    """
    c2, c8, c16 = (float(cost.step_cost(n, 1)) for n in (2, 8, 16))
    c9 = float(cost.step_cost(9, 1))
    # An 8-token draft accepted at rate p returns 1 + 8p tokens for c(9) steps.
    p = (c9 - 1.0) / 8.0
    head = f"verifying 2 / 8 / 16 tokens costs {c2:.2f}x / {c8:.2f}x / {c16:.2f}x one step"
    if p >= 1.0:
        return f"{head}: drafting never pays with this model on this CPU"
    verdict = "drafting rarely pays with this model on this CPU" if p > 0.6 else "drafting pays"
    return f"{head}: {verdict} once about {p:.0%} of an 8-token draft is accepted"
