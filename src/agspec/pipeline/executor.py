"""The executor: apply a patch in a temporary copy of the repo, run its tests, report.

Not an LLM call. Its observation (`ExecResult.observation()`) is what the coder's next
turn receives. A patch that does not apply, a test run that fails, and a test run that
hangs past `timeout_s` are all ordinary results, never exceptions.

>>> files = {"m.py": "X = 1\\n", "test_m.py": "import unittest\\nimport m\\n"
...          "class T(unittest.TestCase):\\n    def test(self):\\n        assert m.X == 2\\n"}
>>> run_patch("--- a/m.py\\n+++ b/m.py\\n@@ -1 +1 @@\\n-X = 1\\n+X = 2\\n", files).status
'passed'
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agspec.pipeline.diffapply import PatchError, apply_patch

__all__ = ["ExecResult", "run_tests", "run_patch"]

_MAX_LOG_LINES = 30
_MAX_LOG_CHARS = 2000


@dataclass(frozen=True)
class ExecResult:
    """`status`: `passed`, `failed` (tests ran, some failed), `timeout`, `patch_error`."""

    status: str
    log: str
    changed_files: tuple[str, ...] = ()
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def observation(self) -> str:
        """The text the coder sees next (the log cut to its last lines)."""
        if self.status == "patch_error":
            return f"The patch did not apply: {self.log}"
        if self.status == "timeout":
            return f"The patch applied, but the tests did not finish: {self.log}"
        head = "All tests passed." if self.passed else "The patch applied; the tests failed:"
        return f"{head}\n```\n{_tail(self.log)}\n```"


def _tail(log: str) -> str:
    lines = log.strip().splitlines()[-_MAX_LOG_LINES:]
    text = "\n".join(lines)
    return text[-_MAX_LOG_CHARS:]


def run_tests(files: Mapping[str, str], *, timeout_s: float = 30.0) -> ExecResult:
    """Write `files` to a fresh temporary folder and run `python -m unittest` there."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="agspec-task-") as tmp:
        for rel, text in files.items():
            path = Path(tmp) / rel
            if not path.resolve().is_relative_to(Path(tmp).resolve()):
                return ExecResult("patch_error", f"path {rel!r} leaves the repository")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0")
        env.pop("PYTHONPATH", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "unittest"],
            cwd=tmp,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a process group, so a hang is killed with its children
        )
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return ExecResult(
                "timeout",
                f"killed after {timeout_s:g} s",
                duration_s=time.perf_counter() - t0,
            )
    log = out.decode("utf-8", errors="replace")
    status = "passed" if proc.returncode == 0 else "failed"
    return ExecResult(status, log, duration_s=time.perf_counter() - t0)


def run_patch(
    patch: str,
    files: Mapping[str, str],
    *,
    default_path: str | None = None,
    timeout_s: float = 30.0,
) -> ExecResult:
    """Apply `patch` to a copy of `files`, then run the tests (see `run_tests`)."""
    try:
        changed = apply_patch(patch, files, default_path=default_path)
    except PatchError as exc:
        return ExecResult("patch_error", str(exc))
    result = run_tests({**files, **changed}, timeout_s=timeout_s)
    return ExecResult(result.status, result.log, tuple(sorted(changed)), result.duration_s)
