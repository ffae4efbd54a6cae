"""Small helpers shared by the policy modules: argument checks and state files."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["atomic_write_text", "read_state_file", "check_int"]


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` so a reader sees the old file or the new one, never half.

    A temporary file in the same folder is written, flushed to disk, then renamed over
    the target with `os.replace` (atomic on POSIX and Windows).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        # mkstemp makes the file 0600; give it the permissions a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_state_file(path: Path, fmt: str) -> dict[str, Any]:
    """A JSON state file of format `fmt`, version 1; ValueError (or OSError) otherwise."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise ValueError(f"format is not {fmt!r}")
    if doc.get("version") != 1:
        raise ValueError(f"unsupported version {doc.get('version')!r}")
    return doc


def check_int(name: str, value: Any, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value
