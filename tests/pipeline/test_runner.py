"""The pipeline's turn loop and the recorder, with a scripted fake model (issue 7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agspec.cli import main as cli_main
from agspec.drafter import VARIANTS, AgSpecServer
from agspec.pipeline.runner import PipelineConfig, ScriptedLLM, run_session
from agspec.pipeline.tasks import load_task
from agspec.tokenizers import get_tokenizer
from agspec.traces import read_sessions, render_call
from agspec.traces.recorder import Recorder, read_sidecar, sidecar_path

GOOD = load_task("paginate").reference_patch
BAD_CONTEXT = "--- a/pages.py\n+++ b/pages.py\n@@ -1 +1 @@\n-nothing here\n+x = 1\n"
WRONG_FIX = (
    "```diff\n--- a/pages.py\n+++ b/pages.py\n@@ -7,1 +7,1 @@\n"
    "-    return total // per_page\n+    return total // per_page + 1\n```"
)


def _agspec() -> AgSpecServer:
    return AgSpecServer(tokenizer=get_tokenizer("qwen2.5"), config=VARIANTS["agspec-paper"])


def _replies(*coder: str) -> dict[str, list[str]]:
    return {"localizer": ["READ pages.py\nREAD links.py", "EDIT pages.py"], "coder": list(coder)}


def test_retries_until_the_tests_pass_and_records_every_call() -> None:
    llm = ScriptedLLM(_replies(BAD_CONTEXT, WRONG_FIX, GOOD))
    r = run_session("paginate", llm, server_factory=_agspec)
    assert r.status == "passed" and r.detail == "tests pass after attempt 3"
    calls = r.session.calls
    assert [(c.agent, c.role, c.turn) for c in calls] == [
        ("localizer", "localize", 0),
        ("localizer", "localize", 1),
        ("coder", "code", 2),
        ("coder", "code", 3),
        ("coder", "code", 4),
    ]
    assert [c.emission_format for c in calls] == ["none", "none"] + ["unified_diff"] * 3
    assert r.session.emission_format == "unified_diff"
    assert [o.status for o in r.observations] == ["patch_error", "failed", "passed"]
    # Artifacts in full, once: the files read at call 1; the coder's file was shown already.
    task = load_task("paginate")
    assert [(a.path, a.text, a.complete) for a in calls[1].artifacts] == [
        ("pages.py", task.files["pages.py"], True),
        ("links.py", task.files["links.py"], True),
    ]
    assert all(not c.artifacts for c in calls[2:])
    # The executor's observation is the last message of the coder's next call.
    assert calls[3].messages[-2].content == BAD_CONTEXT
    assert "did not apply" in calls[3].messages[-1].content
    assert "test_pages" in calls[4].messages[-1].content
    # The model saw exactly render_call(call): the replay renders the same ids.
    assert llm.prompts == [render_call(c)[0] for c in calls]
    # Live stats: steps commit the output ids, which end with im_end.
    for call, live in zip(calls, r.live):
        out_ids = render_call(call, end_token=True)[1]
        assert live.output_ids == out_ids and live.stopped_by == "eos"
        assert sum(s[2] for s in live.steps) == len(out_ids)
    # AgSpec drafted from the workspace: the coder's diff repeats the file's lines.
    assert sum(s[1] for s in r.live[4].steps) > 0


def test_turn_limit_and_max_tokens() -> None:
    cfg = PipelineConfig(max_turns=2, max_new_tokens=5, localizer_max_new_tokens=3)
    r = run_session("paginate", ScriptedLLM(_replies(WRONG_FIX, WRONG_FIX)), config=cfg)
    assert r.status == "failed" and r.detail == "turn limit 2 (patch_error)"
    assert [len(c.output_ids) for c in r.live] == [3, 3, 5, 5]
    assert all(c.stopped_by == "length" for c in r.live)


def test_broken_task_and_model_error_are_results_not_exceptions(tmp_path: Path) -> None:
    r = run_session("no-such-task", ScriptedLLM({}))
    assert r.status == "error" and "broken task" in r.detail and not r.session.calls

    class Boom(ScriptedLLM):
        def generate(self, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
            if self.prompts:
                raise RuntimeError("context full")
            return super().generate(*args, **kwargs)  # type: ignore[arg-type]

    r = run_session("paginate", Boom(_replies()))
    assert r.status == "error" and r.detail == "RuntimeError: context full"
    assert len(r.session.calls) == 1  # what was made before the error is kept


def _write(rec: Recorder, task: str) -> None:
    r = run_session(task, ScriptedLLM(_replies(GOOD)))
    rec.write(r.session, {"status": r.status, "calls": [c.to_dict() for c in r.live]})


def test_recorder_resumes_without_duplicates_or_losses(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    rec = Recorder(out)
    _write(rec, "paginate")
    _write(rec, "leap-years")
    with pytest.raises(ValueError, match="already"):
        _write(rec, "paginate")
    # An interruption in the middle of the third session's lines.
    with open(sidecar_path(out), "ab") as f:
        f.write(b'{"session_id": "agspec-pipeline/word-count", "status": "passed"}\n')
    with open(out, "ab") as f:
        f.write(b'{"format_version": 1, "session_id": "agspec-pipel')
    rec = Recorder(out)
    assert rec.done == {"agspec-pipeline/paginate", "agspec-pipeline/leap-years"}
    assert [s.task_id for s in read_sessions(out)] == ["paginate", "leap-years"]
    assert sorted(read_sidecar(sidecar_path(out))) == sorted(rec.done)
    _write(rec, "word-count")
    rec = Recorder(out)
    assert [s.task_id for s in read_sessions(out)] == ["paginate", "leap-years", "word-count"]
    live = [json.loads(x) for x in sidecar_path(out).read_text().splitlines()]
    assert [x["session_id"] for x in live] == [s.session_id for s in read_sessions(out)]


def test_sidecar_path() -> None:
    assert sidecar_path("a/t.jsonl") == Path("a/t.live.jsonl")
    assert sidecar_path("t.jsonl.gz") == Path("t.live.jsonl.gz")


def test_record_cli_skips_recorded_sessions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.jsonl"
    rec = Recorder(out)
    _write(rec, "paginate")
    # Everything asked for is there: no model is loaded (the model name is not even valid).
    # (--drafter agspec-paper: the default drafter would first ask for a cost model for
    # a model that is not the default one, see the last assertion.)
    paper = ["--drafter", "agspec-paper"]
    assert (
        cli_main(["record", "paginate", "-o", str(out), "--model", "/nonexistent.gguf", *paper])
        == 0
    )
    assert "0 recorded, 1 already there" in capsys.readouterr().out
    assert (
        cli_main(["record", "paginate", "leap-years", "-o", str(out), "--model", "/x.gguf", *paper])
        == 1
    )
    assert "does not exist" in capsys.readouterr().err
    # The cost-aware default refuses a model without a cost profile before anything loads.
    assert cli_main(["record", "paginate", "-o", str(out), "--model", "/nonexistent.gguf"]) == 1
    assert "needs --cost-model" in capsys.readouterr().err


def test_record_cli_agspec_cost_needs_a_cost_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.jsonl"
    # A model other than the default one has no shipped profile: --cost-model is needed.
    model = ["--model", str(tmp_path / "x.gguf")]
    args = ["record", "paginate", "-o", str(out), "--drafter", "agspec-paper+cost", *model]
    assert cli_main(args) == 1
    assert "needs --cost-model" in capsys.readouterr().err
    assert cli_main([*args, "--cost-model", str(tmp_path / "missing.json")]) == 1
    assert not out.exists()


def test_agspec_cost_curves_carry_from_session_to_session(tmp_path: Path) -> None:
    """`agspec record --drafter agspec-paper+cost --curves FILE`: every session's fresh server
    starts from the curves the sessions before it saved."""
    from agspec.cli.record_cmd import _agspec_factory
    from agspec.policy.costmodel import get_cost_model

    curves = tmp_path / "curves.json"
    factory = _agspec_factory(
        "agspec-paper+cost",
        get_cost_model("epyc2t-llamacpp-qwen2.5-coder-0.5b-measured"),
        str(curves),
    )
    prior = factory().lengths.survival
    run_session(
        "paginate", ScriptedLLM(_replies(WRONG_FIX, WRONG_FIX, GOOD)), server_factory=factory
    )
    assert curves.exists()
    learned = factory().lengths.survival  # a new server, as the next session gets
    # The coder's retries repeated a patch: its curve for long matches moved off the prior.
    assert any(
        learned.curve("coder", m) != prior.curve("coder", m) for m in (1, 2, 4, 8, 16, 32, 64)
    )
