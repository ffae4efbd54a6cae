"""The AgSpec trace format (version 1): sessions of model calls, as dataclasses.

A `Session` is an ordered list of `Call`s. Each call records what the model received
(`messages`), what it wrote (`output`), the artifacts that became visible to it
(`artifacts`), who made it (`agent`, `role`) and how the scaffold asks it to emit code
(`emission_format`). The JSON form is one object per session (see `docs/traces.md`);
`Session.from_dict` validates it and raises `TraceFormatError` naming the field.

>>> call = Call(agent="primary", role="localize", turn=0,
...             messages=[Message("user", "find foo")], output="find_file foo.py")
>>> s = Session(session_id="s1", source="swe-agent", model="m", task_id="t", calls=[call])
>>> Session.from_dict(s.to_dict()) == s
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from agspec._text import lone_surrogate, surrogate_message

__all__ = [
    "FORMAT_VERSION",
    "Role",
    "EmissionFormat",
    "Message",
    "Artifact",
    "Call",
    "Session",
    "TraceFormatError",
    "UnsupportedLayoutError",
]

# Version of the JSON layout written by `Session.to_dict`. Readers accept exactly this one.
FORMAT_VERSION = 1


class TraceFormatError(ValueError):
    """A trace (ours or a third-party one) does not have the expected shape.

    The message says where (file, line, field when known) and what was expected.
    """


class HugeInt:
    """An integer in a trace line too long for any field (more than 18 digits), kept as
    its text by the reader so that the schema check names the field it was in."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class UnsupportedLayoutError(TraceFormatError):
    """A recognisable trace in a layout the importer does not read (e.g. an older ChatDev)."""


class Role(str, Enum):
    """What a call is doing, in the paper's terms."""

    LOCALIZE = "localize"
    CODE = "code"
    EXECUTE = "execute"
    REVIEW = "review"
    PLAN = "plan"
    OTHER = "other"


class EmissionFormat(str, Enum):
    """How the scaffold asks the model to write code."""

    UNIFIED_DIFF = "unified_diff"
    WHOLE_FILE = "whole_file"
    WHOLE_FILE_JSON = "whole_file_json"
    SEARCH_REPLACE = "search_replace"
    LINE_EDIT = "line_edit"
    BASH = "bash"
    NONE = "none"


_ROLES = frozenset(r.value for r in Role)
_FORMATS = frozenset(f.value for f in EmissionFormat)
_MESSAGE_ROLES = frozenset({"system", "user", "assistant"})


@dataclass(frozen=True)
class Message:
    """One chat message the model received: `Message("user", "ls")`."""

    role: str  # system | user | assistant
    content: str


@dataclass(frozen=True)
class Artifact:
    """A file the session showed, by path.

    `complete` is True when `text` is the whole file (ChatDev `Codes:`, `cat FILE`) and
    False when it was reassembled from the parts the session showed (SWE-agent windows,
    `sed -n`); missing parts are simply absent from `text`.
    """

    path: str
    text: str
    complete: bool


@dataclass
class Call:
    """One model call.

    `artifacts` are the files that became visible (new, or updated) before this call's
    output was written: the replay lab calls `open_artifact` for each before `begin`.
    An artifact is recorded at the first call that could see it; a later call carries it
    again only when its text changed (an update), with the full reassembled text.
    """

    agent: str
    role: str
    turn: int
    messages: list[Message]
    output: str
    artifacts: list[Artifact] = field(default_factory=list)
    emission_format: str = EmissionFormat.NONE.value
    phase: str = ""  # the scaffold's phase or step name, "" when it has none

    def to_dict(self, reuse_messages: int = 0) -> dict[str, Any]:
        """JSON form; the first `reuse_messages` messages are left out (see `Session`)."""
        return {
            "agent": self.agent,
            "role": self.role,
            "turn": self.turn,
            "phase": self.phase,
            "emission_format": self.emission_format,
            "reuse_messages": reuse_messages,
            "messages": [
                {"role": m.role, "content": m.content} for m in self.messages[reuse_messages:]
            ],
            "output": self.output,
            "artifacts": [
                {"path": a.path, "text": a.text, "complete": a.complete} for a in self.artifacts
            ],
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "call", previous: list[Message] | None = None) -> Call:
        """Parse and validate; `previous` is the prior call's messages (for `reuse_messages`)."""
        _need_dict(d, where)
        agent = _need(d, "agent", str, where)
        role = _need(d, "role", str, where)
        if role not in _ROLES:
            raise TraceFormatError(f"{where}.role: {role!r} is not one of {sorted(_ROLES)}")
        turn = _need(d, "turn", int, where)
        if turn < 0:
            raise TraceFormatError(f"{where}.turn: must be >= 0, got {turn}")
        fmt = _need(d, "emission_format", str, where)
        if fmt not in _FORMATS:
            raise TraceFormatError(
                f"{where}.emission_format: {fmt!r} is not one of {sorted(_FORMATS)}"
            )
        phase = _need(d, "phase", str, where) if "phase" in d else ""
        reuse = _need(d, "reuse_messages", int, where) if "reuse_messages" in d else 0
        num_prev = len(previous) if previous is not None else 0
        if not 0 <= reuse <= num_prev:
            raise TraceFormatError(
                f"{where}.reuse_messages: {reuse} is outside 0..{num_prev} "
                "(the previous call's message count)"
            )
        messages = list(previous[:reuse]) if previous is not None and reuse else []
        for i, m in enumerate(_need(d, "messages", list, where), start=reuse):
            mw = f"{where}.messages[{i}]"
            _need_dict(m, mw)
            mrole = _need(m, "role", str, mw)
            if mrole not in _MESSAGE_ROLES:
                raise TraceFormatError(
                    f"{mw}.role: {mrole!r} is not one of {sorted(_MESSAGE_ROLES)}"
                )
            messages.append(Message(mrole, _need(m, "content", str, mw)))
        output = _need(d, "output", str, where)
        artifacts = []
        for i, a in enumerate(_need(d, "artifacts", list, where)):
            aw = f"{where}.artifacts[{i}]"
            _need_dict(a, aw)
            path = _need(a, "path", str, aw)
            if not path:
                raise TraceFormatError(f"{aw}.path: empty; an artifact is a file by its path")
            text = _need(a, "text", str, aw)
            nul = text.find("\x00")
            if nul >= 0:
                raise TraceFormatError(
                    f"{aw}.text: NUL character at offset {nul}: artifacts are text files"
                )
            artifacts.append(Artifact(path, text, _need(a, "complete", bool, aw)))
        return cls(agent, role, turn, messages, output, artifacts, fmt, phase)


