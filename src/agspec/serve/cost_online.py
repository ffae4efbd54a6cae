"""A cost profile that heals: the start-up profile, corrected by the server's own steps.

The default drafter `agspec` sizes every draft by what verifying it costs
(`docs/costmodel.md`). A profile measured while the machine was busy, or a wrong
`--cost-profile`, would make it draft too little (or too much) for good. So `agspec serve`
times its own decoding steps and keeps, per batch size and step size, the median of the
quiet ones: `LiveCostProfile` answers the cost model's questions from those where it holds
enough of them and from the start-up profile elsewhere (shaped by it, at the live level),
and the server reprices the drafter with it as samples come in.

The curve is a staircase, not a line. llama.cpp multiplies (repacked) weights a tile of
`tile_tokens` token rows at a time and the rows left over one by one, so on x86 (4-row
tiles) verifying 4 tokens costs little more than 3 and 5 a whole row more. The live curve
is therefore measured at the step sizes where it can bend, both ends of every tile
(`knots`: 1 … 5, 8, 9, 12, 13, 16, 17, … at one request), interpolated linearly only
between two measured sizes of the same tile, and across a tile boundary not yet measured
by the start-up profile's shape. It is kept monotone (a step of more tokens never reads
cheaper) by pooling the medians that violate it (isotonic regression), not by a running
maximum, which would lift every later size to one noisy high.

A wrong profile that says drafting never pays would never see a drafted step, so the
server also *probes*: now and then a decoding request's step carries filler tokens after
its pending token (their logits are ignored and their KV dropped at once; the pending
token's own logits cannot see them, so the output is unchanged), up to the smallest knot
not yet settled: one with fewer than `min_samples` samples within `SETTLED_SPREAD` of
its fastest sample (`quiet_group`: a busy machine only makes steps slower, so samples
taken while it was busy are left out, even when they are the majority), or whose samples
are older than `refresh_steps` steps (a knot with `SETTLE_AFTER` times `min_samples`
samples is settled however they spread: a knot whose steps ran at very different context
lengths spreads for good, and probing it again would not narrow it). A probe reaches no
further than one tile past the largest step the server ran without a probe among its last
`FRONTIER_STEPS` at that batch size (`frontier`): it measures the next sizes the cost rule
could move to, not sizes far beyond anything it drafts, which at several requests cost
several steps each (at four requests a 68-token probe costs about three). A curve that
turns out cheaper there lets the rule draft longer, real steps reach the new sizes and the
frontier moves up a tile at a time.

A step's time depends on more than its size: on how busy the machine is and on how long
the requests' contexts are, and both drift. So a sample of a step larger than one token
per request is read against the steps around it: divided by `conditions` (the median of
the last `BASE_STEPS` one-token steps over the curve's one-token time), it is what that
step would have taken when the one-token steps took the curve's time. A profile whose
few large samples all fell in a busy spell, or in the longest contexts, would otherwise
price every draft far too high and, being kept monotone, every smaller one with it.

Probes cost time: a filler token is verified like a draft token that is never accepted.
So the probes' extra time (a probe step's time less the live price of the same step
without its filler) is kept within `PROBE_SHARE` of all the decoding time timed, plus an
allowance of `PROBE_ALLOWANCE_STEPS` one-token steps (enough to measure the first tile,
where a profile that says drafting never pays is proven wrong); past that budget no knot
is probed until decoding has earned more.

Times are keyed by (batch size B, total tokens T of the step); the cost model's
`step_time_ms(n, B)` reads the curve of B at T = n * B (n tokens per request).

>>> live = LiveCostProfile(None, min_samples=1)
>>> for t, ms in [(1, 10.0), (3, 14.0), (4, 15.0), (5, 22.0), (8, 25.0)]:
...     live.add(1, t, ms)
>>> live.step_time_ms(2, 1), live.step_time_ms(4, 1), live.step_time_ms(6, 1)
(12.0, 15.0, 23.0)
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["LiveCostProfile", "SETTLED_SPREAD", "TILE_TOKENS", "describe_profile", "monotone"]

# Token rows llama.cpp's repacked CPU matmuls multiply at once on x86 (ggml-cpu/repack.cpp:
# a GEMM over 4 rows, the rest by GEMV).
TILE_TOKENS = 4
# A knot's samples agree when within this share above its fastest sample.
SETTLED_SPREAD = 0.25
# Step costs `summary()` reports per batch size: tile ends and the size just past them.
# Unprobed steps per batch size whose largest size is the probes' frontier.
FRONTIER_STEPS = 256
SUMMARY_TOKENS = (2, 4, 5, 8, 9, 16, 17)
# The probes' extra time is at most this share of the decoding time timed, plus an
# allowance of this many one-token steps.
PROBE_SHARE = 0.01
PROBE_ALLOWANCE_STEPS = 8.0
# A larger step's time is read against the median of this many last one-token steps.
BASE_STEPS = 8
# A knot with this many times `min_samples` samples is settled however they spread.
SETTLE_AFTER = 3


def monotone(points: list[tuple[int, float, int]]) -> list[tuple[int, float]]:
    """The weighted least-squares monotone fit of (T, ms, weight) points sorted by T (pool
    adjacent violators): a dip is pooled with its neighbours, a real step is kept.

    >>> monotone([(1, 10.0, 1), (2, 13.0, 1), (3, 11.0, 1), (4, 20.0, 1)])
    [(1, 10.0), (2, 12.0), (3, 12.0), (4, 20.0)]
    """
    blocks: list[list[float]] = []  # [sum of weight * ms, total weight, points]
    for _, ms, w in points:
        blocks.append([ms * w, float(w), 1.0])
        while len(blocks) >= 2 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, wt, k = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += wt
            blocks[-1][2] += k
    out: list[tuple[int, float]] = []
    i = 0
    for s, wt, k in blocks:
        for _ in range(int(k)):
            out.append((points[i][0], s / wt))
            i += 1
    return out


def quiet_group(samples: Iterable[float]) -> list[float]:
    """The samples within `SETTLED_SPREAD` of the fastest one: what a step takes on the
    quiet machine. A busy machine only makes a step slower, so when busy samples are the
    majority their median would be the busy time; the fastest group is not moved by them.

    >>> quiet_group([16.7, 6.8, 6.9, 16.7, 17.3])
    [6.8, 6.9]
    """
    ordered = sorted(samples)
    if not ordered:
        return []
    top = ordered[0] * (1.0 + SETTLED_SPREAD)
    return [ms for ms in ordered if ms <= top]


class LiveCostProfile:
    """Medians of the server's own step times per (batch size, step tokens), over a
    `prior` cost model (None: live samples only; a curve without samples at B then costs
    every step the same). Monotone in tokens: a step of more tokens never reads cheaper.
    `max_tokens`: the most tokens one request verifies in a step (1 + the draft cap), the
    largest size probed at one request.

    Not thread-safe: the decode worker adds and reads; other threads read `summary()`,
    which copies what it reads.
    """

    def __init__(
        self,
        prior: Any,
        *,
        max_tokens: int = 17,
        tile_tokens: int = TILE_TOKENS,
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
        if max_tokens < 1 or tile_tokens < 1:
            raise ValueError(
                f"max_tokens and tile_tokens must be >= 1, got {max_tokens}, {tile_tokens}"
            )
        self.prior = prior
        self.max_tokens = max_tokens
        self.tile_tokens = tile_tokens
        self.min_samples = min_samples
        self.window = window
        self.refresh_steps = refresh_steps
        self.source = source
        self.provisional = provisional
        self._samples: dict[int, dict[int, collections.deque[float]]] = {}
        self._last_step: dict[tuple[int, int], int] = {}
        self._curves: dict[int, list[tuple[int, float]]] = {}  # B -> [(T, ms)], monotone
        self._prices: dict[int, dict[int, float]] = {}  # B -> T -> ms, read off the curve
        self._knots: dict[int, list[int]] = {}
        # B -> the times of the last BASE_STEPS steps of one token per request.
        self._base_recent: dict[int, collections.deque[float]] = {}
        # B -> total tokens of the last FRONTIER_STEPS steps run without a probe.
        self._unprobed: dict[int, collections.deque[int]] = {}
        self.num_samples = 0
        self.num_probes = 0
        self.decode_ms = 0.0  # every timed step's time
        self.probe_extra_ms = 0.0  # what the probes' filler added to it (>= 0 each)
        self.version = 0  # bumped when a curve the cost model reads changes

    # --- samples --------------------------------------------------------------------------

    def add(
        self,
        batch_size: int,
        total_tokens: int,
        ms: float,
        *,
        step: int = 0,
        probe: bool = False,
        filler: int = 0,
    ) -> None:
        """One timed step: `batch_size` requests, `total_tokens` evaluated, `ms` wall;
        `probe`: the step carried a probe's `filler` tokens (its size does not move the
        frontier; what the filler added counts against the probe budget)."""
        if batch_size < 1 or total_tokens < batch_size or not ms > 0:
            return
        self.decode_ms += ms
        if total_tokens == batch_size:
            base = self._base_recent.get(batch_size)
            if base is None:
                base = self._base_recent[batch_size] = collections.deque(maxlen=BASE_STEPS)
            base.append(float(ms))
            scale = 1.0
        else:
            scale = self.conditions(batch_size)
        if probe:
            self.num_probes += 1
            if 0 < filler <= total_tokens - batch_size:
                without = self._price(total_tokens - filler, batch_size) * scale
                self.probe_extra_ms += max(0.0, ms - without)
        else:
            recent = self._unprobed.get(batch_size)
            if recent is None:
                recent = self._unprobed[batch_size] = collections.deque(maxlen=FRONTIER_STEPS)
            recent.append(total_tokens)
        per_b = self._samples.setdefault(batch_size, {})
        q = per_b.get(total_tokens)
        if q is None:
            q = per_b[total_tokens] = collections.deque(maxlen=self.window)
        q.append(float(ms) / scale)
        self._last_step[(batch_size, total_tokens)] = step
        self.num_samples += 1
        if len(q) >= self.min_samples:
            self._curves.pop(batch_size, None)
            self._prices.pop(batch_size, None)
            self.version += 1

    def conditions(self, batch_size: int) -> float:
        """How much slower a step runs now than the curve's own one-token-per-request
        time: the median of the last `BASE_STEPS` such steps at `batch_size` over the
        curve's (1.0 until both exist). A larger step's sample is divided by it, so that
        it is priced against the steps around it, not against steps taken when the
        machine was quieter or the context shorter.

        >>> live = LiveCostProfile(None, min_samples=1)
        >>> live.add(1, 1, 10.0); live.add(1, 1, 20.0); live.add(1, 1, 20.0)
        >>> live.conditions(1)   # the curve's one-token time is its quiet sample, 10 ms
        2.0
        >>> live.add(1, 4, 30.0); live.step_cost(4, 1)   # 30 ms when one token took 20
        1.5
        """
        recent = self._base_recent.get(batch_size)
        q = self._samples.get(batch_size, {}).get(batch_size)
        if not recent or q is None or len(q) < self.min_samples:
            return 1.0
        quiet = quiet_group(q)
        if not quiet:
            return 1.0
        return max(1e-3, statistics.median(recent) / statistics.median(quiet))

    def knots(self, batch_size: int) -> list[int]:
        """The step sizes (total tokens) measured at `batch_size`: where the cost model
        reads (T = n * B, n = 1 .. max_tokens), or, for a T inside a tile, both ends of
        that tile (the curve is linear inside a tile and jumps between tiles).

        >>> LiveCostProfile(None).knots(1)
        [1, 2, 3, 4, 5, 8, 9, 12, 13, 16, 17]
        >>> LiveCostProfile(None, max_tokens=6).knots(2)
        [2, 4, 5, 8, 9, 12]
        """
        knots = self._knots.get(batch_size)
        if knots is None:
            w, b = self.tile_tokens, batch_size
            found: set[int] = set()
            for n in range(1, self.max_tokens + 1):
                t = n * b
                start = (t - 1) // w * w + 1  # the tile holding T: start .. start + w - 1
                if t <= w + 1 or t in (start, start + w - 1) or start < b:
                    found.add(t)
                else:
                    found.update((start, start + w - 1))
            knots = self._knots[batch_size] = sorted(found)
        return knots

    def _settled(self, q: collections.deque[float] | None) -> bool:
        if q is None or len(q) < self.min_samples:
            return False
        if len(q) >= min(self.window, SETTLE_AFTER * self.min_samples):
            return True
        return len(quiet_group(q)) >= self.min_samples

    def probe_budget_left_ms(self, batch_size: int) -> float:
        """What probes may still add: `PROBE_SHARE` of the decoding time timed plus
        `PROBE_ALLOWANCE_STEPS` one-token steps at `batch_size`, less what they added.

        >>> live = LiveCostProfile(None, min_samples=1)
        >>> live.add(1, 1, 10.0); round(live.probe_budget_left_ms(1), 2)  # 0.1 + 8 x 10
        80.1
        >>> live.add(1, 5, 40.0, probe=True, filler=4); round(live.probe_budget_left_ms(1), 2)
        50.5
        """
        allowance = PROBE_ALLOWANCE_STEPS * self._price(batch_size, batch_size)
        return PROBE_SHARE * self.decode_ms + allowance - self.probe_extra_ms

    def frontier(self, batch_size: int) -> int:
        """The largest step (total tokens) of the last `FRONTIER_STEPS` steps at
        `batch_size` run without a probe (`batch_size` before any).

        >>> live = LiveCostProfile(None)
        >>> live.add(2, 2, 10.0); live.add(2, 7, 14.0); live.add(2, 30, 40.0, probe=True)
        >>> live.frontier(2), live.frontier(3)
        (7, 3)
        """
        recent = self._unprobed.get(batch_size)
        return max(recent) if recent else batch_size

    def wanted_probe(self, batch_size: int, step: int, step_tokens: int | None = None) -> int:
        """Filler tokens a probe should add to a step of `batch_size` requests and
        `step_tokens` tokens so far (default: one each) to bring it to the smallest knot
        not yet settled, else the smallest stale one (0: none is needed), no further than
        one tile past the frontier, and none once the probes have spent their budget
        (`probe_budget_left_ms`): refreshing the small knots never starves a larger one.

        >>> live = LiveCostProfile(None, min_samples=1)
        >>> live.add(1, 1, 10.0); live.wanted_probe(1, 0)
        1
        >>> for t in (2, 3, 4, 5): live.add(1, t, 10.0 + t, probe=True)
        >>> live.wanted_probe(1, 0)  # 8 is past the frontier (1) and a tile
        0
        >>> live.add(1, 5, 15.0); live.wanted_probe(1, 0)  # a 5-token step ran
        7
        """
        used = batch_size if step_tokens is None else step_tokens
        if self.probe_budget_left_ms(batch_size) <= 0:
            return 0
        per_b = self._samples.get(batch_size, {})
        reach = self.frontier(batch_size) + self.tile_tokens + 1
        stale = 0  # the smallest stale knot: probed when no knot is unsettled
        for total in self.knots(batch_size):
            if total <= used:
                continue
            if total > reach:
                break
            if not self._settled(per_b.get(total)):
                return total - used
            age = step - self._last_step.get((batch_size, total), 0)
            if not stale and age > self.refresh_steps:
                stale = total
        return stale - used if stale else 0

    def _curve(self, batch_size: int) -> list[tuple[int, float]]:
        curve = self._curves.get(batch_size)
        if curve is None:
            per_b = self._samples.get(batch_size, {})
            points = sorted(
                (t, statistics.median(g), len(g))
                for t, q in per_b.items()
                if len(q) >= self.min_samples and (g := quiet_group(q))
            )
            curve = self._curves[batch_size] = monotone(points)
        return curve

    # --- the cost model -----------------------------------------------------------------

    def _prior_ms(self, total_tokens: float, batch_size: int) -> float | None:
        if self.prior is None:
            return None
        n = max(1, round(total_tokens / batch_size))
        return float(self.prior.step_time_ms(n, batch_size))

    def _between(self, total: int, a: tuple[int, float], b: tuple[int, float], bs: int) -> float:
        """The price of T = `total` between two measured points a < T < b: linear inside
        one tile; across a tile boundary the prior's shape (its running maximum from a,
        so monotone), linear when there is no prior or it is flat there."""
        (t0, m0), (t1, m1) = a, b
        w = self.tile_tokens
        if (t0 - 1) // w != (t1 - 1) // w and self.prior is not None:
            p0 = self._prior_ms(t0, bs)
            p1 = self._prior_ms(t1, bs)
            if p0 is not None and p1 is not None and p1 > p0:
                top = max(p0, *(self._prior_ms(t, bs) or p0 for t in range(t0 + 1, total + 1)))
                u = min(1.0, (top - p0) / (p1 - p0))
                return m0 + (m1 - m0) * u
        return m0 + (m1 - m0) * (total - t0) / (t1 - t0)

    def step_time_ms(self, n_tokens: int, batch_size: int) -> float:
        total = n_tokens * batch_size
        prices = self._prices.setdefault(batch_size, {})
        ms = prices.get(total)
        if ms is None:
            ms = prices[total] = self._price(total, batch_size)
        return ms

    def _price(self, total: int, batch_size: int) -> float:
        curve = self._curve(batch_size)
        if not curve:
            prior = self._prior_ms(total, batch_size)
            return prior if prior is not None else 1.0
        if total <= curve[0][0]:
            return curve[0][1]
        for a, b in zip(curve, curve[1:]):
            if total == b[0]:
                return b[1]
            if total < b[0]:
                return self._between(total, a, b, batch_size)
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
        use at each batch size seen (n = 2, 4, 5, 8, 9, 16, 17 tokens per request: the
        tile ends and the sizes just past them)."""
        live = {
            str(b): {str(t): len(q) for t, q in sorted(per_b.items())}
            for b, per_b in sorted(self._samples.items())
        }
        costs = {
            str(b): {str(n): round(self.step_cost(n, b), 3) for n in SUMMARY_TOKENS}
            for b in sorted({1, *self._samples})
        }
        return {
            "source": self.source,
            "provisional": self.provisional,
            "tile_tokens": self.tile_tokens,
            "live_samples": self.num_samples,
            "probes": self.num_probes,
            "probe_share": round(self.probe_extra_ms / max(self.decode_ms, 1e-9), 4),
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
