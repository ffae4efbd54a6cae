"""`agspec traces import | check | stats` on the hand-written fixtures."""

from __future__ import annotations

from pathlib import Path

from agspec.cli import main
from agspec.traces import read_sessions

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces"


def test_import_check_stats(tmp_path, capsys):
    out = tmp_path / "chatdev.jsonl"
    assert (
        main(["traces", "import", "chatdev", str(FIXTURES), "-o", str(out), "--no-progress"]) == 0
    )
    cap = capsys.readouterr()
    assert "2 files: 1 sessions (5 calls)" in cap.out and "1 files skipped" in cap.out
    assert "skipped: " in cap.err and "older ChatDev layout" in cap.err
    assert "partly skipped: " in cap.err and "2 output blocks repeating" in cap.err
    assert [len(s.calls) for s in read_sessions(out)] == [5]

    assert main(["traces", "check", str(out)]) == 0
    assert "1 sessions ok, 0 errors" in capsys.readouterr().out

    swe = tmp_path / "swe.jsonl"
    args = ["traces", "import", "swe-agent", str(FIXTURES / "swe_agent_small.traj.fixture")]
    assert main([*args, "-o", str(swe), "--keep-last-observations", "all", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["traces", "stats", str(out), str(swe)]) == 0
    table = capsys.readouterr().out
    assert "| chatdev | all | 1 | 5 | 5.0 |" in table
    assert "| chatdev | review | 1 | 4 | 4.0 |" in table
    assert "| swe-agent | all | 1 | 9 | 9.0 |" in table
    assert "| swe-agent | localize | 1 | 4 | 4.0 |" in table


def test_bad_input_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"format_version": 1}\n\xff\n')
    assert main(["traces", "check", str(bad)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{bad}:1: session.calls: missing field",
        f"{bad}:2: not valid UTF-8 (byte 0 of the line)",
    ]
    assert main(["traces", "stats", str(bad)]) == 1
    assert "error:" in capsys.readouterr().err
    assert main(["traces", "import", "swe-agent", str(tmp_path / "nope"), "-o", str(bad)]) == 1
    assert "no such file or folder" in capsys.readouterr().err
    args = ["traces", "import", "swe-agent", str(FIXTURES), "-o", str(bad)]
    assert main([*args, "--keep-last-observations", "x"]) == 1
