"""Cost-aware draft length (beyond the paper; `DraftLengthPolicy` variant "cost").

Where verification is dear (a CPU: verifying 2 tokens costs 2.2-3.7 decode steps on
llama.cpp), the draft length maximizes the expected committed tokens per unit of step
cost,

    L* = argmax_{0 ≤ L ≤ retrieved} (1 + Σ_{k ≤ L} S_a(k | m)) / c(L + 1),

with c from the measured cost profile (c(1) = 1) and S_a(k | m) = P(r ≥ k) for agent a
and the match length's bucket, learned online from every verification (`MatchSurvival`).
L* = 0 (no draft) whenever plain decoding is expected to be faster. At batch size > 1 a
request's draft is priced at its marginal cost in the ragged batch
(`best_length_in_batch`). docs/costmodel.md §5b has the derivation and the measurements.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agspec.policy._util import atomic_write_text, check_int, finite_number, read_state_file

__all__ = [
    "CURVES_FORMAT",
    "MATCH_BUCKETS",
    "MatchSurvival",
    "best_length",
    "best_length_in_batch",
    "match_bucket",
]

logger = logging.getLogger(__name__)

CURVES_FORMAT = "agspec-acceptance-curves"
MATCH_BUCKETS = 8


def match_bucket(match_tokens: int) -> int:
    """Log2 bucket of a match length: 0 | 1 | 2-3 | 4-7 | 8-15 | 16-31 | 32-63 | 64+.

    >>> [match_bucket(m) for m in (0, 1, 2, 3, 4, 15, 16, 64, 1000)]
    [0, 1, 2, 2, 3, 4, 5, 7, 7]
    """
    return min(match_tokens.bit_length(), MATCH_BUCKETS - 1)


class MatchSurvival:
    """S_a(k | m) = P(r ≥ k): the chance that the first k draft tokens are accepted, for
    agent a and the bucket of the match length m, learned online.

    Each verification of a d-token draft with a accepted tokens is a censored run
    length: positions 1..min(a+1, d) were at risk, positions 1..a survived (as in
    `acceptance_curve`). The estimate is the product-limit one over the observed counts
    plus a prior of `prior_weight` pseudo-drafts with a geometric curve S(k) = q^k,
    q = m0 / (m0 + 1) at the bucket's shortest match m0 (a 1-token match: q = 1/2; an
    8-token one: 8/9), so an agent starts out trusting long matches more than short ones
    and its own outcomes take over after a few drafts.

    >>> s = MatchSurvival(max_tokens=4, prior_weight=1.0)
    >>> [round(p, 3) for p in s.curve("coder", 1)]      # prior alone, q = 1/2
    [0.5, 0.25, 0.125, 0.062]
    >>> for _ in range(3):
    ...     s.observe("coder", 1, drafted_tokens=4, accepted_tokens=4)
    >>> [round(p, 3) for p in s.curve("coder", 1)]      # (3 + 1/2) / (3 + 1) at k = 1
    [0.875, 0.812, 0.781, 0.766]
    """

    def __init__(self, *, max_tokens: int = 32, prior_weight: float = 4.0) -> None:
        self.max_tokens = check_int("max_tokens", max_tokens, minimum=1)
        if not isinstance(prior_weight, (int, float)) or not prior_weight > 0:
            raise ValueError(f"prior_weight must be > 0, got {prior_weight!r}")
        self.prior_weight = float(prior_weight)
        # (agent, bucket) -> [at_risk counts, survived counts], index k-1
        self._counts: dict[tuple[str, int], tuple[list[float], list[float]]] = {}
        self._curves: dict[tuple[str, int], list[float]] = {}

    def _prior(self, bucket: int) -> tuple[list[float], list[float]]:
        m0 = 1 << max(bucket - 1, 0)
        q = m0 / (m0 + 1)
        w = self.prior_weight
        at_risk = [w * q ** (k - 1) for k in range(1, self.max_tokens + 1)]
        survived = [w * q**k for k in range(1, self.max_tokens + 1)]
        return at_risk, survived

    def curve(self, agent: str, match_tokens: int) -> list[float]:
        """[S(1), ..., S(max_tokens)] for this agent and match length (cached)."""
        key = (agent, match_bucket(match_tokens))
        cached = self._curves.get(key)
        if cached is not None:
            return cached
        at_risk, survived = self._counts.get(key) or self._prior(key[1])
        out, s = [], 1.0
        for n, h in zip(at_risk, survived):
            s *= h / n
            out.append(s)
        self._curves[key] = out
        return out

    def observe(
        self, agent: str, match_tokens: int, *, drafted_tokens: int, accepted_tokens: int
    ) -> None:
        """One verification: `accepted_tokens` of a `drafted_tokens`-token draft."""
        d = min(drafted_tokens, self.max_tokens)
        a = min(accepted_tokens, d)
        if d <= 0 or a < 0:
            return
        key = (agent, match_bucket(match_tokens))
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = self._prior(key[1])
        at_risk, survived = counts
        for i in range(min(a + 1, d)):
            at_risk[i] += 1.0
        for i in range(a):
            survived[i] += 1.0
        self._curves.pop(key, None)

    def to_json(self) -> str:
        rows = [
            {"agent": agent, "bucket": bucket, "at_risk": at_risk, "survived": survived}
            for (agent, bucket), (at_risk, survived) in sorted(self._counts.items())
        ]
        doc = {
            "format": CURVES_FORMAT,
            "version": 1,
            "max_tokens": self.max_tokens,
            "prior_weight": self.prior_weight,
            "curves": rows,
        }
        return json.dumps(doc) + "\n"

    def save(self, path: str | os.PathLike[str]) -> None:
        """Atomic: a crash mid-write leaves the previous file intact."""
        atomic_write_text(path, self.to_json())

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, max_tokens: int = 32, prior_weight: float = 4.0
    ) -> MatchSurvival:
        """Curves saved by `save`; a missing file starts from the prior. A corrupt file, or
        one saved with another `max_tokens`, is reported (RuntimeWarning) and ignored."""
        out = cls(max_tokens=max_tokens, prior_weight=prior_weight)
        p = Path(path)
        try:
            doc = read_state_file(p, CURVES_FORMAT)
            saved_max = doc.get("max_tokens")
            if isinstance(saved_max, bool) or saved_max != max_tokens:
                raise ValueError(
                    f"saved with max_tokens={doc.get('max_tokens')!r}, this server uses "
                    f"{max_tokens}"
                )
            rows = doc.get("curves", [])
            if not isinstance(rows, list):
                raise ValueError("'curves' must be a list")
            counts: dict[tuple[str, int], tuple[list[float], list[float]]] = {}
            for i, row in enumerate(rows):
                try:
                    key, pair = _curve_row(row, max_tokens)
                except ValueError as exc:
                    raise ValueError(f"curves[{i}]: {exc}") from None
                counts[key] = pair
            out._counts = counts
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            warnings.warn(
                f"ignoring acceptance curves file {p}: {exc}", RuntimeWarning, stacklevel=2
            )
            logger.warning("ignoring acceptance curves file %s: %s", p, exc)
        return out


def _curve_row(
    row: Any, max_tokens: int
) -> tuple[tuple[str, int], tuple[list[float], list[float]]]:
    """One saved curve, checked: ValueError naming what is wrong."""
    if not isinstance(row, dict):
        raise ValueError("not an object")
    agent, bucket = row.get("agent"), row.get("bucket")
    if not isinstance(agent, str):
        raise ValueError("agent must be a string")
    if isinstance(bucket, bool) or not isinstance(bucket, int) or not 0 <= bucket < MATCH_BUCKETS:
        raise ValueError(f"bucket must be an integer in [0, {MATCH_BUCKETS})")
    lists = []
    for name in ("at_risk", "survived"):
        raw = row.get(name)
        if not isinstance(raw, list) or len(raw) != max_tokens:
            raise ValueError(f"{name} of {agent!r} must be a list of {max_tokens} numbers")
        values = [finite_number(x) for x in raw]
        if any(v is None for v in values):
            raise ValueError(f"{name} of {agent!r}: counts must be finite numbers (not booleans)")
        lists.append([float(v) for v in values if v is not None])
    at_risk, survived = lists
    if any(not 0 < h <= n for n, h in zip(at_risk, survived)):
        raise ValueError(f"curve of {agent!r}: counts outside 0 < survived <= at risk")
    return (agent, bucket), (at_risk, survived)


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

    >>> flat = [1.0 + 0.01 * n for n in range(17)]       # memory-bound: drafts are cheap
    >>> best_length_in_batch([0.5**k for k in range(1, 17)], flat, 16, batch_size=16,
    ...                      mean_draft=4.0, mean_committed=3.0)   # ρ = 48 / 1.04
    5

    Each token adds 0.01/16 to the cost, worth ρ·0.01/16 = 0.029 tokens: 0.5^5 = 0.031 is
    above that, 0.5^6 = 0.016 below.
    """
    b = float(batch_size)
    limit = min(limit, len(curve), len(step_costs) - 1)
    x0 = mean_draft * (b - 1.0) / b
    base = _interp(step_costs, x0)
    rho = b * mean_committed / _interp(step_costs, mean_draft)
    best, best_value, expected = 0, 0.0, 0.0
    for n in range(1, limit + 1):
        expected += curve[n - 1]
        value = expected - rho * (_interp(step_costs, x0 + n / b) - base)
        if value > best_value:
            best, best_value = n, value
    return best
