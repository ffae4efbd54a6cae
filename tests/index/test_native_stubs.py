"""The committed type stubs of the native module match what nanobind generates now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

STUB = Path(__file__).resolve().parents[2] / "src" / "agspec" / "_native.pyi"


def test_stubs_have_not_drifted(tmp_path):
    pytest.importorskip("nanobind.stubgen", reason="nanobind is needed to regenerate stubs")
    out = tmp_path / "_native.pyi"
    subprocess.run(
        [sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "agspec._native", "-o", str(out)],
        check=True,
    )
    assert out.read_text() == STUB.read_text(), (
        "src/agspec/_native.pyi is stale: regenerate with "
        "python -m nanobind.stubgen -m agspec._native -o src/agspec/_native.pyi"
    )
