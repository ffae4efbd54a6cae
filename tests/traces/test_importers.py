"""Importers on small hand-written fixtures, with hand-checked calls, roles and artifacts."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from agspec.traces import (
    Artifact,
    Message,
    TraceFormatError,
    UnsupportedLayoutError,
    import_traces,
    read_sessions,
    write_sessions,
)
from agspec.traces.formats.chatdev import import_chatdev, parse_codes
from agspec.traces.formats.mini_swe_agent import import_mini_swe_agent
from agspec.traces.formats.swe_agent import import_swe_agent, shorten_history
from agspec.traces.roles import chatdev_phase_role, infer_role

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces"


def _as_trace_file(name: str) -> Path:
    """The hand-written fixture under its real trace name (the session id comes from it).

    Fixtures carry a `.fixture` suffix in the repository so that they are never mistaken
    for third-party traces.
    """
    # SWE-agent's importer takes the model name from the folder, as the data is laid out.
    out = Path(tempfile.mkdtemp(prefix="agspec-fixtures-")) / "fixture-model" / name
    out.parent.mkdir()
    shutil.copyfile(FIXTURES / f"{name}.fixture", out)
    return out


SWE = _as_trace_file("swe_agent_small.traj")
MINI = _as_trace_file("mini_swe_agent_small.traj.json")
CHATDEV = FIXTURES / "chatdev_small.log"

GREET_V1 = 'def greet(name):\n    return "hi " + nam\n\nprint(greet("bob"))\n'
GREET_V2 = 'def greet(name):\n    return "hi " + name\n\n\nprint(greet("bob"))\n'


# --- SWE-agent ----------------------------------------------------------------------------


def test_swe_agent_calls_roles_and_artifacts():
    s = import_swe_agent(SWE)
    assert (s.source, s.task_id, s.session_id) == (
        "swe-agent",
        "swe_agent_small",
        "swe-agent/fixture-model/swe_agent_small",
    )
    assert s.model == "fixture-model"
    # 10 assistant entries; the last, "Exit due to cost limit", is not a model call.
    assert [c.role for c in s.calls] == [
        "localize", "localize", "code", "code", "execute", "code", "localize", "localize", "other",
    ]  # fmt: skip
    assert [c.turn for c in s.calls] == list(range(9))
    assert {c.emission_format for c in s.calls} == {"line_edit"}
    assert s.calls[-1].output == "Done.\n\n```\nsubmit\n```"
    arts = [c.artifacts for c in s.calls]
    assert arts[2] == [Artifact("/repo/src/greet.py", GREET_V1, True)]
    # The rejected edit's preview is ignored; the original window is what was known: no update.
    assert arts[3] == []
    assert arts[4] == [Artifact("/repo/src/greet.py", GREET_V2, True)]
    assert arts[6] == [Artifact("/repo/tests/test_greet.py", "\n", True)]
    assert arts[7] == [Artifact("/repo/src/util.py", "A = 1\nB = 2\n", False)]
    assert arts[8] == [Artifact("/repo/src/util.py", "A = 1\nB = 2\nC = 3\nD = 4\n", True)]
    assert arts[0] == arts[1] == arts[5] == []


def test_swe_agent_history_is_shortened_as_the_model_saw_it():
    s = import_swe_agent(SWE)
    # Calls 0..5 saw at most 6 observations (issue + 5): nothing omitted.
    assert all("Old output omitted" not in m.content for c in s.calls[:6] for m in c.messages)
    last = s.calls[8].messages
    assert len(last) == 19
    assert last[0].content.startswith("SYSTEM PROMPT")
    assert last[1].content.startswith("DEMONSTRATION")  # demos are kept
    assert last[2].content.startswith("ISSUE")  # the first observation is kept
    # Observations 2, 3, 4 (history 4, 6, 8) are older than the last five: omitted.
    assert last[4] == Message("user", "Old output omitted (5 lines)")
    assert last[6] == Message("user", "Old output omitted (8 lines)")
    assert last[8] == Message("user", "Old output omitted (26 lines)")
    assert last[10].content.startswith("[File: /repo/src/greet.py (5 lines total)]")
    assert last[3].role == "assistant" and last[3].content.startswith("Find it.")
    call6 = s.calls[6].messages
    assert call6[4] == Message("user", "Old output omitted (5 lines)")
    assert call6[6].content.startswith("[File: /repo/src/greet.py (4 lines total)]")


def test_swe_agent_full_history_option():
    s = import_swe_agent(SWE, keep_last_observations=None)
    assert all("Old output omitted" not in m.content for c in s.calls for m in c.messages)
    s2 = import_swe_agent(SWE, keep_last_observations=1)
    assert s2.calls[8].messages[16] == Message("user", "Old output omitted (7 lines)")
    with pytest.raises(ValueError, match="keep_last_observations"):
        import_swe_agent(SWE, keep_last_observations=0)


def test_shorten_history_matches_swe_agent_rule():
    obs = [{"role": "user", "content": f"o{i}\n" * (i + 1)} for i in range(9)]
    demo = {"role": "user", "content": "demo", "is_demo": True}
    out = shorten_history([demo, *obs], 5)
    assert out[0] is demo
    assert [m["content"] for m in out[1:5]] == [
        "o0\n", "Old output omitted (2 lines)", "Old output omitted (3 lines)",
        "Old output omitted (4 lines)",
    ]  # fmt: skip
    assert [m["content"] for m in out[5:]] == [f"o{i}\n" * (i + 1) for i in range(4, 9)]


# --- mini-swe-agent -----------------------------------------------------------------------


def test_mini_swe_agent_calls_roles_and_artifacts():
    s = import_mini_swe_agent(MINI)
    assert (s.session_id, s.model, s.task_id) == (
        "mini-swe-agent/hand/written-model/calc__calc-1", "hand/written-model", "calc__calc-1",
    )  # fmt: skip
    assert [c.role for c in s.calls] == [
        "localize", "localize", "code", "localize", "other", "execute", "localize", "other",
    ]  # fmt: skip
    assert {c.emission_format for c in s.calls} == {"bash"}
    # The whole linear history, unchanged.
    assert [len(c.messages) for c in s.calls] == [2, 4, 6, 8, 10, 12, 14, 16]
    assert s.calls[3].messages[5].content.endswith("    return a - b\n</output>")
    assert s.calls[2].artifacts == [Artifact("calc.py", "def add(a, b):\n    return a - b\n", True)]
    # After `sed -i` the file starts afresh from what `nl -ba | sed -n` showed.
    assert s.calls[4].artifacts == [Artifact("calc.py", "    return a + b\n", False)]
    assert s.calls[7].artifacts == [
        Artifact("calc.py", "def add(a, b):\n    return a + b\n", False)
    ]
    assert [len(c.artifacts) for c in s.calls] == [0, 0, 1, 0, 1, 0, 0, 1]


# --- ChatDev ------------------------------------------------------------------------------

REVIEW_PROMPT = 'Review these.\nCodes:\n"main.py\n```python\nprint("hello")\n```\n"\nComment now.'


def test_chatdev_calls_messages_and_duplicate_rule():
    notes: list[str] = []
    s = import_chatdev(CHATDEV, notes)
    assert (s.source, s.model, s.task_id) == ("chatdev", "GPT_3_5_TURBO", "chatdev_small")
    assert notes == [f"{CHATDEV}: 2 output blocks repeating the block before them, dropped"]
    assert [(c.agent, c.role, c.phase, c.emission_format) for c in s.calls] == [
        ("Programmer", "code", "Coding", "whole_file"),
        ("Code Reviewer", "review", "CodeReviewComment", "none"),
        ("Programmer", "review", "CodeReviewComment", "none"),
        ("Code Reviewer", "review", "CodeReviewComment", "none"),
        ("Code Reviewer", "review", "CodeReviewComment", "none"),  # a later identical call is real
    ]
    sys_p = Message("system", "You are Programmer. Write code.")
    sys_r = Message("system", "You are Code Reviewer. Review code.")
    comment, finished = "<COMMENT> Add a newline.", "<INFO> Finished."
    assert s.calls[0].messages == [sys_p, Message("user", "Write a hello program.")]
    assert s.calls[0].output == 'main.py\n```python\nprint("hello")\n```'
    assert s.calls[1].messages == [sys_r, Message("user", REVIEW_PROMPT)]
    assert s.calls[2].messages == [
        sys_p, Message("assistant", REVIEW_PROMPT), Message("user", comment),
    ]  # fmt: skip
    assert s.calls[2].output == finished
    assert s.calls[3].messages == [
        sys_r, Message("user", REVIEW_PROMPT), Message("assistant", comment),
        Message("user", finished),
    ]  # fmt: skip
    assert s.calls[4].messages == [sys_r, Message("user", REVIEW_PROMPT)]
    assert [c.output for c in s.calls[1:]] == [comment, finished, comment, comment]
    # Codes: artifacts at the first call that saw them, not again while unchanged.
    assert s.calls[1].artifacts == [Artifact("main.py", 'print("hello")\n', True)]
    assert sum(len(c.artifacts) for c in s.calls) == 1


def test_session_emission_format():
    assert import_swe_agent(SWE).emission_format == "line_edit"
    assert import_mini_swe_agent(MINI).emission_format == "bash"
    assert import_chatdev(CHATDEV).emission_format == "whole_file"


def test_chatdev_keep_repeated_blocks_option():
    s = import_chatdev(CHATDEV, drop_repeated_blocks=False)
    assert len(s.calls) == 7
    assert s.calls[1].agent == "Chief Technology Officer"
    assert s.calls[1].messages[1] == Message("assistant", "Write a hello program.")


def test_chatdev_old_layout_is_skipped_with_a_reason():
    with pytest.raises(UnsupportedLayoutError, match="older ChatDev layout"):
        import_chatdev(FIXTURES / "chatdev_old_layout.log")
    sessions, skipped = import_traces("chatdev", [FIXTURES])
    assert [s.task_id for s in sessions] == ["chatdev_small"]
    whole = [k for k in skipped if k.whole_file]
    assert [Path(k.path).name for k in whole] == ["chatdev_old_layout.log"]
    assert "older ChatDev layout" in whole[0].reason
    assert [k.reason for k in skipped if not k.whole_file] == [
        "2 output blocks repeating the block before them, dropped"
    ]


def test_parse_codes():
    prompt = (
        'x\nCodes:\n"a.py\n```python\nA = 1\n```\n\nweb/b.js\n```js\nB\n\n```\n"\n'
        'Comments on Codes:\n"c.py\n```python\nC\n```"'
    )
    assert parse_codes(prompt) == [("a.py", "A = 1\n"), ("web/b.js", "B\n\n")]
    assert parse_codes("no codes here") == []
    assert parse_codes('Codes: "main.py\n```python\nunterminated') == []


# --- roles --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "role"),
    [
        ("find_file Foo.java", "localize"),
        ("search_dir LocalTime src", "localize"),
        ("open src/Foo.java 120", "localize"),
        ("edit 3:4\n  x = 1\nend_of_edit", "code"),
        ("create Repro.java", "code"),
        ("submit", "other"),
        ("javac -cp . Repro.java && java Repro", "execute"),
        ("mvn -q test", "execute"),
        ("cat <<'EOF' > t.py\nprint(1)\nEOF", "code"),
        ("sed -i 's/a/b/' x.py", "code"),
        ("python - <<'EOF'\nopen('x.py', 'w').write('')\nEOF", "code"),
        ("cd /testbed && python -m pytest -q tests/test_a.py", "execute"),
        ("./tests/runtests.py queries", "execute"),
        ("PYTHONPATH=. timeout 60 python repro.py", "execute"),
        ("nl -ba a.py | sed -n '10,20p'", "localize"),
        ("grep -rn 'def foo' src | head", "localize"),
        ("git diff", "localize"),
        ("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached", "other"),
        ("# just thinking", "other"),
        ("", "other"),
        ("echo hello", "other"),
    ],
)
def test_infer_role(action, role):
    assert infer_role(action) == role


def test_chatdev_phase_roles():
    assert chatdev_phase_role("Coding") == "code"
    assert chatdev_phase_role("CodeReviewComment") == "review"
    assert chatdev_phase_role("DemandAnalysis") == "plan"
    assert chatdev_phase_role("SomethingNew") == "other"


# --- round trip ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "path"), [("swe-agent", SWE), ("mini-swe-agent", MINI), ("chatdev", CHATDEV)]
)
def test_import_write_read_round_trip(tmp_path, fmt, path):
    sessions, _ = import_traces(fmt, [path])
    assert len(sessions) == 1
    out = tmp_path / "out.jsonl"
    write_sessions(sessions, out)
    assert list(read_sessions(out)) == sessions


def test_import_traces_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown trace format 'aider'"):
        import_traces("aider", [SWE])
    with pytest.raises(FileNotFoundError):
        import_traces("swe-agent", [tmp_path / "missing"])
    bad = tmp_path / "bad.traj"
    bad.write_text('{"history": [{"role": "user"}]}')
    sessions, skipped = import_traces("swe-agent", [bad])
    assert sessions == []
    assert skipped[0].reason == "history[0].content: missing field" and skipped[0].whole_file


def test_errors_are_value_errors():
    assert issubclass(TraceFormatError, ValueError)


def test_sets_of_two_models_get_distinct_session_ids(tmp_path: Path) -> None:
    # The same SWE-agent instance run by two models: the ids carry the model (the folder
    # name), so both sets can be replayed and counted together.
    for model in ("model-a", "model-b"):
        (tmp_path / model).mkdir()
        shutil.copyfile(SWE, tmp_path / model / SWE.name)
    sessions, _ = import_traces("swe-agent", [tmp_path / "model-a", tmp_path / "model-b"])
    assert sorted(s.session_id for s in sessions) == [
        "swe-agent/model-a/swe_agent_small",
        "swe-agent/model-b/swe_agent_small",
    ]
