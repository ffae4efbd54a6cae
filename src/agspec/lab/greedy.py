"""A recorded session replayed through AgSpec with the greedy accept rule, call by call,
as a live loop drives a drafter: the accept length of every step.

The lab's simulator replays many sessions at once under a cost model; this is the plain
loop, for checking a replay against a live record (`agspec record`'s sidecar) step for
step. Each step proposes, commits what `greedy_commit` says a greedy verifier commits
(the accepted prefix plus the model's own next token, none past the end of the output),
and feeds that back.

>>> from agspec.traces.schema import Call, Message, Session
>>> text = "def add(a, b):\\n    return a + b\\n"
>>> call = Call("coder", "code", 0, [Message("user", text)], text, emission_format="none")
>>> session = Session("s", "test", "m", "t", [call])
>>> record = {"calls": [{"stopped_by": "length", "max_new_tokens": 16}]}
>>> replay_live_record(session, record, 8)  # the output repeats the prompt: copied
[[0, 1, 4, 4]]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agspec.drafter import AgSpecServer
from agspec.drafter.protocol import greedy_commit
from agspec.traces import render_call
from agspec.traces.schema import Session

__all__ = ["replay_live_record"]


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
