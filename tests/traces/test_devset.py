"""Importers on the real dev set in ../shared/data/traces (skipped when it is absent).

Each check compares against facts counted straight from the raw files, not through the
importers: assistant messages, ChatDev's own API-call accounting, the history rule.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agspec.traces import import_traces, read_sessions, render_call, write_sessions
from agspec.traces.importers import find_trace_files

TRACES = (Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces").resolve()
FOLDERS = {
    "swe-agent": TRACES / "swe-agent-java",
    "mini-swe-agent": TRACES / "mini-swe-agent",
    "chatdev": TRACES / "chatdev",
}

pytestmark = pytest.mark.skipif(
    not TRACES.is_dir(), reason=f"dev-set traces not found at {TRACES} (third-party data)"
)

_cache: dict[tuple[str, bool], tuple] = {}


def _import(fmt: str, drop: bool = True):
    if (fmt, drop) not in _cache:
        _cache[(fmt, drop)] = import_traces(fmt, [FOLDERS[fmt]], drop_repeated_blocks=drop)
    return _cache[(fmt, drop)]


@pytest.mark.parametrize("fmt", sorted(FOLDERS))
def test_every_file_imports_or_is_skipped_with_a_reason(fmt):
    files = find_trace_files(fmt, [FOLDERS[fmt]])
    sessions, skipped = _import(fmt)
    whole = [s for s in skipped if s.whole_file]
    assert len(sessions) + len(whole) == len(files) > 0
    assert all(s.reason for s in skipped)
    assert len(whole) <= len(files) // 10, [s.reason for s in whole]
    assert all(s.calls for s in sessions)


def test_swe_agent_calls_are_the_model_responses():
    sessions, _ = _import("swe-agent")
    by_task = {s.task_id: s for s in sessions}
    for f in find_trace_files("swe-agent", [FOLDERS["swe-agent"]]):
        raw = json.loads(Path(f).read_text())["history"]
        outputs = [
            h["content"]
            for h in raw
            if h["role"] == "assistant" and not str(h.get("action", "")).startswith("exit_")
        ]
        s = by_task[Path(f).name[: -len(".traj")]]
        assert [c.output for c in s.calls] == outputs
        # Last5Observations: of the observations before the last call (issue included),
        # all but the first and the last five are omitted.
        last = s.calls[-1].messages
        num_obs = sum(1 for m, h in zip(last, raw) if h["role"] == "user" and not h.get("is_demo"))
        omitted = sum(
            1 for m in last if re.fullmatch(r"Old output omitted \(\d+ lines\)", m.content)
        )
        assert omitted == max(0, num_obs - 6)


def test_mini_swe_agent_sends_the_whole_history():
    sessions, _ = _import("mini-swe-agent")
    by_task = {s.task_id: s for s in sessions}
    for f in find_trace_files("mini-swe-agent", [FOLDERS["mini-swe-agent"]])[::10]:
        doc = json.loads(Path(f).read_text())
        raw = doc["messages"]
        s = by_task[doc["instance_id"]]
        idx = [i for i, m in enumerate(raw) if m["role"] == "assistant"]
        assert [c.output for c in s.calls] == [raw[i]["content"] for i in idx]
        for c, i in zip(s.calls, idx):
            assert [(m.role, m.content) for m in c.messages] == [
                (m["role"], m["content"]) for m in raw[:i]
            ]


def test_chatdev_calls_match_the_logs_api_accounting():
    # Each model call logs one `[OpenAI_Usage_Info Receive]`; the prompt self-improvement
    # call is the only one that has no output block.
    sessions, _ = _import("chatdev", drop=False)
    kept, _ = _import("chatdev")
    by_task = {s.task_id: s for s in sessions}
    kept_by_task = {s.task_id: s for s in kept}
    checked = 0
    for f in find_trace_files("chatdev", [FOLDERS["chatdev"]]):
        text = Path(f).read_text(encoding="utf-8")
        receives = text.count("**[OpenAI_Usage_Info Receive]**")
        task = Path(f).name[: -len(".log")]
        if not receives or task not in by_task:
            continue
        expected = receives - text.count("**[Task Prompt Self Improvement]**")
        assert len(by_task[task].calls) == expected, f
        assert len(kept_by_task[task].calls) <= expected
        checked += 1
    assert checked >= 30


@pytest.mark.parametrize("fmt", sorted(FOLDERS))
def test_round_trip_and_render_sample(tmp_path, fmt):
    sessions, _ = _import(fmt)
    sample = sessions[:3]
    out = tmp_path / "s.jsonl"
    write_sessions(sample, out)
    assert list(read_sessions(out)) == sample
    call = sample[0].calls[-1]
    prompt, output = render_call(call)
    assert prompt[0] == 151644 and prompt[-3:] == [151644, 77091, 198]
    assert prompt.count(151644) == len(call.messages) + 1
    assert len(output) > 0
