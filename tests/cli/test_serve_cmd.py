"""`agspec serve`'s argument checks: a bad drafter name, a busy port or a bad size fails
at once with one line naming the flag, before the cost profile or the model loads (the
oracle for "before": the start-up progress lines never appear and no model is opened)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from agspec.cli.serve_cmd import parse_size


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agspec", "serve", "--model", "/nonexistent/model.gguf", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_misspelt_drafter_fails_before_anything_loads() -> None:
    r = _serve("--drafter", "agspec-papr", "--port", "0")
    assert r.returncode == 1
    assert "--drafter: unknown drafter 'agspec-papr'; known: none, agspec," in r.stderr
    assert "cost profile" not in r.stderr and "loading" not in r.stderr


def test_a_busy_port_fails_before_anything_loads() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = _serve("--port", str(port))
    assert r.returncode == 1
    assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in r.stderr
    assert "loading" not in r.stderr


@pytest.mark.parametrize("flag", ["--memory-budget", "--kv-store"])
@pytest.mark.parametrize("size", ["12x", "-1G", "G", ""])
def test_a_bad_size_names_the_flag(flag: str, size: str) -> None:
    r = _serve(flag, size, "--port", "0")
    assert r.returncode == 2 and flag in r.stderr


def test_a_tiny_kv_store_is_refused_before_anything_loads() -> None:
    r = _serve("--kv-store", "4k", "--port", "0")
    assert r.returncode == 1
    assert "--kv-store must be 0 (off) or >= 1M, got 4096" in r.stderr
    assert "loading" not in r.stderr


def test_sizes() -> None:
    assert parse_size("2G") == 2 << 30 and parse_size("1.5GiB") == 3 << 29
    assert parse_size("512m") == 512 << 20 and parse_size("4096") == 4096
    assert parse_size("10 KB") == 10 << 10
