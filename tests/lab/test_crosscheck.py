"""The cross-check harness: exact piecewise encoding, ChatDev block parsing, call shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agspec.lab.crosscheck import PieceEncoder, chatdev_sessions, swe_agent_sessions
from agspec.tokenizers import get_tokenizer

TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces"


def _encoder() -> PieceEncoder:
    return PieceEncoder(get_tokenizer("qwen2.5").encode)


def test_chat_calls_prompt_is_every_earlier_message() -> None:
    enc = _encoder()
    tok = get_tokenizer("qwen2.5")
    messages = [
        ("system", "Be brief."),
        ("user", "fix it."),
        ("assistant", "done!"),
        ("user", "  again\n\n"),
        ("assistant", "ok"),
    ]
    calls = enc.chat_calls(messages, "primary")
    assert len(calls) == 2
    whole = "### system\nBe brief.\n\n### user\nfix it.\n\n### assistant\ndone!\n\n"
    whole += "### user\n  again\n\n\n\n### assistant\n"
    assert list(calls[1].prompt_ids) == tok.encode(whole)  # pieces == whole-string encoding
    assert list(calls[1].output_ids) == tok.encode("ok")


def test_chatdev_blocks_and_repeats(tmp_path: Path) -> None:
    log = (
        "[2023-22-08 14:46:15 INFO] System: **[RolePlaying]**\n\n| a | b |\n\n"
        "[2023-22-08 14:46:16 INFO] User: **[Start Chat]**\n\n[You are X.]\n\nWrite a game.\n\n"
        "[2023-22-08 14:46:17 INFO] Programmer: **Programmer<->CTO on : Coding, turn 0**\n\n"
        "[You are Y.]\n\nmain.py\n```python\nprint(1)\n```\n\n"
        "[2023-22-08 14:46:18 INFO] CTO: **Programmer<->CTO on : Coding, turn 0**\n\n"
        "[You are Y.]\n\nmain.py\n```python\nprint(1)\n```\n\n"
        "[2023-22-08 14:46:19 INFO] CTO: **Programmer<->CTO on : Coding, turn 1**\n\n"
        "[You are Z.]\n\n<INFO> Finished.\n"
    )
    path = tmp_path / "game.log"
    path.write_text(log, encoding="utf-8")
    enc = _encoder()
    tok = get_tokenizer("qwen2.5")
    (session,) = chatdev_sessions([str(path)], enc)
    assert [c.agent for c in session.calls] == ["Programmer", "CTO"]  # the repeat is dropped
    assert list(session.calls[0].output_ids) == tok.encode("main.py\n```python\nprint(1)\n```")
    start = "User: **[Start Chat]**\n\n[You are X.]\n\nWrite a game."
    assert list(session.calls[1].prompt_ids) == tok.encode(start)


def test_swe_agent_real_trace_skips_demos() -> None:
    files = sorted((TRACES / "swe-agent-java").glob("*/*.traj"))
    if not files:
        pytest.skip(f"dev traces not found at {TRACES} (third-party data, not in the repo)")
    path = files[0]
    history = json.loads(path.read_text(encoding="utf-8"))["history"]
    kept = [h for h in history if not h.get("is_demo", False)]
    (session,) = swe_agent_sessions([str(path)], _encoder())
    assert len(session.calls) == sum(1 for h in kept if h["role"] == "assistant")
    tok = get_tokenizer("qwen2.5")
    first = next(i for i, h in enumerate(kept) if h["role"] == "assistant")
    text = "".join(f"### {h['role']}\n{h['content']}\n\n" for h in kept[:first])
    assert list(session.calls[0].prompt_ids) == tok.encode(text + "### assistant\n")