@dataclass
class Session:
    """One recorded agent session: source, model, task and its calls in order."""

    session_id: str
    source: str  # swe-agent | mini-swe-agent | chatdev | ...
    model: str
    task_id: str
    calls: list[Call] = field(default_factory=list)
    format_version: int = FORMAT_VERSION

    @property
    def emission_format(self) -> str:
        """The scaffold's code-emission format: the first call format other than `none`.

        This is what `DrafterServer.session(..., emission_format=...)` takes.
        """
        for c in self.calls:
            if c.emission_format != EmissionFormat.NONE.value:
                return c.emission_format
        return EmissionFormat.NONE.value

    def to_dict(self) -> dict[str, Any]:
        """JSON form. A call's messages that equal the previous call's first messages are
        written once: `reuse_messages: k` says "my first k messages are the previous call's
        first k" (agents resend a growing history; this keeps files linear in size)."""
        calls = []
        prev: list[Message] = []
        for c in self.calls:
            k = 0
            for a, b in zip(prev, c.messages):
                if a != b:
                    break
                k += 1
            calls.append(c.to_dict(reuse_messages=k))
            prev = c.messages
        return {
            "format_version": self.format_version,
            "session_id": self.session_id,
            "source": self.source,
            "model": self.model,
            "task_id": self.task_id,
            "calls": calls,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "session") -> Session:
        _need_dict(d, where)
        version = _need(d, "format_version", int, where)
        if version != FORMAT_VERSION:
            raise TraceFormatError(
                f"{where}.format_version: {version} is not supported (expected {FORMAT_VERSION})"
            )
        calls: list[Call] = []
        for i, c in enumerate(_need(d, "calls", list, where)):
            calls.append(
                Call.from_dict(c, f"{where}.calls[{i}]", calls[-1].messages if calls else [])
            )
        session_id = _need(d, "session_id", str, where)
        if not session_id:
            raise TraceFormatError(f"{where}.session_id: empty; a session needs an id")
        return cls(
            session_id=session_id,
            source=_need(d, "source", str, where),
            model=_need(d, "model", str, where),
            task_id=_need(d, "task_id", str, where),
            calls=calls,
            format_version=version,
        )


def _need_dict(d: Any, where: str) -> None:
    if not isinstance(d, dict):
        raise TraceFormatError(f"{where}: expected a JSON object, got {_json_type(d)}")


def _need(d: dict[str, Any], key: str, typ: type, where: str) -> Any:
    if key not in d:
        raise TraceFormatError(f"{where}.{key}: missing field")
    v = d[key]
    # bool is an int in Python; JSON true is not a turn number.
    ok = isinstance(v, typ) and not (typ is int and isinstance(v, bool))
    if not ok:
        raise TraceFormatError(
            f"{where}.{key}: expected {_TYPE_NAMES.get(typ, typ.__name__)}, got {_json_type(v)}"
        )
    if typ is str:
        pos = lone_surrogate(v)
        if pos is not None:  # the one rule for text from outside (agspec._text)
            raise TraceFormatError(f"{where}.{key}: {surrogate_message(pos)}")
    return v


_TYPE_NAMES = {str: "string", int: "integer", bool: "boolean", list: "array", dict: "object"}


def _json_type(v: Any) -> str:
    if isinstance(v, HugeInt):
        return f"an integer of {len(v.text.lstrip('-'))} digits (too large)"
    return json_type_name(v)


def json_type_name(v: Any) -> str:
    """The JSON name of a parsed value's type, for error messages ("integer", "array"...)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__
