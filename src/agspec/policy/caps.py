"""Per-agent draft caps C_a profiled offline (paper §3.2): acceptance records -> curves -> caps.

C_a is the last k whose acceptance probability P(r >= k) exceeds p*, from replayed
acceptance records; saved per (agent, model, batch size) in a caps file (`agspec profile`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agspec.policy._state import atomic_write_text, check_int

logger = logging.getLogger(__name__)


CAPS_FORMAT = "agspec-caps"


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
