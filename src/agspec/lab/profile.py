"""Offline profiling of the per-agent cap C_a (paper §3.2).

Replays recorded calls with AgSpec drafting as far as the corpora allow (a fixed
`max_tokens` per step, no cap, no scale), and records at each retrieval step how many
retrieved tokens match the recorded continuation (`AcceptanceRecord`). The cap is the
last position k whose acceptance probability P(r ≥ k) exceeds p*, the break-even
probability of the cost model at that batch size.

    caps = profile_caps(sessions, tokenizer, cost_model=cm, batch_sizes=(1, 16))
    caps.save("caps.json")
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from agspec.drafter import VARIANTS, AgSpecServer
from agspec.drafter.protocol import greedy_commit
from agspec.policy.caps import AcceptanceRecord, ProfiledCap
from agspec.policy.costmodel import CostModel, break_even_accept_prob


def acceptance_records(
    sessions: Iterable[Any],
    tokenizer: Any,
    *,
    max_tokens: int = 64,
    progress: Any = None,
) -> dict[str, list[AcceptanceRecord]]:
    """Per agent, one record per retrieval step of a greedy replay of the sessions.

    Example: a call whose recorded output is "a b c d" and whose corpus offers "a b x"
    after the first step's match gives AcceptanceRecord(reusable_tokens=2,
    available_tokens=3).
    """
    from agspec.traces import render_call

    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    config = replace(
        VARIANTS["agspec-paper"],
        use_global=False,
        length_mode="static",
        static_length_tokens=max_tokens,
    )
    server = AgSpecServer(tokenizer=tokenizer, config=config, name="profile")
    out: dict[str, list[AcceptanceRecord]] = {}
    for s in sessions:
        fmt = s.calls[0].emission_format if s.calls else "none"
        sess = server.session(s.session_id, emission_format=fmt)
        for call in s.calls:
            prompt, output = render_call(call, tokenizer)
            for a in call.artifacts:
                if a.text:
                    sess.open_artifact(a.path, a.text)
            d = sess.call(call.agent, call.role, call.turn)
            d.begin(prompt)
            recs = out.setdefault(call.agent, [])
            pos = 0
            while pos < len(output):
                draft = d.propose(max_tokens)
                r, commit = greedy_commit(draft, output, pos)
                if draft:
                    recs.append(AcceptanceRecord(r, len(draft)))
                d.accept(commit)
                pos += len(commit)
            d.end()
        sess.end()
        if progress is not None:
            progress.update(1)
    return out


def profile_caps(
    sessions: Sequence[Any],
    tokenizer: Any,
    *,
    cost_model: CostModel,
    batch_sizes: Sequence[int] = (1, 16),
    model: str = "",
    max_tokens: int = 64,
    default_cap_tokens: int = 16,
    progress: Any = None,
) -> ProfiledCap:
    """Caps for every agent of `sessions` at each batch size (one replay for all)."""
    records = acceptance_records(sessions, tokenizer, max_tokens=max_tokens, progress=progress)
    caps = ProfiledCap(default_cap_tokens=default_cap_tokens)
    for b in batch_sizes:
        p_star = break_even_accept_prob(cost_model, b)
        caps.fit(records, p_star=p_star, model=model, batch_size=b, max_tokens=max_tokens)
    return caps
