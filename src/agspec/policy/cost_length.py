"""Cost-aware draft length (beyond the paper; `DraftLengthPolicy` variant "cost").

Where verification is dear (a CPU: verifying 2 tokens costs 2.2-3.7 decode steps on
llama.cpp), the draft length maximizes the expected committed tokens per unit of step
cost,

    L* = argmax_{0 ≤ L ≤ retrieved} (1 + Σ_{k ≤ L} S_a(k | m)) / c(L + 1),

with c from the measured cost profile (c(1) = 1) and S_a(k | m) = P(r ≥ k) for agent a
and the match length's bucket, learned online from every verification (`MatchSurvival`).
L* = 0 (no draft) whenever plain decoding is expected to be faster. At batch size > 1 a
request's draft is priced at its marginal cost in the ragged batch
(`best_length_in_batch`). docs/costmodel.md ("The cost-aware length") has the derivation.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from agspec.policy.survival import CURVES_FORMAT, MATCH_BUCKETS, MatchSurvival, match_bucket

__all__ = [
    "CURVES_FORMAT",
    "MATCH_BUCKETS",
    "MatchSurvival",
    "batch_prices",
    "best_length",
    "best_length_at_prices",
    "best_length_in_batch",
    "best_lengths",
    "best_lengths_at_prices",
    "match_bucket",
]


logger = logging.getLogger(__name__)


def best_length(curve: Sequence[float], step_costs: Sequence[float], limit: int) -> int:
    """argmax over L in [0, limit] of (1 + Σ_{k≤L} curve[k-1]) / step_costs[L] (ties: the
    shorter L); step_costs[n-1] is the cost of verifying n tokens, step_costs[0] = 1.

    >>> best_length([0.9, 0.8, 0.1], [1.0, 1.5, 1.6, 3.0], 3)   # (1+.9+.8)/1.6 = 1.69
    2
    >>> best_length([0.5, 0.25], [1.0, 3.7, 4.5], 2)            # drafting never pays
    0
    """
    limit = min(limit, len(curve), len(step_costs) - 1)
    best, best_value, expected = 0, 1.0 / step_costs[0], 1.0
    for n in range(1, limit + 1):
        expected += curve[n - 1]
        value = expected / step_costs[n]
        if value > best_value:
            best, best_value = n, value
    return best


def best_lengths(curve: Sequence[float], step_costs: Sequence[float], limit: int) -> list[int]:
    """[best_length(curve, step_costs, l) for l in 0 .. limit'] in one pass, limit' =
    min(limit, len(curve), len(step_costs) - 1): the argmax over [0, l] of a running ratio
    is the argmax of its first l terms, so every limit's answer is the running best of one
    scan (the same float operations as `best_length`'s, so the same answers).

    >>> best_lengths([0.9, 0.8, 0.1], [1.0, 1.5, 1.6, 3.0], 3)
    [0, 1, 2, 2]
    """
    limit = min(limit, len(curve), len(step_costs) - 1)
    best, best_value, expected = 0, 1.0 / step_costs[0], 1.0
    out = [0]
    for n in range(1, limit + 1):
        expected += curve[n - 1]
        value = expected / step_costs[n]
        if value > best_value:
            best, best_value = n, value
        out.append(best)
    return out


def _interp(costs: Sequence[float], y: float) -> float:
    """costs[n] at a fractional n (linear between points; the last slope beyond)."""
    if y <= 0:
        return costs[0]
    i = min(int(y), len(costs) - 2)
    return costs[i] + (costs[i + 1] - costs[i]) * (y - i)


def best_length_in_batch(
    curve: Sequence[float],
    step_costs: Sequence[float],
    limit: int,
    *,
    batch_size: int,
    mean_draft: float,
    mean_committed: float,
) -> int:
    """The draft length of one request among `batch_size` that share a step.

    In a ragged batch the step's cost follows the mean draft over the requests:
    C(x) = step_costs at 1 + x tokens per request (step_costs[n-1] is the cost of n, all
    requests alike, C(0) = 1). This request moves the mean by L / B, so its draft costs
    Δ(L) = C(x0 + L/B) − C(x0), x0 = mean_draft·(B−1)/B (the others), and is worth what it
    adds to the batch's committed tokens at the batch's current rate
    ρ = B·mean_committed / C(mean_draft) tokens per unit cost:
        L* = argmax over L in [0, limit] of  E(L) − ρ·Δ(L),   E(L) = Σ_{k≤L} curve[k-1].
    At B = 1 this is the Dinkelbach form of `best_length`'s ratio (the same argmax once ρ
    is the best rate); `best_length` is used there, as it needs no running state.
    ρ·Δ(L) is the same for every request of a step: `batch_prices` computes it once and
    `best_length_at_prices` takes the argmax (this is the two of them).

    >>> flat = [1.0 + 0.01 * n for n in range(17)]       # memory-bound: drafts are cheap
    >>> best_length_in_batch([0.5**k for k in range(1, 17)], flat, 16, batch_size=16,
    ...                      mean_draft=4.0, mean_committed=3.0)   # ρ = 48 / 1.04
    5

    Each token adds 0.01/16 to the cost, worth ρ·0.01/16 = 0.029 tokens: 0.5^5 = 0.031 is
    above that, 0.5^6 = 0.016 below.
    """
    prices = batch_prices(
        step_costs, batch_size=batch_size, mean_draft=mean_draft, mean_committed=mean_committed
    )
    return best_length_at_prices(curve, prices, limit)


def batch_prices(
    step_costs: Sequence[float],
    *,
    batch_size: int,
    mean_draft: float,
    mean_committed: float,
    max_tokens: int | None = None,
) -> list[float]:
    """[ρ·Δ(0), ρ·Δ(1), ..., ρ·Δ(K)] of `best_length_in_batch`, K = len(step_costs) − 1
    (or `max_tokens`, when smaller): what an L-token draft costs, in committed tokens, at
    this step's batch state.

    >>> [round(p, 3) for p in batch_prices([1.0, 1.5, 2.0], batch_size=2, mean_draft=0.0,
    ...                                    mean_committed=1.0)]   # ρ = 2, Δ(L) = L / 4
    [0.0, 0.5, 1.0]
    """
    b = float(batch_size)
    x0 = mean_draft * (b - 1.0) / b
    base = _interp(step_costs, x0)
    step = _interp(step_costs, mean_draft)
    if step <= 0.0:
        # A profile whose last measured costs fall, extrapolated far enough, reaches 0: a
        # step never costs less than the cheapest measured one.
        step = min(step_costs)
    rho = b * mean_committed / step
    top = len(step_costs) - 1 if max_tokens is None else min(max_tokens, len(step_costs) - 1)
    prices = [0.0]
    last = len(step_costs) - 2
    for n in range(1, top + 1):
        # _interp(step_costs, y), inlined: the same float operations.
        y = x0 + n / b
        if y <= 0:
            cost = step_costs[0]
        else:
            i = int(y)
            if i > last:
                i = last
            cost = step_costs[i] + (step_costs[i + 1] - step_costs[i]) * (y - i)
        prices.append(rho * (cost - base))
    return prices


def best_length_at_prices(curve: Sequence[float], prices: Sequence[float], limit: int) -> int:
    """argmax over L in [0, limit] of Σ_{k≤L} curve[k-1] − prices[L] (ties: the shorter
    L), L ≤ len(curve) and ≤ len(prices) − 1; `batch_prices` gives the prices.

    >>> best_length_at_prices([0.9, 0.5, 0.1], [0.0, 0.3, 0.6, 0.9], 3)   # 1.4 - 0.6
    2
    """
    limit = min(limit, len(curve), len(prices) - 1)
    best, best_value, expected = 0, 0.0, 0.0
    for n in range(1, limit + 1):
        expected += curve[n - 1]
        value = expected - prices[n]
        if value > best_value:
            best, best_value = n, value
    return best


def best_lengths_at_prices(
    curve: Sequence[float], prices: Sequence[float], limit: int
) -> list[int]:
    """[best_length_at_prices(curve, prices, l) for l in 0 .. limit'] in one pass, limit' =
    min(limit, len(curve), len(prices) - 1) (as `best_lengths`).

    >>> best_lengths_at_prices([0.9, 0.5, 0.1], [0.0, 0.3, 0.6, 0.9], 3)
    [0, 1, 2, 2]
    """
    limit = min(limit, len(curve), len(prices) - 1)
    best, best_value, expected = 0, 0.0, 0.0
    out = [0]
    for n in range(1, limit + 1):
        expected += curve[n - 1]
        value = expected - prices[n]
        if value > best_value:
            best, best_value = n, value
        out.append(best)
    return out
