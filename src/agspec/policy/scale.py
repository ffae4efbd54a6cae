"""The online per-agent scale alpha_a of the draft length (paper §3.2), persisted atomically.

alpha_a starts at 1; after each verification alpha_a += eta * (1[a = d] - p*), where a is the
accept length (bonus token excluded, `agspec.drafter.protocol`) and d the draft length;
skipped when a fully accepted draft had the cap's length (the cap censors it); clipped to
[alpha_min, alpha_max].
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import isfinite
from pathlib import Path

from agspec.policy._state import atomic_write_text, check_int, finite_number, read_state_file
from agspec.policy.caps import _check_prob

logger = logging.getLogger(__name__)


SCALES_FORMAT = "agspec-scales"


# --------------------------------------------------------------------------- scale
@dataclass(frozen=True, kw_only=True)
class OnlineScaleConfig:
    """η and the clip range of α (docs/costmodel.md justifies the defaults).

    η = 0.05: under steady rejection α falls by η·p* per step (0.015 at p* = 0.3, so
    about 33 verifications from 1.0 to 0.5), and under steady full acceptance it rises
    by η·(1 − p*) (0.035). α ∈ [0.05, 4.0]: at the bottom every match still drafts one
    token (max(1, ·)); at the top a draft is 4× its match, beyond which the cap decides.
    """

    step_size: float = 0.05
    alpha_min: float = 0.05
    alpha_max: float = 4.0
    alpha_init: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.step_size <= 1.0:
            raise ValueError(f"step_size must be in (0, 1], got {self.step_size}")
        if not 0.0 < self.alpha_min <= self.alpha_init <= self.alpha_max:
            raise ValueError("need 0 < alpha_min <= alpha_init <= alpha_max")


class OnlineScale:
    """α_a per agent, updated from verification outcomes; persisted with `save`/`load`.

    >>> s = OnlineScale(p_star=0.25)
    >>> round(s.update("coder", drafted_tokens=4, accept_length=1), 4)  # partial: -η·p*
    0.9875
    >>> round(s.update("coder", drafted_tokens=4, accept_length=4), 4)  # full: +η·(1 - p*)
    1.025
    """

    def __init__(
        self,
        *,
        p_star: float,
        config: OnlineScaleConfig | None = None,
        scales: Mapping[str, float] | None = None,
    ) -> None:
        self.p_star = _check_prob("p_star", p_star)
        self.config = config or OnlineScaleConfig()
        self.scales: dict[str, float] = {}
        for agent, alpha in (scales or {}).items():
            self.scales[agent] = self._clip(float(alpha))

    def _clip(self, alpha: float) -> float:
        if not math.isfinite(alpha):
            return self.config.alpha_init
        return min(max(alpha, self.config.alpha_min), self.config.alpha_max)

    def alpha(self, agent: str) -> float:
        return self.scales.get(agent, self.config.alpha_init)

    def update(
        self, agent: str, *, drafted_tokens: int, accept_length: int, censored_by_cap: bool = False
    ) -> float:
        """Apply one verification; returns α_a after it.

        No update when nothing was drafted, or when a fully accepted draft was cut by the
        cap (`censored_by_cap`): the model might have accepted more.
        """
        check_int("drafted_tokens", drafted_tokens)
        check_int("accept_length", accept_length)
        if accept_length > drafted_tokens:
            raise ValueError(
                f"accept_length ({accept_length}) cannot exceed drafted_tokens "
                f"({drafted_tokens}); the bonus token is not counted"
            )
        return self.apply(agent, drafted_tokens, accept_length, censored_by_cap)

    def apply(
        self, agent: str, drafted_tokens: int, accept_length: int, censored_by_cap: bool
    ) -> float:
        """`update` for a caller that checked its numbers (the drafter's hot path)."""
        cfg = self.config
        alpha = self.scales.get(agent, cfg.alpha_init)
        if drafted_tokens == 0:
            return alpha
        full = accept_length == drafted_tokens
        if full and censored_by_cap:
            return alpha
        alpha = alpha + cfg.step_size * (float(full) - self.p_star)
        # `_clip`, inlined (the same comparisons).
        if not isfinite(alpha):
            alpha = cfg.alpha_init
        elif alpha < cfg.alpha_min:
            alpha = cfg.alpha_min
        elif alpha > cfg.alpha_max:
            alpha = cfg.alpha_max
        self.scales[agent] = alpha
        return alpha

    def apply_batch(
        self,
        agents: Sequence[str],
        drafted_tokens: Sequence[int],
        accept_lengths: Sequence[int],
        censored_by_cap: Sequence[bool],
    ) -> None:
        """`apply` for many verifications, in order (one batch step of many requests): the
        same α as that many `apply` calls.

        >>> s = OnlineScale(p_star=0.25)
        >>> s.apply_batch(["coder", "coder"], [4, 4], [1, 4], [False, False])
        >>> round(s.alpha("coder"), 4)
        1.025
        """
        scales = self.scales
        cfg = self.config
        init, step, p_star = cfg.alpha_init, cfg.step_size, self.p_star
        lo, hi = cfg.alpha_min, cfg.alpha_max
        isfinite = math.isfinite
        # `apply`'s step η·(1[a = d] − p*), each of its two values computed as it does.
        up, down = step * (float(True) - p_star), step * (float(False) - p_star)
        for agent, d, a, censored in zip(agents, drafted_tokens, accept_lengths, censored_by_cap):
            if d == 0:
                continue
            if a == d:
                if censored:
                    continue
                alpha = scales.get(agent, init) + up
            else:
                alpha = scales.get(agent, init) + down
            # `_clip` inlined: min(max(alpha, lo), hi), the same float.
            if not isfinite(alpha):
                alpha = init
            elif alpha < lo:
                alpha = lo
            elif alpha > hi:
                alpha = hi
            scales[agent] = alpha

    def to_json(self) -> str:
        doc = {
            "format": SCALES_FORMAT,
            "version": 1,
            "p_star": self.p_star,
            "scales": dict(sorted(self.scales.items())),
        }
        return json.dumps(doc, indent=1) + "\n"

    def save(self, path: str | os.PathLike[str]) -> None:
        """Atomic: a crash mid-write leaves the previous file intact."""
        atomic_write_text(path, self.to_json())

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, p_star: float, config: OnlineScaleConfig | None = None
    ) -> OnlineScale:
        """Scales from `path`; a missing file starts fresh, a corrupt one is reported
        (warning) and ignored, never fatal. p* is the caller's (the cost model's), not
        the file's."""
        p = Path(path)
        scales: dict[str, float] = {}
        try:
            doc = read_state_file(p, SCALES_FORMAT)
            raw = doc.get("scales")
            if not isinstance(raw, dict):
                raise ValueError("'scales' must be an object")
            for agent, alpha in raw.items():
                value = finite_number(alpha)
                if value is None or value <= 0:
                    raise ValueError(
                        f"scale of {agent!r} is {str(alpha)[:40]}: expected a finite number > 0"
                    )
                scales[str(agent)] = value
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            warnings.warn(f"ignoring corrupt scales file {p}: {exc}", RuntimeWarning, stacklevel=2)
            logger.warning("ignoring corrupt scales file %s: %s", p, exc)
            scales = {}
        return cls(p_star=p_star, config=config, scales=scales)
