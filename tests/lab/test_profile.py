"""Offline cap profiling on a hand-computed session (real Qwen2.5 tokenizer)."""

from __future__ import annotations

import pytest

from agspec.lab.profile import acceptance_records, profile_caps
from agspec.policy.caps import ProfiledCap
from agspec.policy.costmodel import RooflineCostModel, get_cost_model
from agspec.tokenizers import get_tokenizer
from agspec.traces.schema import Call, Message, Session


def session(outputs: list[str], agent: str = "coder") -> Session:
    calls = [
        Call(agent=agent, role="code", turn=i, messages=[Message("user", f"step {i}")], output=o)
        for i, o in enumerate(outputs)
    ]
    return Session(session_id="s", source="test", model="m", task_id="t", calls=calls)


def test_records_count_what_the_corpus_could_have_supplied():
    tok = get_tokenizer("qwen2.5")
    text = "def add(a, b):\n    return a + b\n"
    recs = acceptance_records([session([text, text])], tok, max_tokens=64)["coder"]
    out = tok.encode(text)
    # The second call's prompt ends like the first's ("<|im_start|>assistant\n"), which
    # the session corpus holds followed by the first output: all of it is reusable at
    # the first step.
    assert recs, "the second call must retrieve"
    assert max(r.reusable_tokens for r in recs) == len(out)
    assert all(r.reusable_tokens <= r.available_tokens for r in recs)


def test_caps_follow_p_star():
    tok = get_tokenizer("qwen2.5")
    text = "x = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\nprint(sum(x))\n"
    sessions = [session([text, text, text.replace("sum", "max")])]
    cm = get_cost_model("h200-qwen2.5-32b", context_tokens=4096)
    caps = profile_caps(sessions, tok, cost_model=cm, batch_sizes=(1,), max_tokens=32)
    assert isinstance(caps, ProfiledCap)
    cap = caps.cap_for("coder", batch_size=1)
    assert 1 <= cap <= 32
    with pytest.raises(ValueError):
        acceptance_records(sessions, tok, max_tokens=0)
    assert isinstance(cm, RooflineCostModel)
