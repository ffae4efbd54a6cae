"""Shared input checks for the importers: bytes -> text or JSON, with clear errors."""

from __future__ import annotations

import json
import os
from typing import Any

from agspec._text import find_lone_surrogate, surrogate_message
from agspec.traces.schema import TraceFormatError

# A real trace is at most tens of MB; refuse absurd inputs before parsing them.
MAX_TRACE_BYTES = 512 * 1024 * 1024


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    p = os.fspath(path)
    size = os.path.getsize(p)
    if size > MAX_TRACE_BYTES:
        raise TraceFormatError(f"{p}: {size} bytes is larger than the {MAX_TRACE_BYTES} limit")
    with open(p, "rb") as f:
        return f.read()


def decode_text(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"{name}: not valid UTF-8 (byte offset {exc.start})") from None


def load_json(data: bytes, name: str) -> Any:
    text = decode_text(data, name)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(
            f"{name}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise TraceFormatError(f"{name}: JSON nested too deeply") from None
    bad = find_lone_surrogate(obj)
    if bad is not None:  # the one rule for text from outside (agspec._text)
        raise TraceFormatError(f"{name}: {bad[0]}: {surrogate_message(bad[1])}")
    return obj


def need(d: Any, key: str, typ: type, where: str) -> Any:
    """`d[key]`, checked to be a `typ`; TraceFormatError naming `where.key` otherwise."""
    if not isinstance(d, dict):
        raise TraceFormatError(f"{where}: expected a JSON object, got {type(d).__name__}")
    if key not in d:
        raise TraceFormatError(f"{where}.{key}: missing field")
    v = d[key]
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise TraceFormatError(f"{where}.{key}: expected {typ.__name__}, got {type(v).__name__}")
    return v


def stem(path: str | os.PathLike[str], suffixes: tuple[str, ...]) -> str:
    """File name without the given suffixes: `stem("a/b.traj.json", (".traj.json",))` -> `"b"`."""
    name = os.path.basename(os.fspath(path))
    for suf in suffixes:
        if name.endswith(suf):
            return name[: -len(suf)]
    return name


def session_id_of(source: str, model: str, task: str) -> str:
    """`source/model/task`, or `source/task` when the importer does not know the model, so
    that sets of different models (two SWE-agent runs of one benchmark) never share ids.

    >>> session_id_of("swe-agent", "deepseek-coder-v2", "apache__dubbo-10638")
    'swe-agent/deepseek-coder-v2/apache__dubbo-10638'
    >>> session_id_of("chatdev", "unknown", "2048_THUNLP_20230822144615")
    'chatdev/2048_THUNLP_20230822144615'
    """
    if not model or model == "unknown":
        return f"{source}/{task}"
    return f"{source}/{model}/{task}"
