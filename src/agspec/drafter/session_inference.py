"""Session inference: which session a request continues, from the request alone.

Coding agents talk to an OpenAI-compatible endpoint and send no session id. A
conversation is still easy to recognise: each request of it starts with the messages of
the request before it, usually followed by that request's answer. `SessionResolver`
remembers the *boundaries* of earlier requests (their full message list, and the list
plus the answer) and maps a new request to the session whose boundary is the longest
prefix of it. The same rule works on token ids, for engines that only see the rendered
prompt (the vLLM proposer); both front ends share this one implementation.

Only boundaries are stored, never every prefix, so two tasks that share a system prompt
(every mini-swe-agent run does) stay apart: a prefix counts only when it is a whole
earlier request.

>>> r = SessionResolver()
>>> first = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "bug 1"}]
>>> res = r.resolve_messages(first)
>>> res.is_new, res.num_known_units
(True, 0)
>>> r.record_messages(res, first, {"role": "assistant", "content": "ls"})
>>> second = first + [{"role": "assistant", "content": "ls"}, {"role": "user", "content": "a.py"}]
>>> res2 = r.resolve_messages(second)
>>> res2.session_id == res.session_id, res2.is_new, res2.num_known_units
(True, False, 3)

Cost per request: one pass over its units to hash every prefix (vectorised with numpy:
a polynomial hash modulo 2**64 under two odd bases, 128 bits in all), then dictionary
look-ups at the boundary lengths known to the resolver, longest first, at most one per
unit. Hashes are not a security boundary: a client that wants to join another client's
session can simply send its session id; use explicit ids where that matters.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
import threading
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Resolution",
    "SessionResolver",
    "agent_name",
    "client_id",
    "MAX_CLIENT_ID_CHARS",
    "message_text",
    "message_unit",
]

# Two odd bases (invertible modulo 2**64) and an offset so that token 0 still mixes in.
_BASES = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F))
_OFFSET = np.uint64(0x165667B19E3779F9)
_MASK = (1 << 64) - 1

Kind = str  # "m" (messages) or "t" (tokens): separate key spaces


@dataclass(frozen=True)
class Resolution:
    """The answer of `SessionResolver.resolve_*` for one request.

    `num_known_units` counts the leading units (messages, or prompt tokens) of the request
    that the session has already seen; only the units after them are new text.
    """

    session_id: str
    is_new: bool
    num_known_units: int
    explicit: bool
    kind: Kind


def message_text(content: Any) -> str:
    """The text of an OpenAI message `content`: a string, None, or a list of parts.

    >>> message_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    'ab'
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


def message_unit(message: Mapping[str, Any]) -> int:
    """A 64-bit hash of what a message says: role, text, name and tool calls.

    Fields a client may re-serialise differently when it sends an answer back (tool-call
    ids, `type`, surrounding whitespace of the text) are left out, so the answer a server
    gave and the message the client returns hash alike.
    """
    calls = []
    for call in message.get("tool_calls") or ():
        if isinstance(call, Mapping):
            inner = call.get("function")
            fn: Mapping[str, Any] = inner if isinstance(inner, Mapping) else call
            calls.append([str(fn.get("name", "")), str(fn.get("arguments", ""))])
    canon = [
        str(message.get("role", "")),
        message_text(message.get("content")).strip(),
        str(message.get("name") or ""),
        calls,
    ]
    data = json.dumps(canon, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


MAX_CLIENT_ID_CHARS = 256
# Ids in this form reach headers, log lines, metric labels and file names as they are.
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}")


