"""Small helpers shared by the policy modules: argument checks and state files."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from agspec._files import atomic_write_text

__all__ = ["atomic_write_text", "read_state_file", "check_int", "finite_number"]


def read_state_file(path: Path, fmt: str) -> dict[str, Any]:
    """A JSON state file of format `fmt`, version 1; ValueError (or OSError) otherwise."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise ValueError(f"format is not {fmt!r}")
    if doc.get("version") != 1:
        raise ValueError(f"unsupported version {doc.get('version')!r}")
    return doc


def finite_number(value: Any) -> float | None:
    """`value` as a finite float, or None when it is not one (bools, NaN, inf, 1e999, huge
    ints and non-numbers are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        out = float(value)
    except OverflowError:
        return None
    return out if math.isfinite(out) else None


def check_int(name: str, value: Any, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value
