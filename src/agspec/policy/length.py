"""Agent-aware draft length (paper §3.2): offline cap C_a, online scale α_a, and the policy.

For agent a with a match of m tokens:

    L = min(max(1, floor(α_a · m)), C_a)      then  L ≤ tokens available after the match
                                              and   L ≤ the engine's own length, if any
    m = 0 → L = 0 (no match, no draft)

- `ProfiledCap`: C_a is the last k whose acceptance probability P(r ≥ k) exceeds p*,
  from replayed acceptance records; saved per (agent, model, batch size) in a caps file.
- `OnlineScale`: α_a starts at 1; after each verification α_a += η·(1[a = d] − p*), where
  a is the accept length (bonus token excluded, see `agspec.protocol`) and d the draft
  length; skipped when a fully accepted draft had the cap's length (the cap censors it);
  clipped to [α_min, α_max]; persisted atomically.
- `DraftLengthPolicy`: the rule above, with ablation variants "static", "match", "cap",
  "cap+scale", and "cost" (beyond the paper, below).
- Variant "cost" takes its length from `agspec.policy.cost_length` (expected committed
  tokens per unit of measured step cost, from acceptance curves learned online).

Example: agent "coder" with α = 0.5, C = 6 and a 20-token match with 9 tokens available:
floor(0.5·20) = 10, capped to 6, and 6 ≤ 9, so the draft is 6 tokens; if all 6 are
accepted the scale is not updated (the cap cut the draft).
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agspec.policy._util import atomic_write_text, check_int, finite_number, read_state_file
from agspec.policy.cost_length import (
    MatchSurvival,
    best_length,
    best_length_in_batch,
)

__all__ = [
    "AcceptanceRecord",
    "acceptance_curve",
    "cap_from_curve",
    "ProfiledCap",
    "CapsFileError",
    "OnlineScale",
    "OnlineScaleConfig",
    "DraftLengthPolicy",
    "LengthDecision",
    "VARIANTS",
    "atomic_write_text",
]

logger = logging.getLogger(__name__)

CAPS_FORMAT = "agspec-caps"
SCALES_FORMAT = "agspec-scales"
VARIANTS = ("static", "match", "cap", "cap+scale", "cost")
BATCH_EMA = 0.01  # weight of one step in the running batch means of variant "cost"


def _check_prob(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be a probability in (0, 1), got {value!r}")
    return float(value)


# --------------------------------------------------------------------------- cap
@dataclass(frozen=True)
class AcceptanceRecord:
    """One retrieval step of a replayed call.

    `reusable_tokens` r: how many retrieved tokens match the recorded continuation;
    `available_tokens`: how many the retrieval offered (r ≤ available). A step that offered
    only 3 tokens says nothing about whether a 4th would have matched.
    """

    reusable_tokens: int
    available_tokens: int

    def __post_init__(self) -> None:
        check_int("reusable_tokens", self.reusable_tokens)
        check_int("available_tokens", self.available_tokens)
        if self.reusable_tokens > self.available_tokens:
            raise ValueError(
                f"reusable_tokens ({self.reusable_tokens}) cannot exceed available_tokens "
                f"({self.available_tokens})"
            )


def acceptance_curve(
    records: Iterable[AcceptanceRecord], *, max_tokens: int | None = None
) -> list[float]:
    """P(r ≥ k) for k = 1..K (index k-1), K = the largest `available_tokens` (or max_tokens).

    Product-limit (Kaplan-Meier) estimate, so steps that offered fewer than k tokens do not
    count against position k: P(r ≥ k) = Π_{j ≤ k} #{r ≥ j, avail ≥ j} / #{r ≥ j-1, avail ≥ j}.
    When every step offered at least K tokens this is the plain fraction of steps with
    r ≥ k. A position no step could reach carries the last estimate forward.

    >>> recs = [AcceptanceRecord(r, 8) for r in (0, 1, 2, 2, 5)]
    >>> [round(p, 3) for p in acceptance_curve(recs)[:3]]
    [0.8, 0.6, 0.2]
    """
    recs = list(records)
    if max_tokens is None:
        max_tokens = max((r.available_tokens for r in recs), default=0)
    check_int("max_tokens", max_tokens)
    curve: list[float] = []
    survival = 1.0
    for k in range(1, max_tokens + 1):
        at_risk = sum(1 for r in recs if r.reusable_tokens >= k - 1 and r.available_tokens >= k)
        if at_risk:
            hits = sum(1 for r in recs if r.reusable_tokens >= k and r.available_tokens >= k)
            survival *= hits / at_risk
        curve.append(survival)
    return curve


def cap_from_curve(curve: Sequence[float], p_star: float) -> int:
    """C = the last k with P(r ≥ k) > p*, at least 1.

    >>> cap_from_curve([0.9, 0.7, 0.5, 0.31, 0.29, 0.1], 0.3)
    4
    """
    _check_prob("p_star", p_star)
    cap = 1
    for k, p in enumerate(curve, start=1):
        if p > p_star:
            cap = k
    return cap


class CapsFileError(ValueError):
    """A caps file that cannot be used (caps are configuration: errors are raised)."""


@dataclass
class ProfiledCap:
    """Per-agent caps C_a keyed by (agent, model, batch size), with a default.

    Lookup: the exact (agent, model, batch size); else the same agent and model at the
    nearest profiled batch size; else `default_cap_tokens` (logged once per agent).

    >>> caps = ProfiledCap(default_cap_tokens=8)
    >>> caps.set("coder", model="qwen2.5-7b", batch_size=16, cap_tokens=11)
    >>> caps.cap_for("coder", model="qwen2.5-7b", batch_size=1)   # nearest batch size
    11
    >>> caps.cap_for("reviewer", model="qwen2.5-7b", batch_size=16)
    8
    """

    default_cap_tokens: int = 16
    caps: dict[tuple[str, str, int], int] = field(default_factory=dict)
    meta: dict[tuple[str, str, int], dict[str, Any]] = field(default_factory=dict)
    _warned: set[str] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        check_int("default_cap_tokens", self.default_cap_tokens, minimum=1)

    def set(self, agent: str, *, model: str, batch_size: int, cap_tokens: int, **meta: Any) -> None:
        check_int("cap_tokens", cap_tokens, minimum=1)
        check_int("batch_size", batch_size, minimum=1)
        key = (str(agent), str(model), batch_size)
        self.caps[key] = cap_tokens
        if meta:
            self.meta[key] = dict(meta)

    def fit(
        self,
        records_by_agent: Mapping[str, Iterable[AcceptanceRecord]],
        *,
        p_star: float,
        model: str,
        batch_size: int,
        max_tokens: int | None = None,
    ) -> dict[str, int]:
        """Set C_a for every agent from its records; returns the caps set."""
        _check_prob("p_star", p_star)
        out = {}
        for agent, records in records_by_agent.items():
            recs = list(records)
            if not recs:
                continue
            curve = acceptance_curve(recs, max_tokens=max_tokens)
            cap = cap_from_curve(curve, p_star)
            self.set(
                agent,
                model=model,
                batch_size=batch_size,
                cap_tokens=cap,
                p_star=p_star,
                num_records=len(recs),
            )
            out[agent] = cap
        return out

    def cap_for(self, agent: str, *, model: str = "", batch_size: int = 1) -> int:
        key = (agent, model, batch_size)
        if key in self.caps:
            return self.caps[key]
        same = [(b, c) for (a, m, b), c in self.caps.items() if a == agent and m == model]
        if same:
            return min(same, key=lambda bc: (abs(bc[0] - batch_size), bc[0]))[1]
        if agent not in self._warned:
            self._warned.add(agent)
            logger.info(
                "no profiled cap for agent %r (model %r): default cap %d",
                agent,
                model,
                self.default_cap_tokens,
            )
        return self.default_cap_tokens

    def to_json(self) -> str:
        rows = []
        for (agent, model, b), cap in sorted(self.caps.items()):
            row: dict[str, Any] = {
                "agent": agent,
                "model": model,
                "batch_size": b,
                "cap_tokens": cap,
            }
            row.update(self.meta.get((agent, model, b), {}))
            rows.append(row)
        doc = {
            "format": CAPS_FORMAT,
            "version": 1,
            "default_cap_tokens": self.default_cap_tokens,
            "caps": rows,
        }
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"

    def save(self, path: str | os.PathLike[str]) -> None:
        atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ProfiledCap:
        p = Path(path)
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CapsFileError(f"{p}: no such caps file") from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise CapsFileError(f"{p}: not a readable JSON caps file ({exc})") from None
        except RecursionError:
            raise CapsFileError(f"{p}: not a readable JSON caps file (nested too deeply)") from None
        if not isinstance(doc, dict) or doc.get("format") != CAPS_FORMAT:
            raise CapsFileError(f"{p}: format must be {CAPS_FORMAT!r}")
        if doc.get("version") != 1:
            raise CapsFileError(f"{p}: unsupported version {doc.get('version')!r} (expected 1)")
        try:
            caps = cls(default_cap_tokens=doc.get("default_cap_tokens", 16))
            rows = doc["caps"]
            if not isinstance(rows, list):
                raise TypeError("'caps' must be a list")
            for row in rows:
                meta = {
                    k: v
                    for k, v in row.items()
                    if k not in ("agent", "model", "batch_size", "cap_tokens")
                }
                caps.set(
                    row["agent"],
                    model=row["model"],
                    batch_size=row["batch_size"],
                    cap_tokens=row["cap_tokens"],
                    **meta,
                )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CapsFileError(f"{p}: bad caps entry ({exc})") from None
        return caps


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
        alpha = self.alpha(agent)
        if drafted_tokens == 0:
            return alpha
        full = accept_length == drafted_tokens
        if full and censored_by_cap:
            return alpha
        alpha = self._clip(alpha + self.config.step_size * (float(full) - self.p_star))
        self.scales[agent] = alpha
        return alpha

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


# --------------------------------------------------------------------------- policy
@dataclass(frozen=True)
class LengthDecision:
    """How many tokens to draft, and whether the cap was what bounded it."""

    draft_tokens: int
    cap_tokens: int | None
    censored_by_cap: bool
    match_tokens: int = 0  # the match the draft came from (variant "cost" learns by it)


class DraftLengthPolicy:
    """The draft length for one retrieval step, by variant.

    - "static": a fixed `static_tokens` whenever there is a match;
    - "match": max(1, m) (α fixed at 1, no cap; SuffixDecoding-style);
    - "cap": min(max(1, m), C_a);
    - "cap+scale": min(max(1, floor(α_a·m)), C_a) (the paper's rule);
    - "cost": first an upper bound (≤ `survival.max_tokens`), then `cost_length` trims
      what the index retrieved to the expected-throughput optimum (`best_length`).
    Every variant then takes ≤ available tokens and ≤ the engine's own length, and m = 0
    gives 0.

    >>> pol = DraftLengthPolicy("cap+scale", caps=ProfiledCap(default_cap_tokens=6),
    ...                         scale=OnlineScale(p_star=0.2, scales={"coder": 0.5}))
    >>> pol.draft_length("coder", match_tokens=20, available_tokens=9).draft_tokens
    6
    >>> pol.draft_length("coder", match_tokens=5, available_tokens=9).draft_tokens  # floor 2.5
    2
    """

    def __init__(
        self,
        variant: str = "cap+scale",
        *,
        caps: ProfiledCap | None = None,
        scale: OnlineScale | None = None,
        model: str = "",
        batch_size: int = 1,
        static_tokens: int = 8,
        step_costs: Sequence[float] | None = None,
        survival: MatchSurvival | None = None,
    ) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"unknown draft-length variant {variant!r}; one of {VARIANTS}")
        if variant == "cap+scale" and scale is None:
            raise ValueError("variant 'cap+scale' needs an OnlineScale")
        if variant == "cost":
            if step_costs is None or len(step_costs) < 2:
                raise ValueError(
                    "variant 'cost' needs step_costs: the cost of verifying 1, 2, ... tokens "
                    "(a cost profile from `agspec costmodel measure`)"
                )
            costs = [float(c) for c in step_costs]
            if not all(math.isfinite(c) and c > 0 for c in costs):
                raise ValueError(f"step_costs must be finite and > 0, got {costs[:8]}")
            self.step_costs: list[float] = [c / costs[0] for c in costs]
            self.survival = survival or MatchSurvival(max_tokens=len(costs) - 1)
            # Running batch state for `best_length_in_batch` (start: no drafts, 1 token).
            self.mean_draft, self.mean_committed = 0.0, 1.0
        else:
            self.step_costs = []
            self.survival = survival or MatchSurvival()
        self.variant = variant
        self.caps = caps if caps is not None else ProfiledCap()
        self.scale = scale
        self.model = model
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.static_tokens = check_int("static_tokens", static_tokens, minimum=1)

    def draft_length(
        self,
        agent: str,
        *,
        match_tokens: int,
        available_tokens: int,
        engine_max_tokens: int | None = None,
    ) -> LengthDecision:
        # The drafter calls this every step: one cheap type check for the common case.
        if not (type(match_tokens) is int and type(available_tokens) is int):
            check_int("match_tokens", match_tokens)
            check_int("available_tokens", available_tokens)
        if match_tokens < 0 or available_tokens < 0:
            raise ValueError(
                f"match_tokens and available_tokens must be >= 0, got {match_tokens} "
                f"and {available_tokens}"
            )
        if engine_max_tokens is not None:
            check_int("engine_max_tokens", engine_max_tokens)
        if match_tokens == 0:
            return LengthDecision(0, None, False)
        cap: int | None = None
        if self.variant == "static":
            length = self.static_tokens
        elif self.variant == "match":
            length = max(1, match_tokens)
        elif self.variant == "cost":
            length = min(self.survival.max_tokens, len(self.step_costs) - 1)
        else:
            cap = self.caps.cap_for(agent, model=self.model, batch_size=self.batch_size)
            alpha = self.scale.alpha(agent) if self.variant == "cap+scale" and self.scale else 1.0
            length = min(max(1, math.floor(alpha * match_tokens)), cap)
        length = min(length, available_tokens)
        if engine_max_tokens is not None:
            length = min(length, engine_max_tokens)
        censored = cap is not None and length >= cap
        return LengthDecision(length, cap, censored, match_tokens)

    def cost_length(self, agent: str, match_tokens: int, retrieved_tokens: int) -> int:
        """Variant "cost": how many of the `retrieved_tokens` to draft (0: none).

        Batch size 1: `best_length`. Larger batches: `best_length_in_batch`, priced at the
        batch's running mean draft and committed tokens per step (`note_step`).
        """
        curve = self.survival.curve(agent, match_tokens)
        if self.batch_size == 1:
            return best_length(curve, self.step_costs, retrieved_tokens)
        return best_length_in_batch(
            curve,
            self.step_costs,
            retrieved_tokens,
            batch_size=self.batch_size,
            mean_draft=self.mean_draft,
            mean_committed=self.mean_committed,
        )

    def note_step(self, drafted_tokens: int, committed_tokens: int) -> None:
        """Every verification step of every request, drafted or not (variant "cost" at
        batch size > 1 keeps running means of the draft length and committed tokens:
        an exponential average over the last ~1/`BATCH_EMA` steps)."""
        w = BATCH_EMA
        self.mean_draft += w * (drafted_tokens - self.mean_draft)
        self.mean_committed += w * (committed_tokens - self.mean_committed)

    def observe(self, agent: str, decision: LengthDecision, accept_length: int) -> None:
        """Feed a verification outcome back (updates α_a in the "cap+scale" variant, the
        acceptance survival in the "cost" variant)."""
        if self.variant == "cost":
            self.survival.observe(
                agent,
                decision.match_tokens,
                drafted_tokens=decision.draft_tokens,
                accepted_tokens=accept_length,
            )
            return
        if self.variant != "cap+scale" or self.scale is None:
            return
        self.scale.update(
            agent,
            drafted_tokens=decision.draft_tokens,
            accept_length=accept_length,
            censored_by_cap=decision.censored_by_cap,
        )
