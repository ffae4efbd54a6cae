"""Import mini-swe-agent `.traj.json` files (`trajectory_format: "mini-swe-agent-1"`).

mini-swe-agent sends its whole linear history on every query, so call k received every
message before the k-th assistant message, unchanged. Each assistant message is one call;
its role comes from its single bash block (`agspec.traces.roles.infer_role`); an output
without exactly one bash block did not run and is role `other`. Emission format: `bash`.

Artifacts are reassembled from the observations of successful (`<returncode>0`) read
commands, optionally after `cd DIR &&`. When mini-swe-agent elided the middle of a long output
(`<output_head>` / `<output_tail>`), the head's whole lines are used (and, for numbered
output, the tail's whole lines too), and the file is never `complete`:
- `cat FILE` -> the whole file (`complete=True`);
- `nl -ba FILE`, `cat -n FILE` -> numbered lines, the whole file;
- `nl -ba FILE | sed -n 'A,Bp'` -> numbered lines A..B;
- `sed -n 'A,Bp' FILE` -> lines A.. (numbered by position);
- `head -n N FILE`, `head -N FILE` -> lines 1..
A command that writes (role `code`) marks every known file it names as rewritten: the next
view of that file starts afresh.

Example: `THOUGHT: look\\n\\n```bash\\nsed -n '10,11p' a.py\\n```` followed by
`<returncode>0</returncode>\\n<output>\\nx = 1\\ny = 2\\n</output>` gives the next call the
artifact `a.py` with text `x = 1\\ny = 2\\n` (`complete=False`).
"""

from __future__ import annotations

import os
import posixpath
import re
from typing import Any

from agspec.traces._util import load_json, need, read_bytes, session_id_of, stem
from agspec.traces.artifacts import ArtifactTracker
from agspec.traces.roles import infer_role
from agspec.traces.schema import Call, EmissionFormat, Message, Session, TraceFormatError

__all__ = ["import_mini_swe_agent", "parse_mini_swe_agent"]

SOURCE = "mini-swe-agent"
_BASH_BLOCK = re.compile(r"```bash\s*\n(.*?)\n```", re.S)
_RETURNCODE = re.compile(r"<returncode>(-?\d+)</returncode>\n")
_CD = re.compile(r"cd\s+(\S+)\s*&&\s*(.*)", re.S)
_PATH = r"""(?P<path>'[^']+'|"[^"]+"|[^\s|;&<>'"]+)"""
# Line numbers have at most 9 digits: a longer one is no real file's.
_RANGE = r"""(?P<q>['"]?)(?P<a>\d{1,9}),(?P<b>\d{1,9})p(?P=q)"""
_READS = [
    ("full", re.compile(rf"cat\s+{_PATH}")),
    ("numbered", re.compile(rf"(?:nl\s+-ba|cat\s+-n)\s+{_PATH}")),
    ("numbered", re.compile(rf"(?:nl\s+-ba|cat\s+-n)\s+{_PATH}\s*\|\s*sed\s+-n\s+{_RANGE}")),
    ("range", re.compile(rf"sed\s+-n\s+{_RANGE}\s+{_PATH}")),
    ("head", re.compile(rf"head\s+(?:-n\s*(?P<n>\d+)|-(?P<n2>\d+))\s+{_PATH}")),
]
_NUMBERED_LINE = re.compile(r"\s*(\d{1,9})\t(.*)")


def import_mini_swe_agent(path: str | os.PathLike[str]) -> Session:
    """Read one `.traj.json` file."""
    p = os.fspath(path)
    return parse_mini_swe_agent(read_bytes(p), p)