def client_id(raw: object, what: str = "session id") -> str:
    """The id AgSpec uses for a session (or agent) id a client sent: the id itself when it
    is safe everywhere (up to 128 of ``A-Z a-z 0-9 . _ : @ + = -``, starting with a letter
    or digit), else ``h-`` and 24 hex digits of its hash, so any printable id the client
    keeps sending maps to one session. Refused with `ValueError` naming the rule: a
    non-string, an empty id, one longer than `MAX_CLIENT_ID_CHARS`, a control character
    (NUL, newline, ...) or a lone surrogate.

    >>> client_id("swe-task-12")
    'swe-task-12'
    >>> client_id("Ana García")
    'h-16cb5d78204f31c6256b960c'
    >>> client_id("a\\nb")
    Traceback (most recent call last):
    ...
    ValueError: session id: must not hold control characters (U+000A at character 1)
    """
    if not isinstance(raw, str):
        raise ValueError(f"{what}: expected a string, got {type(raw).__name__}")
    if not raw:
        raise ValueError(f"{what}: must be a non-empty string")
    if len(raw) > MAX_CLIENT_ID_CHARS:
        raise ValueError(f"{what}: at most {MAX_CLIENT_ID_CHARS} characters, got {len(raw)}")
    if _SAFE_ID.fullmatch(raw):
        return raw
    for i, ch in enumerate(raw):
        if unicodedata.category(ch) in ("Cc", "Cs"):
            kind = "a lone surrogate" if unicodedata.category(ch) == "Cs" else "control characters"
            raise ValueError(f"{what}: must not hold {kind} (U+{ord(ch):04X} at character {i})")
    return "h-" + hashlib.blake2b(raw.encode("utf-8"), digest_size=12).hexdigest()


def agent_name(system_prompt: str | None) -> str:
    """A stable agent name from the system prompt: ``agent-<8 hex>`` (whitespace-normalised).

    >>> agent_name("You are  a coder.\\n") == agent_name("You are a coder.")
    True
    >>> agent_name(None)
    'agent-default'
    """
    if not system_prompt or not system_prompt.strip():
        return "agent-default"
    norm = " ".join(system_prompt.split()).encode("utf-8", "replace")
    return "agent-" + hashlib.blake2b(norm, digest_size=4).hexdigest()


class _Powers:
    """Powers of a base and of its inverse modulo 2**64, grown on demand."""

    def __init__(self, base: np.uint64) -> None:
        self.base = base
        self.inv = np.uint64(pow(int(base), -1, 1 << 64))
        self.pow = np.ones(1, dtype=np.uint64)
        self.inv_pow = np.ones(1, dtype=np.uint64)

    def ensure(self, n: int) -> None:
        if len(self.pow) >= n:
            return
        size = max(n, 2 * len(self.pow))
        with np.errstate(over="ignore"):
            self.pow = np.cumprod(np.full(size, self.base, dtype=np.uint64), dtype=np.uint64)
            self.pow = np.concatenate([np.ones(1, dtype=np.uint64), self.pow[:-1]])
            inv = np.cumprod(np.full(size, self.inv, dtype=np.uint64), dtype=np.uint64)
            self.inv_pow = np.concatenate([np.ones(1, dtype=np.uint64), inv[:-1]])


def _prefix_hashes(units: np.ndarray, powers: _Powers) -> np.ndarray:
    """h[L-1] = sum_{j<L} (u_j + c) * B**(L-1-j) mod 2**64, for every prefix length L >= 1."""
    n = len(units)
    powers.ensure(n)
    with np.errstate(over="ignore"):
        terms = (units + _OFFSET) * powers.inv_pow[:n]
        return np.cumsum(terms, dtype=np.uint64) * powers.pow[:n]


@dataclass
class _Session:
    keys: set[tuple[Kind, int, int, int]]
    last_used: float


