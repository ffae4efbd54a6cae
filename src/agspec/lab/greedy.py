"""The plain greedy replay loop: a drafter stepped through a recorded output, one request
at a time. Each step proposes, commits what `greedy_commit` says a greedy verifier commits
(the accepted prefix plus the model's own next token, none past the end of the output),
and feeds that back.

The lab's simulator replays many sessions at once under a cost model; this is the loop
the benchmarks time (`greedy_replay`: one call, its steps counted and optionally timed)
and the one that checks a replay against a live record (`replay_live_record`: a session
against `agspec record`'s sidecar, step for step).

>>> from agspec.baselines.pld import PromptLookupDrafter
>>> d = PromptLookupDrafter()
>>> d.begin([1, 2, 3, 4, 9, 1, 2])
>>> stats = greedy_replay(d, [3, 4, 5], 8)  # drafts [3, 4, 9, 1, 2]: 2 accepted, then 5
>>> stats.steps, stats.accepted_tokens, stats.drafted_tokens
(1, 2, 5)

>>> from agspec.traces.schema import Call, Message, Session
>>> text = "def add(a, b):\\n    return a + b\\n"
>>> call = Call("coder", "code", 0, [Message("user", text)], text, emission_format="none")
>>> session = Session("s", "test", "m", "t", [call])
>>> record = {"calls": [{"stopped_by": "length", "max_new_tokens": 16}]}
>>> replay_live_record(session, record, 8)  # the output repeats the prompt: copied
[[0, 1, 4, 4]]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agspec.drafter import AgSpecServer
from agspec.drafter.protocol import CallDrafter, greedy_commit
from agspec.traces import render_call
from agspec.traces.schema import Session

__all__ = ["GreedyStats", "greedy_replay", "replay_live_record"]


@dataclass
class GreedyStats:
    """What `greedy_replay` counted (summed over the calls it was given)."""

    steps: int = 0
    accepted_tokens: int = 0  # accept length summed (the bonus tokens excluded)
    drafted_tokens: int = 0
    output_tokens: int = 0
    # With a clock: the time in propose and in accept, and each step's propose + accept,
    # in the clock's unit.
    propose_time: float = 0
    accept_time: float = 0
    step_times: list[float] = field(default_factory=list)


def greedy_replay(
    drafter: CallDrafter,
    output_ids: Sequence[int],
    max_draft_tokens: int,
    stats: GreedyStats | None = None,
    *,
    clock: Callable[[], float] | None = None,
) -> GreedyStats:
    """Steps a begun `drafter` through `output_ids` (it does not end it): at every step
    `propose(max_draft_tokens)`, then `accept` of what `greedy_commit` commits. Counts
    into `stats` (a new one by default) and returns it; with `clock` (e.g.
    `time.perf_counter_ns`), also times each step's propose and accept (not the commit
    rule between them)."""
    stats = GreedyStats() if stats is None else stats
    pos, end = 0, len(output_ids)
    while pos < end:
        if clock is None:
            draft = drafter.propose(max_draft_tokens)
            accepted, committed = greedy_commit(draft, output_ids, pos)
            drafter.accept(committed)
        else:
            t0 = clock()
            draft = drafter.propose(max_draft_tokens)
            t1 = clock()
            accepted, committed = greedy_commit(draft, output_ids, pos)
            t2 = clock()
            drafter.accept(committed)
            t3 = clock()
            stats.propose_time += t1 - t0
            stats.accept_time += t3 - t2
            stats.step_times.append((t1 - t0) + (t3 - t2))
        pos += len(committed)
        stats.steps += 1
        stats.accepted_tokens += accepted
        stats.drafted_tokens += len(draft)
    stats.output_tokens += end
    return stats


def replay_live_record(
    session: Session,
    live: Mapping[str, Any],
    budget: int,
    *,
    variant: str = "agspec-paper",
    like_lab: bool = False,
    emission: str | None = None,
) -> list[list[int]]:
    """Per call of `session`, the accept length of each step of AgSpec (`variant`, a
    fresh server per session, artifacts opened before each call).

    `live` is the session's sidecar record (`{"calls": [{"stopped_by", "max_new_tokens"},
    ...]}`). By default the loop is the live one: the output ends with the end token when
    the call stopped at EOS, and a step drafts at most `min(budget, max_new_tokens -
    produced - 1)` tokens. `like_lab=True` replays as the replay lab does: no EOS, and
    `budget` at every step. `emission` overrides the session's emission format.
    """
    from agspec.tokenizers import get_tokenizer

    server = AgSpecServer.from_variant(variant, tokenizer=get_tokenizer("qwen2.5"))
    dsession = server.session(
        session.session_id, emission_format=emission or session.emission_format
    )
    out: list[list[int]] = []
    default_max = live.get("config", {}).get("max_new_tokens", 384)
    for call, rec in zip(session.calls, live["calls"]):
        for a in call.artifacts:
            dsession.open_artifact(a.path, a.text)
        drafter = dsession.call(call.agent, call.role, call.turn)
        eos = rec["stopped_by"] == "eos" and not like_lab
        prompt_ids, target = render_call(call, end_token=eos)
        max_new = rec.get("max_new_tokens", default_max)
        drafter.begin(prompt_ids)
        produced = 0
        accepts = []
        while produced < len(target):
            want = budget if like_lab else min(budget, max_new - produced - 1)
            draft = drafter.propose(want)[:want] if want > 0 else []
            accepted, committed = greedy_commit(draft, target, produced)
            accepts.append(accepted)
            produced += len(committed)
            drafter.accept(committed)
        drafter.end()
        out.append(accepts)
    dsession.end()
    return out
