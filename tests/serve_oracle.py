"""The serve tests' shared oracles: real agent prompts from the bundled traces, and greedy
equality with a reference up to near-ties (the one-token logit gap at the divergence,
computed in-process by llama.cpp's one-token decoding)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TRACES = Path(__file__).resolve().parents[1] / "src" / "agspec" / "data" / "traces"


def agent_messages(count: int) -> list[list[dict[str, str]]]:
    """Real agent requests from the bundled traces (Qwen2.5-Coder's own sessions), cut
    short so that a CPU test stays quick: the system prompt and the last user message."""
    from agspec.traces.io import read_sessions

    out = []
    for session in read_sessions(TRACES / "default.jsonl.gz"):
        for call in session.calls:
            system = next((m.content for m in call.messages if m.role == "system"), "")
            user = [m.content for m in call.messages if m.role == "user"][-1]
            out.append([
                {"role": "system", "content": system[:160]},
                {"role": "user", "content": user[-240:]},
            ])  # fmt: skip
    step = max(1, len(out) // count)
    return out[::step][:count]


def same_or_near_tie(
    llm: Any, prompt: list[int], reference: list[int], got: list[int], *,
    flips: list[float], limit: float,
) -> bool:  # fmt: skip
    """True if equal; False if they part at a near-tie (its gap appended to `flips`);
    fails when they part where the two tokens' logits are `limit` or more apart."""
    from agspec.adapters.llama_cpp import logit_gap

    if got == reference:
        return True
    p = next((i for i, (x, y) in enumerate(zip(reference, got)) if x != y), None)
    if p is None:  # one is a prefix of the other: a stop where the other went on
        p = min(len(reference), len(got))
        assert p < max(len(reference), len(got))
        a = reference[p] if p < len(reference) else llm.token_eos()
        b = got[p] if p < len(got) else llm.token_eos()
    else:
        a, b = reference[p], got[p]
    llm.reset()
    gap = logit_gap(llm, prompt, reference[:p], a, b)
    flips.append(gap)
    assert gap < limit, f"outputs part at token {p}: {a} vs {b}, logit gap {gap:.3f}"
    return False
