"""`agspec serve --record FILE.jsonl`: every served call as an AgSpec trace (format v1).

A session's calls are kept in memory while it is live and written as one trace line
when it ends: when it expires (TTL, or the least recently used past `--max-sessions`)
and, for every live session, when the server shuts down. The live statistics go to the
sidecar `FILE.live.jsonl` in the layout `agspec record` writes (per call: output ids, stop
reason, every step's `[drafted, accepted, committed]`, prefill and total ms), through the
same `agspec.traces.recorder.Recorder` (single appends with fsync; a cut last line is
repaired on the next start). A server killed with SIGKILL loses the sessions still live.

The trace format has three message roles: a `tool` message is written as `user`, and an
assistant message's tool calls as `<tool_call>` JSON after its text. A call's role is
inferred from its output with the trace importers' rule (`agspec.traces.roles`), read off
its single fenced bash block when it has one (mini-swe-agent's convention).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agspec.traces.recorder import Recorder
from agspec.traces.roles import infer_role
from agspec.traces.schema import Call, Message, Session

__all__ = ["ServeRecorder", "call_role"]

_BASH_BLOCK = re.compile(r"```(?:bash|sh)?\s*\n(.*?)\n```", re.S)


def call_role(output: str) -> str:
    blocks = _BASH_BLOCK.findall(output)
    return infer_role(blocks[0] if len(blocks) == 1 else output)


def trace_messages(messages: list[dict[str, Any]]) -> list[Message]:
    out = []
    for m in messages:
        role = m.get("role", "user")
        text = str(m.get("content") or "")
        if role == "assistant" and m.get("tool_calls"):
            calls = [
                json.dumps(
                    {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                    ensure_ascii=False,
                )
                for c in m["tool_calls"]
            ]
            text = "\n".join([text, *(f"<tool_call>\n{c}\n</tool_call>" for c in calls)]).strip()
        out.append(Message(role if role in ("system", "user", "assistant") else "user", text))
    return out


@dataclass
class _Pending:
    calls: list[Call] = field(default_factory=list)
    live: list[dict[str, Any]] = field(default_factory=list)


class ServeRecorder:
    def __init__(self, path: str | Path, *, model: str, settings: dict[str, Any]) -> None:
        self._rec = Recorder(path)
        self.path = self._rec.path
        self.live_path = self._rec.live_path
        self.model = model
        self.settings = settings
        self._pending: dict[str, _Pending] = {}
        self.sessions_written = 0

    def add(
        self,
        session_id: str,
        *,
        agent: str,
        turn: int,
        messages: list[dict[str, Any]],
        output: str,
        live: dict[str, Any],
    ) -> None:
        p = self._pending.setdefault(session_id, _Pending())
        p.calls.append(
            Call(
                agent=agent,
                role=call_role(output),
                turn=turn,
                messages=trace_messages(messages),
                output=output,
            )
        )
        p.live.append({"index": len(p.live), **live})

    def flush(self, session_id: str) -> None:
        p = self._pending.pop(session_id, None)
        if p is None or not p.calls:
            return
        sid = session_id
        k = 1
        while sid in self._rec.done:  # a session id reused across restarts
            k += 1
            sid = f"{session_id}#{k}"
        session = Session(
            session_id=sid, source="agspec-serve", model=self.model, task_id=session_id,
            calls=p.calls,
        )  # fmt: skip
        self._rec.write(session, {"status": "served", "settings": self.settings, "calls": p.live})
        self.sessions_written += 1

    def flush_all(self) -> None:
        for sid in list(self._pending):
            self.flush(sid)
