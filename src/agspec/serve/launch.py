"""Start `agspec serve` as a child process on a free port and wait until it answers.

For tests and benchmarks that drive a real server:

    with ServerProcess(["--model", "smollm2", "--drafter", "none"]) as srv:
        openai.OpenAI(base_url=srv.base_url, api_key="x")...

The server's stderr (progress lines, uvicorn's log) goes to `srv.log_path`; `stop()`
sends SIGTERM (the graceful drain) and returns the exit status.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["ServerProcess", "free_port"]


def _die_with_parent() -> None:
    """In the child (Linux): SIGTERM when the parent dies, so that a test or benchmark
    killed mid-way leaves no server behind (the server then drains and exits)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerProcess:
    def __init__(
        self,
        args: Sequence[str],
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        env: dict[str, str] | None = None,
        startup_timeout_s: float = 300.0,
        python: str = sys.executable,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.startup_timeout_s = startup_timeout_s
        self.python = python
        self.proc: subprocess.Popen[bytes] | None = None
        fd, name = tempfile.mkstemp(prefix="agspec-serve-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def start(self) -> ServerProcess:
        cmd = [self.python, "-m", "agspec", "serve", "--host", self.host,
               "--port", str(self.port), *self.args]  # fmt: skip
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )  # fmt: skip
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"agspec serve exited with {self.proc.returncode} at start-up:\n{self.log()}"
                )
            try:
                self.get_json("/health", timeout=2.0)
                return self
            except (OSError, urllib.error.URLError, ValueError):
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"agspec serve did not answer within {self.startup_timeout_s} s")

    def get(self, path: str, *, timeout: float = 10.0) -> str:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
            return str(resp.read().decode("utf-8"))

    def get_json(self, path: str, *, timeout: float = 10.0) -> Any:
        return json.loads(self.get(path, timeout=timeout))

    def metrics(self) -> dict[str, float]:
        """`/metrics` as {"name{labels}": value} (comment lines dropped)."""
        out = {}
        for line in self.get("/metrics").splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def rss_bytes(self) -> int:
        """Resident memory of the server process (Linux /proc)."""
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise OSError("VmRSS not found")

    def stop(self, *, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
