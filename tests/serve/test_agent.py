"""mini-swe-agent (unmodified, its own virtualenv) against `agspec serve`, and the
benchmark's bookkeeping (`agspec.pipeline.agent_bench`, which
`benchmarks/bench_serve_agent.py` runs) on hand-made exchanges.

The agent test needs the agent's virtualenv (`scripts/install_agent.sh`), llama-cpp-python,
`agspec serve` and the SmolLM2 model; it skips with a message when one is missing. It runs
one step-limited session on a bundled task (about a minute on 2 cores) and checks that
the agent completed its protocol: every call it made reached the server and got a
response with usage, the trajectory holds those calls, and the server recorded them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from agspec.pipeline import agent_bench as bench

AGENT_VENV = (
    Path(os.environ.get("AGSPEC_CACHE", Path.home() / ".cache" / "agspec"))
    / "venvs"
    / "mini-swe-agent-2.4.6"
)


def _exchange(messages: list[dict[str, str]], content: str, *, tokens: int = 5,
              t0: float = 0.0, t1: float = 1.0) -> bench.Exchange:  # fmt: skip
    return bench.Exchange(
        tag="x", path="/v1/chat/completions", t_start=t0, t_end=t1, status=200,
        request={"model": "m", "messages": messages},
        response={"choices": [{"message": {"role": "assistant", "content": content},
                               "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": 10, "completion_tokens": tokens}},
    )  # fmt: skip


def _act(cmd: str) -> str:
    return f"THOUGHT: go\n\n```mswea_bash_command\n{cmd}\n```"


SYS = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]


def test_call_records_roles_speed_and_format_errors() -> None:
    ex = [
        _exchange(SYS, _act("ls -la"), tokens=8, t0=1.0, t1=3.0),
        _exchange(SYS, _act("sed -i 's/a/b/' x.py"), tokens=30, t0=4.0, t1=5.0),
        _exchange(SYS, _act("python -m unittest") + _act("ls"), tokens=12),
        bench.Exchange(
            tag="x", path="/v1/models", t_start=0, t_end=0, status=200, request="", response={}
        ),  # fmt: skip
    ]
    calls = bench.call_records(ex)
    assert [c["role"] for c in calls] == ["localize", "code", "other"]
    assert [c["n_actions"] for c in calls] == [1, 1, 2]
    assert calls[0]["tokens_per_s"] == pytest.approx(4.0)
    assert calls[1]["tokens_per_s"] == pytest.approx(30.0)
    s = bench.speed(calls[:2])
    assert (s["completion_tokens"], s["wall_s"]) == (38, pytest.approx(3.0))


def test_first_difference_and_matched_calls() -> None:
    from agspec.tokenizers import get_tokenizer

    tok = get_tokenizer("qwen2.5")
    obs = [{"role": "assistant", "content": _act("ls")}, {"role": "user", "content": "o"}]
    a = bench.call_records([_exchange(SYS, _act("ls")), _exchange(SYS + obs, _act("cat a.py"))])
    b = bench.call_records([_exchange(SYS, _act("ls")), _exchange(SYS + obs, _act("cat b.py"))])
    assert bench.first_difference(a, a, tok) is None
    d = bench.first_difference(a, b, tok)
    assert d is not None and (d["call"], d["kind"]) == (1, "output")
    ta, tb = tok.encode(a[1]["content"]), tok.encode(b[1]["content"])
    k = d["token"]
    assert ta[:k] == tb[:k] and ta[k] != tb[k]  # the first differing token, exactly
    # A different observation (request) before any output differs.
    obs2 = [obs[0], {"role": "user", "content": "other"}]
    c = bench.call_records([_exchange(SYS, _act("ls")), _exchange(SYS + obs2, _act("cat a.py"))])
    assert bench.first_difference(a, c, tok) == {"call": 1, "kind": "request", "message": 3}
    assert bench.first_difference(a, a[:1], tok) == {"call": 1, "kind": "length", "calls": [2, 1]}
    sessions = {"p": {"calls": a}, "q": {"calls": b}}
    assert len(bench.matched_calls(sessions, ["p", "q"])) == 1
    assert len(bench.matched_calls({"p": {"calls": a}, "q": {"calls": a}}, ["p", "q"])) == 2


def test_fresh_task_copy_is_fixed_and_reset(tmp_path: Path) -> None:
    from agspec.pipeline.tasks import load_task

    task = load_task("leap-years")
    folder = bench.fresh_task_copy(task, tmp_path / "repo")
    (folder / "junk.py").write_text("x = 1\n")
    (folder / task.source_files[0]).write_text("broken\n")
    folder = bench.fresh_task_copy(task, tmp_path / "repo")
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted(task.files)
    assert all(p.stat().st_mtime == bench.FIXED_MTIME for p in folder.iterdir())
    # The unchanged repo fails its own tests; the reference fix passes them, and a fix
    # that edits the tests instead does not count.
    assert bench.task_success(task, folder) == (False, "failed")
    from agspec.pipeline.diffapply import apply_patch

    for rel, text in apply_patch(task.reference_patch, task.files).items():
        (folder / rel).write_text(text)
    assert bench.task_success(task, folder) == (True, "passed")
    folder = bench.fresh_task_copy(task, tmp_path / "repo")
    for rel in task.test_files:
        (folder / rel).write_text("")
    assert bench.task_success(task, folder) == (False, "failed")


def _skip_reason() -> str | None:
    if not (AGENT_VENV / ".agspec-complete").is_file():
        return f"mini-swe-agent venv absent ({AGENT_VENV}); run scripts/install_agent.sh"
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed"
    if importlib.util.find_spec("agspec.serve") is None:
        return "agspec serve is not in this tree"
    for mod in ("fastapi", "uvicorn", "prometheus_client"):
        if importlib.util.find_spec(mod) is None:
            return f"agspec serve needs {mod} (pip install 'agspec[serve]')"
    from agspec.models import ModelFileError, resolve_model

    try:
        resolve_model("smollm2-135m-instruct")
    except (ModelFileError, KeyError, FileNotFoundError) as exc:
        return f"SmolLM2 model absent: {exc}"
    return None


@pytest.mark.server
@pytest.mark.slow
def test_mini_swe_agent_completes_its_protocol_against_agspec_serve() -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from agspec.models import resolve_model
    from agspec.pipeline.tasks import load_task

    model = resolve_model("smollm2-135m-instruct")
    with tempfile.TemporaryDirectory(prefix="agspec-agent-test-") as tmp:
        work, run_dir = Path(tmp), Path(tmp) / "run"
        run_dir.mkdir()
        # One thread: on a shared 2-core machine two llama.cpp threads spin-wait on
        # each other. The shipped Qwen profile stands in for SmolLM2's (what this test
        # checks is the agent's protocol, not the draft lengths), so the server does not
        # measure one at start-up.
        args = bench.build_parser().parse_args(
            ["--threads", "1", "--n-ctx", "4096", "--state-dir", str(work / "state"),
             "--startup-timeout-s", "300", "--agent-python", str(AGENT_VENV / "bin" / "python"),
             "--step-limit", "2", "--max-tokens", "48", "--command-timeout-s", "20",
             "--session-timeout-s", "240"]
        )  # fmt: skip
        proxy = bench.RecordingProxy()
        server = bench.start_server("agspec", args, model, run_dir)
        try:
            proxy.upstream = ("127.0.0.1", server.port)
            r: dict[str, Any] = bench.run_session(
                load_task("leap-years"), server, proxy, args, work, run_dir
            )
        finally:
            server.stop()
            proxy.close()
        log = (run_dir / "agent-logs" / "agspec" / "leap-years.log").read_text(errors="replace")
        assert r["agent_rc"] == 0, log[-3000:]
        calls = r["calls"]
        assert 1 <= len(calls) <= 2
        assert all(c["status"] == 200 and c["completion_tokens"] > 0 for c in calls)
        traj = json.loads(Path(r["trajectory"]).read_text())
        assert traj["info"]["exit_status"] in {"LimitsExceeded", "Submitted", "RepeatedFormatError"}
        # Each call's output: an assistant message, or (a format error) the user message
        # that rejected it, which keeps the output as `model_response`.
        answers = [
            m["content"] if m["role"] == "assistant" else m["extra"]["model_response"]
            for m in traj["messages"]
            if m["role"] == "assistant" or "model_response" in m.get("extra", {})
        ]
        assert answers == [c["content"] for c in calls]  # what the agent got is what was served
        record = run_dir / "agspec.record.jsonl"
        assert record.is_file() and record.stat().st_size > 0, "agspec serve --record wrote nothing"
