"""Python snippets run in a child interpreter, so a crash or a hang of the native index
is a failed test, not a dead test run (tests/index/test_token_index_{io,threads}.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent
INDEX_TESTS = TESTS / "index"


def run_script(
    code: str, *, prelude: str = "", timeout: float = 120
) -> subprocess.CompletedProcess:
    """Runs prelude + code (dedented) in `python -c`, with tests/ and tests/index on its
    path (a snippet may import a test module's helpers)."""
    path = f"import sys; sys.path[:0] = [{str(INDEX_TESTS)!r}, {str(TESTS)!r}]\n"
    return subprocess.run(
        [sys.executable, "-c", path + prelude + textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def assert_ok(proc: subprocess.CompletedProcess) -> str:
    """The child's stdout, once it exited 0 (else its output tails, in the failure)."""
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def child_env() -> dict[str, str]:
    """os.environ with tests/ on PYTHONPATH, for a test file run as a script."""
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *([old] if old else [])])}
