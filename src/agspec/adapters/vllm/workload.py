"""What benchmarks/bench_vllm.py and the vLLM tests drive vLLM with: the model folder,
agent prompts from the bundled default traces, and the proposer's counters file.

>>> first_difference([1, 2, 3], [1, 2, 4])
2
>>> first_difference([1, 2], [1, 2]) is None
True
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "data" / "traces" / "default.jsonl.gz"

__all__ = ["DEFAULT_TRACES", "agent_prompts", "fit_prompt", "first_difference", "model_folder",
           "wait_stats"]  # fmt: skip


def model_folder(name: str = "smollm2-135m-instruct") -> Path:
    """The HF folder of a pinned model (exported once from its GGUF, then cached)."""
    from agspec.adapters.vllm.weights import export_hf

    return export_hf(name)


def agent_prompts(
    tokenizer: Any, count: int, max_prompt_tokens: int, *, roles: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """`count` recorded agent calls (round-robin over the sessions of the default traces),
    rendered with the model's chat template: dicts with session, agent, messages, ids.

    A call longer than `max_prompt_tokens` keeps its first message (the system prompt)
    and as many of its last messages as fit; a call that still does not fit is skipped.
    """
    from agspec.traces import read_sessions

    sessions = list(read_sessions(DEFAULT_TRACES))
    queues = [
        [(s, c) for c in s.calls if not roles or c.role in roles] for s in sessions if s.calls
    ]
    picked: list[dict[str, Any]] = []
    depth = 0
    while len(picked) < count and any(len(q) > depth for q in queues):
        for q in queues:
            if depth >= len(q) or len(picked) >= count:
                continue
            session, call = q[depth]
            msgs = [{"role": m.role, "content": m.content} for m in call.messages]
            ids = fit_prompt(tokenizer, msgs, max_prompt_tokens)
            if ids is None:
                continue
            picked.append(
                {
                    "session": session.session_id,
                    "agent": call.agent,
                    "role": call.role,
                    "ids": ids,
                }
            )
        depth += 1
    return picked


def fit_prompt(tokenizer: Any, msgs: list[dict[str, str]], limit: int) -> list[int] | None:
    """The chat-template ids of `msgs`, dropping the oldest messages after the system
    prompt until at most `limit` ids remain; None when even two messages do not fit."""
    keep = list(msgs)
    while True:
        text = tokenizer.apply_chat_template(keep, add_generation_prompt=True, tokenize=False)
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        if len(ids) <= limit:
            return ids
        if len(keep) <= 2:
            return None
        del keep[1]  # the oldest message after the system prompt


def wait_stats(path: str | os.PathLike[str], finished: int, timeout_s: float = 60.0) -> dict:
    """The proposer's counters once `requests_finished >= finished` (it writes the file
    when a request finishes, a step after vLLM returned its output)."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            last = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            last = {}
        if last.get("requests_finished", 0) >= finished:
            return last
        time.sleep(0.2)
    raise AssertionError(
        f"the proposer reported {last.get('requests_finished')} finished requests in "
        f"{timeout_s} s, expected {finished}: {last}"
    )


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where `a` and `b` differ (None when equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
