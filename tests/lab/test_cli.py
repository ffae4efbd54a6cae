"""`agspec replay` and `agspec report` end to end on a small slice of the real dev set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agspec.cli import main

TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces"


def test_replay_cli_small_subset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted((TRACES / "chatdev").glob("*.log"))[:3]
    if not files:
        pytest.skip(f"dev traces not found at {TRACES} (third-party data, not in the repo)")
    from agspec.traces import import_traces, write_sessions

    sessions, _ = import_traces("chatdev", files)
    jsonl = tmp_path / "chatdev.jsonl"
    write_sessions(sessions, jsonl)
    out = tmp_path / "run"
    rc = main(
        ["replay", str(jsonl), "--drafters", "ar", "pld-hf", "oracle", "--batch-size", "1", "2",
         "--cost-model", "h200-qwen2.5-32b", "-o", str(out), "--limit-sessions", "2",
         "--no-progress"]
    )  # fmt: skip
    assert rc == 0
    table = capsys.readouterr().out
    assert "two-fold" in table and "pld-hf" in table and "oracle" in table
    summary = json.loads((out / "summary.json").read_text())
    by = {(e["drafter"], e["batch_size"]): e for e in summary["entries"]}
    assert len(by) == 6
    assert by[("ar", 1)]["speedup"] == pytest.approx(1.0)
    assert by[("ar", 2)]["speedup"] == pytest.approx(1.0)
    # The oracle copies at least as much as PLD can: its request text is a subset.
    assert by[("oracle", 1)]["tokens_per_step"] >= by[("pld-hf", 1)]["tokens_per_step"]
    assert by[("pld-hf", 1)]["speedup"] > 1.0
    assert (out / "speedup.png").is_file() and (out / "config.json").is_file()
    assert main(["report", str(out), "--agents"]) == 0
    assert "mean accept length per agent" in capsys.readouterr().out


def test_replay_cli_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.jsonl"
    assert main(["replay", str(missing), "--drafters", "ar", "-o", str(tmp_path / "r")]) == 1
    assert "trace file not found" in capsys.readouterr().err
    assert main(["replay", str(missing), "--drafters", "zzz", "-o", str(tmp_path / "r")]) == 1
    assert "unknown drafter" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 1
    assert "no summary.json" in capsys.readouterr().err
