"""Acceptance curves S_a(k | m) = P(r >= k) per agent and match-length bucket, learned online.

The input of the cost-aware draft length (`agspec.policy.cost_length`); saved atomically
to a curves file so they survive a restart.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Sequence
from itertools import accumulate, islice
from operator import mul, truediv
from pathlib import Path
from typing import Any

from agspec.policy._state import atomic_write_text, check_int, finite_number, read_state_file

logger = logging.getLogger(__name__)


CURVES_FORMAT = "agspec-acceptance-curves"


MATCH_BUCKETS = 8


def match_bucket(match_tokens: int) -> int:
    """Log2 bucket of a match length: 0 | 1 | 2-3 | 4-7 | 8-15 | 16-31 | 32-63 | 64+.

    >>> [match_bucket(m) for m in (0, 1, 2, 3, 4, 15, 16, 64, 1000)]
    [0, 1, 2, 2, 3, 4, 5, 7, 7]
    """
    return min(match_tokens.bit_length(), MATCH_BUCKETS - 1)


# A match length in each bucket, bucket by bucket (0, 1, 2, 4, ..., 64).
MATCH_OF_BUCKET: list[int] = [0] + [1 << (b - 1) for b in range(1, MATCH_BUCKETS)]
# match_bucket(m) for m = 0 .. 64; every longer match is in the last entry's bucket (a
# native call reads the bucket of m at min(m, 64)).
BUCKET_OF_MATCH: list[int] = [match_bucket(m) for m in range(MATCH_OF_BUCKET[-1] + 1)]


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
        # Bumped whenever a curve may change (observe): answers computed from the curves
        # at one version stay valid while it holds (DraftLengthPolicy.cost_length).
        self.version = 0

    def _prior(self, bucket: int) -> tuple[list[float], list[float]]:
        m0 = 1 << max(bucket - 1, 0)
        q = m0 / (m0 + 1)
        w = self.prior_weight
        at_risk = [w * q ** (k - 1) for k in range(1, self.max_tokens + 1)]
        survived = [w * q**k for k in range(1, self.max_tokens + 1)]
        return at_risk, survived

    def curve(self, agent: str, match_tokens: int, head_tokens: int | None = None) -> list[float]:
        """[S(1), ..., S(max_tokens)] for this agent and match length (cached); with
        `head_tokens`, possibly only its first min(head_tokens, max_tokens) entries (a
        caller that reads no further: the cost rule of a short draft)."""
        key = (agent, match_bucket(match_tokens))
        need = self.max_tokens
        if head_tokens is not None and head_tokens < need:
            need = head_tokens
        cached = self._curves.get(key)
        if cached is not None and len(cached) >= need:
            return cached
        at_risk, survived = self._counts.get(key) or self._prior(key[1])
        # The running product of h / n, left to right: S(k) = Π_{j≤k} survived / at risk
        # (a head is the same floats as the whole curve's first entries).
        out = list(islice(accumulate(map(truediv, survived, at_risk), mul), max(need, 0)))
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
        self.version += 1

    def observe_batch(
        self,
        agents: Sequence[str],
        match_tokens: Sequence[int],
        drafted_tokens: Sequence[int],
        accepted_tokens: Sequence[int],
    ) -> None:
        """`observe` for many verifications, in order (one batch step of many requests):
        the same counts, curves and version as that many `observe` calls.

        >>> s, t = MatchSurvival(max_tokens=4), MatchSurvival(max_tokens=4)
        >>> s.observe_batch(["coder", "coder"], [3, 20], [4, 2], [1, 2])
        >>> t.observe("coder", 3, drafted_tokens=4, accepted_tokens=1)
        >>> t.observe("coder", 20, drafted_tokens=2, accepted_tokens=2)
        >>> s.curve("coder", 3) == t.curve("coder", 3) and s.version == t.version == 2
        True
        """
        top = MATCH_BUCKETS - 1
        max_tokens = self.max_tokens
        all_counts, curves = self._counts, self._curves
        changed = 0
        for agent, m, dr, ac in zip(agents, match_tokens, drafted_tokens, accepted_tokens):
            d = dr if dr < max_tokens else max_tokens
            a = ac if ac < d else d
            if d <= 0 or a < 0:
                continue
            bucket = m.bit_length()
            key = (agent, bucket if bucket < top else top)
            counts = all_counts.get(key)
            if counts is None:
                counts = all_counts[key] = self._prior(key[1])
            at_risk, survived = counts
            # One += 1.0 per position, as `observe` does (the same floats): positions
            # 1..a survived, and a + 1 was at risk too when the draft reached it.
            for i in range(a):
                at_risk[i] += 1.0
                survived[i] += 1.0
            if a < d:
                at_risk[a] += 1.0
            curves.pop(key, None)
            changed += 1
        self.version += changed

    @property
    def counts(self) -> dict[tuple[str, int], tuple[list[float], list[float]]]:
        """What was learned, by (agent, match bucket): (at-risk counts, survived counts),
        index k - 1, prior included; a copy (buckets never observed are absent).

        >>> s = MatchSurvival(max_tokens=2, prior_weight=1.0)
        >>> s.observe("coder", 1, drafted_tokens=2, accepted_tokens=1)
        >>> s.counts
        {('coder', 1): ([2.0, 1.5], [1.5, 0.25])}
        """
        return {k: (list(a), list(s)) for k, (a, s) in self._counts.items()}

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
            out.version += 1
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
