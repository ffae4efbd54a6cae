"""`agspec` (agspec.cli) on hostile input and interruptions: outputs never over an input
and written whole or not at all, run folders that say whether they are complete, Ctrl-C
as one line and exit 130, `traces check` accepting exactly what the readers accept."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agspec.cli import main
from agspec.traces import Call, Message, Session, read_sessions, write_sessions
from agspec.traces.io import check_file
from agspec.traces.schema import Artifact, TraceFormatError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces"


def _session(sid: str, *, artifact_text: str = "x = 1\n", turn: int = 0) -> Session:
    call = Call(
        agent="coder",
        role="code",
        turn=turn,
        messages=[Message("user", "fix it")],
        output="x = 2\n" * 3,
        artifacts=[Artifact("a.py", artifact_text, True)],
    )
    return Session(sid, "test", "m", "t", [call])


def _line(s: Session) -> str:
    return json.dumps(s.to_dict(), ensure_ascii=False, separators=(",", ":"))


_HUGE_TURN = _line(_session("a")).replace('"turn":0', '"turn":' + "9" * 5000)
_NUL = _line(_session("a", artifact_text="ab\x00c"))


def _no_traceback(err: str) -> None:
    assert "Traceback" not in err, err


# -- outputs never overwrite an input, and are written whole ------------------


def test_import_refuses_to_write_over_its_input(tmp_path: Path, capsys) -> None:
    log = tmp_path / "X.log"
    shutil.copy(FIXTURES / "chatdev_small.log", log)
    before = log.read_bytes()
    assert main(["traces", "import", "chatdev", str(log), "-o", str(log), "--no-progress"]) == 1
    assert "refusing to overwrite an input" in capsys.readouterr().err
    assert log.read_bytes() == before
    # The same file found inside a folder that is searched.
    args = ["traces", "import", "chatdev", str(tmp_path), "-o", str(log), "--no-progress"]
    assert main(args) == 1
    assert log.read_bytes() == before


def test_index_build_and_profile_refuse_to_write_over_an_input(tmp_path: Path, capsys) -> None:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    assert main(["index", "build", str(a), str(b), "-o", str(a), "--quiet"]) == 1
    assert "refusing to overwrite an input" in capsys.readouterr().err
    assert a.read_text() == "x = 1\n"
    traces = tmp_path / "t.jsonl"
    write_sessions([_session("s1")], traces)
    before = traces.read_bytes()
    assert main(["profile", str(traces), "-o", str(traces)]) == 1
    assert "refusing to overwrite an input" in capsys.readouterr().err
    assert traces.read_bytes() == before
    assert main(_replay_args(traces, traces)) == 1
    assert "is a file" in capsys.readouterr().err
    assert traces.read_bytes() == before


def test_interrupted_import_leaves_the_old_output_and_no_file_that_passes_check(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    import agspec.cli.traces_cmd as traces_cmd

    out = tmp_path / "out.jsonl"
    out.write_text("old\n")
    real = traces_cmd.iter_import

    def interrupted(*args, **kwargs):
        for i, item in enumerate(real(*args, **kwargs)):
            if i == 1:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(traces_cmd, "iter_import", interrupted)
    args = ["traces", "import", "chatdev", str(FIXTURES), "-o", str(out), "--no-progress"]
    assert main(args) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "agspec traces: interrupted"
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]  # no temporary left


# -- run folders say whether they are complete ---------------------------------


def _traces(tmp_path: Path, n: int = 4) -> Path:
    path = tmp_path / "t.jsonl"
    sessions = []
    for i in range(n):
        s = _session(f"s{i}")
        s.calls[0].output = "def f(x):\n    return x + 1\n" * 20
        sessions.append(s)
    write_sessions(sessions, path)
    return path


def _replay_args(traces: Path, out: Path) -> list[str]:
    return [
        "replay", str(traces), "--drafters", "ar", "oracle", "--batch-size", "1",
        "-o", str(out), "--no-progress", "--no-plots",
    ]  # fmt: skip


def test_ctrl_c_in_replay_leaves_a_run_report_refuses(tmp_path: Path, monkeypatch, capsys):
    import agspec.lab.run as run

    traces, out = _traces(tmp_path), tmp_path / "run"
    assert main(_replay_args(traces, out)) == 0
    assert main(["report", str(out)]) == 0
    capsys.readouterr()
    old_summary = (out / "summary.json").read_text()

    real = run._run_task
    calls = [0]

    def task(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(run, "_run_task", task)
    # A re-run into the same folder, interrupted after its first replay.
    assert main(_replay_args(traces, out)) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "agspec replay: interrupted"
    _no_traceback(err)
    assert not (out / "complete.json").exists()
    assert (out / "summary.json").read_text() != old_summary  # the old run's is gone
    assert main(["report", str(out)]) == 1
    assert "incomplete run" in capsys.readouterr().err
    assert main(["report", str(out), "--allow-incomplete"]) == 0
    assert "!! INCOMPLETE RUN" in capsys.readouterr().out


def test_a_replay_that_fails_midway_is_not_complete(tmp_path: Path, monkeypatch, capsys):
    import agspec.lab.run as run

    real = run._run_task
    calls = [0]

    def boom(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 2:  # after one replay's entry is in summary.json
            raise ValueError("drafter exploded")
        return real(*args, **kwargs)

    monkeypatch.setattr(run, "_run_task", boom)
    out = tmp_path / "run"
    assert main(_replay_args(_traces(tmp_path), out)) == 1
    assert "drafter exploded" in capsys.readouterr().err
    assert (out / "config.json").exists() and not (out / "complete.json").exists()
    assert main(["report", str(out)]) == 1


def test_a_changed_summary_is_not_complete(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(_replay_args(_traces(tmp_path), out)) == 0
    summary = json.loads((out / "summary.json").read_text())
    summary["entries"] = summary["entries"][:1]
    (out / "summary.json").write_text(json.dumps(summary))
    capsys.readouterr()
    assert main(["report", str(out)]) == 1
    assert "summary.json changed after the run completed" in capsys.readouterr().err


def test_sigint_in_a_replay_with_worker_processes_is_one_line(tmp_path: Path) -> None:
    # The real signal, with --jobs 2: without the fix each worker printed a traceback.
    path = tmp_path / "big.jsonl"
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "eps", "(x)", "return", "\n", "    "]
    sessions = []
    for i in range(12):
        s = _session(f"s{i}")
        s.calls[0].output = " ".join(rng.choice(words) for _ in range(12_000))
        sessions.append(s)
    write_sessions(sessions, path)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agspec", *_replay_args(path, out)]
    cmd[cmd.index("oracle")] = "pld-hf"
    cmd += ["--jobs", "2", "--batch-size", "1", "2", "4"]
    # Its own process group, signalled as a whole: what Ctrl-C in a terminal does.
    # SIGINT at its default disposition, as in a terminal: a test run started in the
    # background by a non-interactive shell inherits SIGINT ignored, and Python then never
    # raises KeyboardInterrupt (the replay would simply finish).
    proc = subprocess.Popen(
        cmd,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert line.startswith("loaded "), line
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        err = proc.stderr.read()
        rc = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert rc == 130, err
    assert err.strip().splitlines()[-1] == "agspec replay: interrupted", err
    _no_traceback(err)
    assert not (out / "complete.json").exists()


def test_ctrl_c_in_record_is_one_line_and_keeps_the_recorded_sessions(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    import agspec.cli.record_cmd as record_cmd
    import agspec.models
    import agspec.pipeline.runner

    class NoModel:
        name = "none"

        def __init__(self, *args, **kwargs) -> None:
            pass

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(agspec.models, "resolve_model", lambda name: Path("/m.gguf"))
    monkeypatch.setattr(agspec.pipeline.runner, "LlamaLLM", NoModel)
    monkeypatch.setattr(record_cmd, "run_session", interrupted)
    out = tmp_path / "t.jsonl"
    args = ["record", "paginate", "-o", str(out), "--drafter", "none", "--no-progress"]
    assert main(args) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["agspec record: interrupted"]
    assert not out.exists() or check_file(out)[1] == []


# -- check accepts exactly what the readers accept ---------------------------


@pytest.mark.parametrize(
    "lines, where",
    [
        ([_line(_session("a"))] * 2, ":2: session.session_id: 'a' repeats line 1"),
        ([_line(_session(""))], ":1: session.session_id: empty"),
        ([_NUL], ":1: session.calls[0].artifacts[0].text: NUL character at offset 2"),
        ([_HUGE_TURN], ":1: session.calls[0].turn: expected integer, got an integer of 5000"),
    ],
)
def test_check_rejects_what_the_readers_reject(tmp_path: Path, capsys, lines, where) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert main(["traces", "check", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}{where}" in err, err
    assert err.startswith(f"{path}:")
    _no_traceback(err)
    with pytest.raises(TraceFormatError):
        list(read_sessions(path))


def test_nul_artifacts_and_empty_ids_were_what_replay_rejected(tmp_path: Path, capsys) -> None:
    # The readers now reject them up front, with the field, instead of a replay failing.
    for s in (_session("a", artifact_text="a\x00b"), _session("")):
        path = tmp_path / "t.jsonl"
        path.write_text(_line(s) + "\n")
        assert main(_replay_args(path, tmp_path / "run")) == 1
        assert f"{path}:1: session." in capsys.readouterr().err


def test_check_finds_session_ids_repeated_across_files(tmp_path: Path, capsys) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_sessions([_session("s1"), _session("s2")], a)
    write_sessions([_session("s2")], b)
    assert main(["traces", "check", str(a)]) == 0
    assert main(["traces", "check", str(a), str(b)]) == 1
    assert f"{b}:1: session.session_id: 's2' is also at {a}:2" in capsys.readouterr().err


def test_damaged_gzip_names_file_and_line(tmp_path: Path, capsys) -> None:
    good = tmp_path / "t.jsonl.gz"
    write_sessions([_session(f"s{i}", artifact_text=f"{i}" * 5000) for i in range(50)], good)
    data = good.read_bytes()
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes(data[: len(data) // 2])
    flipped = tmp_path / "flip.jsonl.gz"
    body = bytearray(data)
    body[len(body) // 2] ^= 0xFF
    flipped.write_bytes(bytes(body))
    crc = tmp_path / "crc.jsonl.gz"
    crc.write_bytes(data[:-8] + bytes(8))
    for path in (truncated, flipped, crc):
        assert main(["traces", "check", str(path)]) == 1
        err = capsys.readouterr().err
        _no_traceback(err)
        assert f"{path}:" in err and "gzip file" in err, err
        with pytest.raises(TraceFormatError, match=f"{path}:[0-9]+: .*gzip file"):
            list(read_sessions(path))


def test_check_and_read_sessions_agree_on_random_edits(tmp_path: Path) -> None:
    base = "\n".join(_line(_session(f"s{i}", turn=i)) for i in range(3)).encode() + b"\n"
    rng = random.Random(12)
    path = tmp_path / "t.jsonl"
    agreed = {True: 0, False: 0}
    for _ in range(300):
        data = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(data))
            data[i : i + 1] = rng.choice([b"", b"\x00", b"0", b'"', b"\n", b"9" * 30, b"\xff"])
        path.write_bytes(bytes(data))
        n_ok, errors = check_file(path)
        try:
            n_read = len(list(read_sessions(path)))
            readable = True
        except TraceFormatError:
            readable = False
        assert (not errors) == readable, (bytes(data), errors)
        if readable:
            assert n_read == n_ok
        agreed[readable] += 1
    assert agreed[True] > 10 and agreed[False] > 10


# -- the SWE-agent importer on hostile history entries ---------------------------


@pytest.mark.parametrize("agent", [["primary"], {"name": "primary"}, 3])
def test_swe_agent_agent_that_is_not_a_string(tmp_path: Path, capsys, agent) -> None:
    doc = json.loads((FIXTURES / "swe_agent_small.traj.fixture").read_text())
    doc["history"][1]["agent"] = agent
    bad = tmp_path / "in" / "bad.traj"
    bad.parent.mkdir()
    bad.write_text(json.dumps(doc))
    out = tmp_path / "out.jsonl"
    args = ["traces", "import", "swe-agent", str(bad), "-o", str(out), "--no-progress"]
    assert main(args) == 1
    err = capsys.readouterr().err
    _no_traceback(err)
    assert "history[1].agent: expected a string" in err
    assert not out.exists()
    # Beside a good file: the bad one is skipped, by name, and the output is clean.
    shutil.copy(FIXTURES / "swe_agent_small.traj.fixture", bad.parent / "good.traj")
    args[3] = str(bad.parent)
    assert main(args) == 0
    assert "skipped: " in capsys.readouterr().err
    assert check_file(out) == (1, [])


# -- fail fast, with a message ----------------------------------------------------


def test_record_of_an_unknown_task_fails_before_the_model_loads(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    import agspec.models

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(agspec.models, "resolve_model", no_model)
    out = tmp_path / "sub" / "t.jsonl"
    assert main(["record", "paginate", "no-such-task", "-o", str(out)]) == 1
    assert "unknown task 'no-such-task'" in capsys.readouterr().err
    assert not (tmp_path / "sub").exists()


def test_import_of_an_empty_folder_fails(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "o.jsonl"
    assert main(["traces", "import", "chatdev", str(empty), "-o", str(out)]) == 1
    assert "no chatdev trace files" in capsys.readouterr().err
    assert not out.exists()


def test_index_query_with_an_absurd_max_tokens(tmp_path: Path, capsys) -> None:
    src = tmp_path / "a.py"
    src.write_text("a = 1\na = 2\n")
    idx = tmp_path / "a.idx"
    assert main(["index", "build", str(src), "-o", str(idx), "--quiet"]) == 0
    for flag in ("--max-tokens", "--max-occurrences"):
        args = ["index", "query", str(idx), "a =", flag, "99999999999999999999"]
        assert main(args) == 1
        err = capsys.readouterr().err
        assert f"{flag} must be in [0, 65536]" in err
        _no_traceback(err)


def test_gzip_output_of_import_is_whole(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl.gz"
    args = ["traces", "import", "chatdev", str(FIXTURES), "-o", str(out), "--no-progress"]
    assert main(args) == 0
    with gzip.open(out, "rt") as f:
        assert len(f.read().splitlines()) == 1


# -- the front door: help, version, early checks, hints, one output rule --------------


def _commands() -> list[tuple[str, Any]]:
    from agspec.cli import build_parser, subcommands

    return [(path, p) for path, p in subcommands(build_parser()) if path.split(" ")[0] != "serve"]


def test_every_command_shows_an_example_that_parses() -> None:
    """The oracle is argparse itself: each command's example is accepted by the real
    parser and names that command (`agspec serve` has its own)."""
    import shlex

    from agspec.cli import EXAMPLES, build_parser

    commands = _commands()
    assert {path for path, _ in commands} == set(EXAMPLES)
    for path, parser in commands:
        help_text = parser.format_help()
        lines = EXAMPLES[path].splitlines()
        assert all(f"\n  {line}" in help_text for line in lines), (path, help_text)
        for line in lines:
            argv = shlex.split(line)[1:]
            assert " ".join(argv).startswith(path), (path, line)
            build_parser().parse_args(argv)  # SystemExit (a usage error) fails the test


def test_version(capsys) -> None:
    from importlib.metadata import version

    import agspec

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"agspec {agspec.__version__}"
    assert agspec.__version__ == version("agspec")


def test_replay_checks_its_cost_model_before_loading_traces(tmp_path, monkeypatch, capsys):
    import agspec.lab.run

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the traces were loaded before the arguments were checked")

    monkeypatch.setattr(agspec.lab.run, "load_sessions", no_load)
    traces = FIXTURES.parent / "traces" / "chatdev_small.log"  # never read
    out = tmp_path / "run"
    argv = ["replay", str(traces), "--cost-model", "h200-nope", "-o", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "unknown cost model 'h200-nope'" in err and "h200-qwen2.5-32b" in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--batch-size", "0"], "--batch-size must be ints >= 1"),
        (["--max-tokens", "0"], "--max-tokens an int >= 1"),
        (["--cost-model", "h200-nope"], "unknown cost model 'h200-nope'"),
    ],
)
def test_profile_checks_its_arguments_before_the_tokenizer(
    tmp_path, monkeypatch, capsys, extra, message
):
    import agspec.tokenizers

    def no_tokenizer(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tokenizer was loaded before the arguments were checked")

    monkeypatch.setattr(agspec.tokenizers, "get_tokenizer", no_tokenizer)
    traces = tmp_path / "t.jsonl"
    write_sessions([_session("a")], traces)
    assert main(["profile", str(traces), "-o", str(tmp_path / "caps.json"), *extra]) == 1
    assert message in capsys.readouterr().err


def test_check_of_a_raw_agent_file_says_import_it_first(tmp_path: Path, capsys) -> None:
    raw = tmp_path / "django-1.traj.json"
    shutil.copy(FIXTURES / "mini_swe_agent_small.traj.json.fixture", raw)
    assert main(["traces", "check", str(raw)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"{raw}: a raw mini-swe-agent file, not AgSpec traces; import it first: "
        f"agspec traces import mini-swe-agent {raw} -o traces.jsonl"
    ]
    # What the hint says works, and the imported file passes the check.
    out = tmp_path / "traces.jsonl"
    assert main(["traces", "import", "mini-swe-agent", str(raw), "-o", str(out)]) == 0
    assert main(["traces", "check", str(out)]) == 0


def test_an_agspec_file_with_bad_lines_still_lists_them(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"not": "a session"}\n', encoding="utf-8")
    assert main(["traces", "check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "import it first" not in err and "t.jsonl:1" in err, err


def test_an_optional_engine_missing_is_one_line_naming_the_install(tmp_path, capsys):
    from guards import missing_engine

    from agspec.adapters.vllm import main as vllm_main

    model = tmp_path / "model"
    model.mkdir()
    with pytest.raises(SystemExit) as info:  # the arguments are checked first
        vllm_main(["profile", str(model), "--out", str(tmp_path / "p.json"), "--batch-sizes", "0"])
    assert info.value.code == 2 and "--batch-sizes" in capsys.readouterr().err
    if missing_engine("vllm") is None:
        pytest.skip("vLLM is installed here: nothing is missing")
    with pytest.raises(SystemExit) as info:
        vllm_main(["profile", str(model), "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert info.value.code == 1 and "Traceback" not in err
    assert err.count("\n") == 1 and "scripts/install_vllm.sh" in err and "pip install" in err


def test_a_missing_llama_cpp_is_one_line(monkeypatch, capsys) -> None:
    import agspec.adapters.llama_cpp as adapter

    def absent() -> None:
        raise ImportError("the llama.cpp adapter needs llama-cpp-python==0.3.36; build it")

    monkeypatch.setattr(adapter, "import_llama_cpp", absent)
    argv = ["costmodel", "measure", "--model", "smollm2", "-o", "/nonexistent/x.json"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    want = "the llama.cpp adapter needs llama-cpp-python==0.3.36; build it"
    assert err == f"agspec costmodel: error: {want}\n"


def test_every_command_creates_a_missing_output_folder(tmp_path: Path) -> None:
    """`index build` and `traces import` create the folders of their output as `replay`
    creates its run folder."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("def f():\n    return 1\n", encoding="utf-8")
    index = tmp_path / "new" / "deeper" / "a.agidx"
    assert main(["index", "build", str(src), "-o", str(index), "--quiet"]) == 0
    assert index.is_file()
    traces = tmp_path / "other" / "t.jsonl"
    argv = ["traces", "import", "chatdev", str(FIXTURES / "chatdev_small.log"), "-o", str(traces)]
    assert main([*argv, "--no-progress"]) == 0
    assert read_sessions(traces)