class SessionResolver:
    """Maps requests to sessions by the longest earlier request boundary they start with.

    Thread-safe: every method takes one lock. Sessions idle for longer than `ttl_s`, and the
    least recently used ones past `max_sessions`, are dropped; `on_expire(session_id)` is
    then called, outside the lock.
    """

    def __init__(
        self,
        *,
        ttl_s: float = 3600.0,
        max_sessions: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(ttl_s, (int, float)) or not ttl_s > 0 or ttl_s != ttl_s:
            raise ValueError(f"ttl_s must be a positive number of seconds, got {ttl_s!r}")
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int):
            raise TypeError(f"max_sessions must be an int, got {type(max_sessions).__name__}")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.ttl_s = float(ttl_s)
        self.max_sessions = max_sessions
        self.on_expire: Callable[[str], None] | None = None
        self._clock = clock
        self._lock = threading.Lock()
        self._powers = (_Powers(_BASES[0]), _Powers(_BASES[1]))
        # (kind, length, h1, h2) -> session id; the latest session recorded at that boundary.
        self._owner: dict[tuple[Kind, int, int, int], str] = {}
        # kind -> sorted boundary lengths known, with their reference counts.
        self._lengths: dict[Kind, list[int]] = {"m": [], "t": []}
        self._length_refs: dict[tuple[Kind, int], int] = {}
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._counter = 0

    # --- public API -------------------------------------------------------------------

    def resolve_messages(
        self, messages: Sequence[Mapping[str, Any]], *, explicit: str | None = None
    ) -> Resolution:
        """The session an OpenAI chat request continues (see the module docstring)."""
        return self._resolve("m", self._message_units(messages), explicit)

    def record_messages(
        self,
        resolution: Resolution,
        messages: Sequence[Mapping[str, Any]],
        answer: Mapping[str, Any] | None = None,
    ) -> None:
        """Remember this request (and its answer) as boundaries of `resolution`'s session."""
        units = self._message_units(messages)
        ends = [len(units)]
        if answer is not None:
            units = np.concatenate([units, self._message_units([answer])])
            ends.append(len(units))
        self._record("m", resolution.session_id, units, ends)

    def resolve_tokens(
        self, prompt_ids: Sequence[int] | np.ndarray, *, explicit: str | None = None
    ) -> Resolution:
        """The session a token-level request continues (its rendered prompt's ids)."""
        return self._resolve("t", self._token_units(prompt_ids), explicit)

    def record_tokens(
        self,
        resolution: Resolution,
        prompt_ids: Sequence[int] | np.ndarray,
        output_ids: Sequence[int] | np.ndarray = (),
    ) -> None:
        """Remember prompt and prompt + output as boundaries of `resolution`'s session."""
        prompt = self._token_units(prompt_ids)
        output = self._token_units(output_ids)
        ends = [len(prompt)] + ([len(prompt) + len(output)] if len(output) else [])
        self._record("t", resolution.session_id, np.concatenate([prompt, output]), ends)

    def forget(self, session_id: str) -> None:
        """Drop every boundary of a session (no-op for an unknown id)."""
        with self._lock:
            self._drop(session_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        with self._lock:
            return session_id in self._sessions

    def num_boundaries(self) -> int:
        """Boundaries stored over all sessions (a measure of the resolver's memory)."""
        with self._lock:
            return len(self._owner)

    # --- internals --------------------------------------------------------------------

    @staticmethod
    def _message_units(messages: Sequence[Mapping[str, Any]]) -> np.ndarray:
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise TypeError("messages must be a list of message objects")
        units = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping):
                raise TypeError(f"messages[{i}] must be an object, got {type(m).__name__}")
            units.append(message_unit(m))
        return np.asarray(units, dtype=np.uint64)

    @staticmethod
    def _token_units(ids: Sequence[int] | np.ndarray) -> np.ndarray:
        arr = np.asarray(ids)
        if arr.ndim != 1:
            raise ValueError(f"token ids must be one-dimensional, got shape {arr.shape}")
        if arr.size == 0:
            return np.zeros(0, dtype=np.uint64)
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"token ids must be integers, got dtype {arr.dtype}")
        if arr.min() < 0:
            raise ValueError("token ids must be non-negative")
        return arr.astype(np.uint64, copy=False)

    def _hashes(self, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _prefix_hashes(units, self._powers[0]), _prefix_hashes(units, self._powers[1])

    def _resolve(self, kind: Kind, units: np.ndarray, explicit: str | None) -> Resolution:
        if explicit is not None and (
            not isinstance(explicit, str) or _SAFE_ID.fullmatch(explicit) is None
        ):
            # Only ids in the safe form may name a session: they reach headers and logs.
            raise ValueError(
                "an explicit session id must be a non-empty string in the form that "
                f"client_id() gives, got {explicit!r:.80}"
            )
        expired: list[str] = []
        with self._lock:
            h1, h2 = self._hashes(units)
            now = self._clock()
            expired = self._expire(now)
            hit_session, hit_len = self._longest(kind, units, h1, h2, explicit)
            if explicit is not None:
                sid = explicit
                known = hit_len if hit_session == explicit else 0
                is_new = explicit not in self._sessions
            elif hit_session is not None:
                sid, known, is_new = hit_session, hit_len, False
            else:
                self._counter += 1
                tail = (int(h1[-1]) ^ self._counter) if len(units) else self._counter
                sid = f"auto-{tail & _MASK:016x}"
                while sid in self._sessions:  # only after 2**64 requests or a crafted clash
                    self._counter += 1
                    sid = f"auto-{(tail ^ self._counter) & _MASK:016x}"
                known, is_new = 0, True
            entry = self._sessions.get(sid)
            if entry is None:
                entry = self._sessions[sid] = _Session(keys=set(), last_used=now)
            entry.last_used = now
            self._sessions.move_to_end(sid)
            expired += self._trim()
        self._notify(expired)
        return Resolution(sid, is_new, known, explicit is not None, kind)

    def _longest(
        self,
        kind: Kind,
        units: np.ndarray,
        h1: np.ndarray,
        h2: np.ndarray,
        explicit: str | None,
    ) -> tuple[str | None, int]:
        n = len(units)
        lengths = self._lengths[kind]
        stop = bisect.bisect_right(lengths, n)
        # At most one look-up per unit: the known lengths <= n, or every length if fewer.
        candidates = reversed(lengths[:stop]) if stop <= n else range(n, 0, -1)
        for length in candidates:
            owner = self._owner.get((kind, length, int(h1[length - 1]), int(h2[length - 1])))
            if owner is not None and (explicit is None or owner == explicit):
                return owner, length
        return None, 0

    def _record(self, kind: Kind, sid: str, units: np.ndarray, ends: list[int]) -> None:
        expired: list[str] = []
        with self._lock:
            h1, h2 = self._hashes(units)
            now = self._clock()
            entry = self._sessions.get(sid)
            if entry is None:
                entry = self._sessions[sid] = _Session(keys=set(), last_used=now)
            entry.last_used = now
            self._sessions.move_to_end(sid)
            for end in ends:
                if end <= 0:
                    continue
                key = (kind, end, int(h1[end - 1]), int(h2[end - 1]))
                previous = self._owner.get(key)
                if previous == sid:
                    continue
                if previous is not None:
                    self._sessions[previous].keys.discard(key)
                else:
                    self._add_length(kind, end)
                self._owner[key] = sid
                entry.keys.add(key)
            expired = self._expire(now) + self._trim()
        self._notify(expired)

    def _add_length(self, kind: Kind, length: int) -> None:
        refs = self._length_refs.get((kind, length), 0)
        if refs == 0:
            bisect.insort(self._lengths[kind], length)
        self._length_refs[(kind, length)] = refs + 1

    def _drop_length(self, kind: Kind, length: int) -> None:
        refs = self._length_refs.pop((kind, length)) - 1
        if refs > 0:
            self._length_refs[(kind, length)] = refs
        else:
            lengths = self._lengths[kind]
            del lengths[bisect.bisect_left(lengths, length)]

    def _drop(self, sid: str) -> bool:
        entry = self._sessions.pop(sid, None)
        if entry is None:
            return False
        for key in entry.keys:
            if self._owner.get(key) == sid:
                del self._owner[key]
                self._drop_length(key[0], key[1])
        return True

    def _expire(self, now: float) -> list[str]:
        gone = []
        while self._sessions:
            sid, entry = next(iter(self._sessions.items()))
            if now - entry.last_used <= self.ttl_s:
                break
            self._drop(sid)
            gone.append(sid)
        return gone

    def _trim(self) -> list[str]:
        gone = []
        while len(self._sessions) > self.max_sessions:
            sid = next(iter(self._sessions))
            self._drop(sid)
            gone.append(sid)
        return gone

    def _notify(self, expired: list[str]) -> None:
        if self.on_expire is not None:
            for sid in expired:
                self.on_expire(sid)
