"""Every drafter is resolved and imported before a run's first replay, so a package
reinstalled while a long run goes on cannot break it halfway (issue 15)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agspec.lab.registry import ORACLES, drafter_names, preload_drafters

# Runs in a fresh interpreter: optionally preload, then make every agspec module that is
# not imported yet unfindable (what a reinstall mid-run looks like to the running process),
# then replay one small session with each drafter.
SCRIPT = r"""
import importlib.abc, sys
from agspec.policy.costmodel import get_cost_model
from agspec.lab.records import ReplayCall, ReplaySession
from agspec.lab.registry import make_server, preload_drafters
from agspec.lab.simulator import replay_batched

class Chars:
    def encode(self, text):
        return [ord(c) % 1000 for c in text]

class Flat:
    def step_cost(self, n_tokens, batch_size):
        return 1.0

class NoNewAgspecModules(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname == "agspec" or fullname.startswith("agspec."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None

names = sys.argv[2:]
kw = dict(tokenizer=Chars(), cost_model=get_cost_model("h200-qwen2.5-32b", context_tokens=1000))
if sys.argv[1] == "preload":
    preload_drafters(names, batch_size=2, **kw)
sys.meta_path.insert(0, NoNewAgspecModules())
call = ReplayCall("coder", "code", 0, [5, 6, 7, 8, 5, 6], [7, 8, 5, 6, 7])
session = ReplaySession("s/0", (call,))
for name in names:
    server = make_server(name, global_docs=[[7, 8, 5]], batch_size=2, **kw)
    result = replay_batched([(session, server)], batch_size=2, cost_model=Flat())
    assert result.num_output_tokens == 5, name
print("ok", len(names))
"""


def available_drafters() -> list[str]:
    names = []
    for name in drafter_names():
        if name in ORACLES:
            continue
        try:
            preload_drafters([name], tokenizer=None, cost_model=None, batch_size=1)
        except ImportError:
            continue  # an optional engine that is not installed here
        except Exception:  # noqa: BLE001 - needs a tokenizer or cost model: still available
            pass
        names.append(name)
    return names


def run(mode: str, names: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, *names], capture_output=True, text=True, timeout=120
    )


def test_after_preload_no_drafter_imports_anything() -> None:
    names = available_drafters()
    assert "pld-hf" in names and "agspec" in names
    done = run("preload", names)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"ok {len(names)}"
    # The control: without the preload the first baseline's module is imported too late.
    late = run("no-preload", ["pld-hf"])
    assert late.returncode != 0 and "ModuleNotFoundError" in late.stderr


def test_unknown_drafters_fail_before_any_replay() -> None:
    with pytest.raises(ValueError, match="unknown drafter"):
        preload_drafters(
            ["pld-hf", "no-such-drafter"], tokenizer=None, cost_model=None, batch_size=1
        )
