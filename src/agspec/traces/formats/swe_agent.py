"""Import SWE-agent 0.x `.traj` files: one session per file, one call per model response.

What each call received is rebuilt the way SWE-agent 0.x built it, not copied from the raw
log: before every query the agent ran its history processor over the history so far. The
usual setting (`Last5Observations`) keeps the system prompt, the demonstrations, every
assistant message, the first observation (the issue) and the last 5 observations in full,
and replaces each older observation by `Old output omitted (N lines)` (N = the number of
lines it had). `keep_last_observations=5` is the default here; `None` keeps everything
(SWE-agent's `DefaultHistoryProcessor`). The `.traj` file does not store which one ran.

Scaffold-written entries that are not model output (`Exit due to cost limit`, action
`exit_cost` and other `exit_*`) are not calls. Every call's role comes from its action
(`agspec.traces.roles.infer_role`), its emission format is `line_edit` (`edit N:M`).

Artifacts: each `[File: /path (N lines total)]` window in an observation, with its
`NNN:` prefixes stripped, merged by line number; the hypothetical window of a rejected edit
("This is how your edit would have looked if applied") is ignored; a window shown right
after the session wrote the file starts the file afresh.

Example (a two-step session): history = [system, demo, issue, A1 `find_file Foo.java`,
observation, A2 `open Foo.java`] gives calls with roles [localize, localize]; call 1
received [system, demo, issue, A1, observation].
"""

from __future__ import annotations

import os
import re
from typing import Any

from agspec.traces._util import load_json, need, read_bytes, session_id_of, stem
from agspec.traces.artifacts import ArtifactTracker
from agspec.traces.roles import infer_role
from agspec.traces.schema import Call, EmissionFormat, Message, Session, TraceFormatError

__all__ = ["import_swe_agent", "parse_swe_agent", "shorten_history"]

SOURCE = "swe-agent"
# Line numbers have at most 9 digits: a longer one is not SWE-agent's (nor a real file's).
_WINDOW_HEADER = re.compile(r"^\[File: (.+?) \((\d{1,9}) lines total\)\]$", re.M)
_NUMBERED = re.compile(r"(\d{1,9}):(.*)")
_MORE_LINES = re.compile(r"\(\d+ more lines (above|below)\)")
_HYPOTHETICAL = "This is how your edit would have looked if applied"
_ORIGINAL = "This is the original code before your edit"
_ACTION_BLOCK = re.compile(r"```[^\n]*\n(.*?)```", re.S)


def import_swe_agent(
    path: str | os.PathLike[str], *, keep_last_observations: int | None = 5
) -> Session:
    """Read one `.traj` file. The model name is the file's folder name (`.traj` has none)."""
    p = os.fspath(path)
    model = os.path.basename(os.path.dirname(os.path.abspath(p))) or "unknown"
    return parse_swe_agent(
        read_bytes(p), p, keep_last_observations=keep_last_observations, model=model
    )


def parse_swe_agent(
    data: bytes,
    name: str = "<traj>",
    *,
    keep_last_observations: int | None = 5,
    model: str = "unknown",
) -> Session:
    """Parse the bytes of a `.traj` file; `TraceFormatError` when it is not one."""
    if keep_last_observations is not None and keep_last_observations <= 0:
        raise ValueError(
            f"keep_last_observations must be >= 1 or None, got {keep_last_observations}"
        )
    doc = load_json(data, name)
    history = need(doc, "history", list, name)
    entries: list[dict[str, Any]] = []
    for i, h in enumerate(history):
        where = f"{name}: history[{i}]"
        role = need(h, "role", str, where)
        if role not in ("system", "user", "assistant"):
            raise TraceFormatError(f"{where}.role: {role!r} is not system, user or assistant")
        need(h, "content", str, where)
        if "agent" in h and not isinstance(h["agent"], str):
            raise TraceFormatError(
                f"{where}.agent: expected a string (the agent's name), "
                f"got {type(h['agent']).__name__}"
            )
        entries.append(h)
    agents = {e.get("agent", "primary") for e in entries}
    agent = "primary" if "primary" in agents or not agents else sorted(map(str, agents))[0]
    # SWE-agent queries each agent with its own local history.
    entries = [e for e in entries if e.get("agent", "primary") == agent]

    tracker = ArtifactTracker()
    calls: list[Call] = []
    last_role = ""
    seen_issue = False
    for i, e in enumerate(entries):
        if e["role"] == "user" and not e.get("is_demo", False):
            if seen_issue:  # the first non-demo user message is the issue, not an observation
                _feed_windows(tracker, e["content"], wrote=last_role == "code")
            seen_issue = True
        if e["role"] != "assistant":
            continue
        action = _action_of(e)
        if action.split()[:1] and action.split()[0].startswith("exit_"):
            continue  # written by the scaffold, not by the model
        last_role = infer_role(action)
        messages = shorten_history(entries[:i], keep_last_observations)
        calls.append(
            Call(
                agent=agent,
                role=last_role,
                turn=len(calls),
                messages=[Message(m["role"], m["content"]) for m in messages],
                output=e["content"],
                artifacts=tracker.take(),
                emission_format=EmissionFormat.LINE_EDIT.value,
            )
        )
    task = stem(name, (".traj",))
    return Session(
        session_id=session_id_of(SOURCE, model, task),
        source=SOURCE,
        model=model,
        task_id=task,
        calls=calls,
    )


def shorten_history(
    history: list[dict[str, Any]], keep_last_observations: int | None = 5
) -> list[dict[str, Any]]:
    """SWE-agent 0.x `last_n_history`: what the model received.

    >>> h = [{"role": "user", "content": f"o{i}\\nx"} for i in range(8)]
    >>> [m["content"] for m in shorten_history(h, 5)][:3]
    ['o0\\nx', 'Old output omitted (2 lines)', 'Old output omitted (2 lines)']
    """
    if keep_last_observations is None:
        return history
    n = keep_last_observations
    num_user = sum(1 for e in history if e["role"] == "user" and not e.get("is_demo", False))
    out = []
    idx = 0
    for e in history:
        if e["role"] != "user" or e.get("is_demo", False):
            out.append(e)
            continue
        idx += 1
        if idx == 1 or idx > num_user - n:
            out.append(e)
        else:
            out.append(
                {**e, "content": f"Old output omitted ({len(e['content'].splitlines())} lines)"}
            )
    return out


def _action_of(e: dict[str, Any]) -> str:
    action = e.get("action")
    if isinstance(action, str):
        return action
    blocks = _ACTION_BLOCK.findall(e["content"])
    return blocks[-1] if blocks else ""


def _feed_windows(tracker: ArtifactTracker, obs: str, *, wrote: bool) -> None:
    for m in _WINDOW_HEADER.finditer(obs):
        before = obs[: m.start()]
        if before.rfind(_HYPOTHETICAL) > before.rfind(_ORIGINAL):
            continue  # a rejected edit's preview: never the file's content
        path, total = m.group(1), int(m.group(2))
        lines: dict[int, str] = {}
        for ln in obs[m.end() + 1 :].split("\n"):
            nm = _NUMBERED.fullmatch(ln)
            if nm:
                lines[int(nm.group(1))] = nm.group(2)
            elif not (_MORE_LINES.fullmatch(ln) and not lines):
                break
        if wrote:
            tracker.invalidate(path)
        if lines:
            tracker.show_numbered(path, lines, total)