def parse_mini_swe_agent(data: bytes, name: str = "<traj.json>") -> Session:
    """Parse the bytes of a `.traj.json` file; `TraceFormatError` when it is not one."""
    doc = load_json(data, name)
    fmt = doc.get("trajectory_format") if isinstance(doc, dict) else None
    if fmt != "mini-swe-agent-1":
        raise TraceFormatError(f"{name}: trajectory_format is {fmt!r}, expected 'mini-swe-agent-1'")
    raw = need(doc, "messages", list, name)
    messages: list[Message] = []
    for i, m in enumerate(raw):
        where = f"{name}: messages[{i}]"
        role = need(m, "role", str, where)
        if role not in ("system", "user", "assistant"):
            raise TraceFormatError(f"{where}.role: {role!r} is not system, user or assistant")
        content = need(m, "content", str, where)
        messages.append(Message(role, content))

    tracker = ArtifactTracker()
    calls: list[Call] = []
    command: str | None = None  # the last call's command, if it ran
    for i, m in enumerate(messages):
        if m.role == "user" and command is not None:
            _feed(tracker, command, m.content)
            command = None
        if m.role != "assistant":
            continue
        blocks = _BASH_BLOCK.findall(m.content)
        role = infer_role(blocks[0]) if len(blocks) == 1 else "other"
        calls.append(
            Call(
                agent="agent",
                role=role,
                turn=len(calls),
                messages=messages[:i],
                output=m.content,
                artifacts=tracker.take(),
                emission_format=EmissionFormat.BASH.value,
            )
        )
        if len(blocks) == 1:
            command = blocks[0].strip()
            if role == "code":
                for path in tracker.known_paths():
                    if path in command or posixpath.basename(path) in command:
                        tracker.invalidate(path)

    task = doc.get("instance_id") if isinstance(doc.get("instance_id"), str) else None
    task = task or stem(name, (".traj.json", ".json"))
    model = _model_name(doc)
    return Session(
        session_id=session_id_of(SOURCE, model, task),
        source=SOURCE,
        model=model,
        task_id=task,
        calls=calls,
    )


def _model_name(doc: dict[str, Any]) -> str:
    info = doc.get("info")
    cfg = info.get("config") if isinstance(info, dict) else None
    model = cfg.get("model") if isinstance(cfg, dict) else None
    name = model.get("model_name") if isinstance(model, dict) else None
    return name if isinstance(name, str) and name else "unknown"


def _split_observation(obs: str) -> tuple[str, str, str | None] | None:
    """`(returncode, head, tail)` of an observation; `tail` is None when nothing was elided.

    Parsed with `str.find`, not a regex with several `.*`: linear on any input.
    """
    m = _RETURNCODE.match(obs)
    if m is None:
        return None
    rest = obs[m.end() :].rstrip()
    if rest.startswith("<output>\n") and rest.endswith("</output>"):
        return m.group(1), rest[len("<output>\n") : -len("</output>")], None
    h0 = rest.find("<output_head>\n")
    h1 = rest.find("\n</output_head>", h0)
    t0 = rest.find("<output_tail>\n", h1)
    if min(h0, h1, t0) < 0 or not rest.endswith("\n</output_tail>"):
        return None
    head = rest[h0 + len("<output_head>\n") : h1]
    tail = rest[t0 + len("<output_tail>\n") : -len("\n</output_tail>")]
    # Keep whole lines only: the cut ends the head and starts the tail mid-line.
    head = head.rsplit("\n", 1)[0] + "\n" if "\n" in head else ""
    tail = tail.split("\n", 1)[1] if "\n" in tail else ""
    return m.group(1), head, tail


def _feed(tracker: ArtifactTracker, command: str, observation: str) -> None:
    parts = _split_observation(observation)
    if parts is None:
        return  # not an observation of a command that ran
    rc, head, tail = parts
    if rc != "0":
        return
    cwd = ""
    cd = _CD.fullmatch(command)
    if cd:
        cwd, command = cd.group(1).strip("'\""), cd.group(2).strip()
    for kind, rx in _READS:
        mt = rx.fullmatch(command)
        if mt is None:
            continue
        path = posixpath.normpath(posixpath.join(cwd, mt.group("path").strip("'\"")))
        if kind == "numbered":
            lines: dict[int, str] = {}
            for part in (head, tail or ""):
                body = part[:-1] if part.endswith("\n") else part
                for ln in body.split("\n") if body else []:
                    nm = _NUMBERED_LINE.fullmatch(ln)
                    if nm is None:
                        return  # not what nl prints: some other output, leave it
                    lines[int(nm.group(1))] = nm.group(2)
            whole = "a" not in mt.groupdict() or mt.group("a") is None
            if whole and tail is None:
                # The whole file, numbered: its line count is known.
                tracker.show_numbered(path, lines, total_lines=len(lines))
            elif lines:
                tracker.show_numbered(path, lines)
        elif kind == "full" and tail is None:
            tracker.show_full(path, head)
        else:
            first = int(mt.group("a")) if kind == "range" else 1
            body = head[:-1] if head.endswith("\n") else head
            if body:
                tracker.show_lines(path, first, body.split("\n"))
        return
