"""Request validation and error bodies of the OpenAI-compatible API.

Requests are read as plain JSON and checked field by field, so that every bad input gets
a 4xx whose message names the field, in the OpenAI shape:

    {"error": {"message": "max_tokens: must be >= 1, got 0", "type": "invalid_request_error",
               "param": "max_tokens", "code": null}}

`parse_chat(body)` and `parse_completion(body)` return frozen dataclasses; they raise
`APIError`. Fields the OpenAI API has but this server cannot honour (`n > 1`, `logprobs`,
non-zero penalties, a JSON response format, `tool_choice: "required"`) are refused with a
400, never silently ignored; fields it does not know are ignored (clients send many).

>>> parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).sampling.temperature
1.0
>>> try:
...     parse_chat({"model": "m", "messages": [], "n": 2})
... except APIError as e:
...     print(e.status, e.param)
400 messages
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from agspec._text import find_lone_surrogate, surrogate_message
from agspec.drafter.session_inference import client_id
from agspec.traces.schema import json_type_name

__all__ = [
    "APIError",
    "ChatRequest",
    "CompletionRequest",
    "SamplingParams",
    "parse_chat",
    "parse_completion",
    "check_text",
    "safe_id",
    "MESSAGE_ROLES",
]

MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
MAX_STOP_SEQUENCES = 16


class APIError(Exception):
    """An error the client gets as an OpenAI-shaped body with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type: str = "invalid_request_error",  # noqa: A002 - the OpenAI field name
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def _bad(param: str, message: str, code: str | None = None) -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code=code)


_type_name = json_type_name


def _opt_int(body: Mapping[str, Any], key: str, *, lo: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        # 3.0 is an integer in JSON's eyes for some clients; accept exact integral floats.
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        else:
            raise _bad(key, f"expected an integer, got {_type_name(v)}")
    if lo is not None and v < lo:
        raise _bad(key, f"must be >= {lo}, got {v}")
    return int(v)


def _opt_num(
    body: Mapping[str, Any], key: str, *, lo: float, hi: float, lo_open: bool = False
) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _bad(key, f"expected a number, got {_type_name(v)}")
    if v < lo or v > hi or (lo_open and v == lo):
        bracket = "(" if lo_open else "["
        raise _bad(key, f"must be in {bracket}{lo:g}, {hi:g}], got {v:g}")
    return float(v)


def _opt_bool(body: Mapping[str, Any], key: str) -> bool | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, bool):
        raise _bad(key, f"expected a boolean, got {_type_name(v)}")
    return v


def _opt_str(body: Mapping[str, Any], key: str) -> str | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise _bad(key, f"expected a string, got {_type_name(v)}")
    return v


@dataclass(frozen=True)
class SamplingParams:
    """What decoding the request asks for. `temperature == 0` is greedy decoding."""

    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass(frozen=True)
class ChatRequest:
    model: str | None
    messages: list[dict[str, Any]]  # normalised: role, content (str), and tool fields
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    tools: list[dict[str, Any]] | None
    tool_choice: str  # "auto" or "none"
    session: str | None  # `user` or `metadata.session_id`
    raw_messages: list[dict[str, Any]] = field(default_factory=list)  # as sent (for sessions)


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompt: str | list[int]
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    echo: bool
    session: str | None


def check_text(body: Any) -> None:
    """Refuse a body with a lone surrogate in any string (`agspec._text`): a 400 naming
    the field, before anything tokenizes, hashes or echoes it."""
    bad = find_lone_surrogate(body)
    if bad is not None:
        where, pos = bad
        raise APIError(400, f"{where}: {surrogate_message(pos)}", param=where)


def _need_object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise APIError(
            400, f"the request body must be a JSON object, got {_type_name(body)}", param=None
        )
    return body


def _unsupported(body: Mapping[str, Any]) -> None:
    """Refuse what we cannot honour; accept the neutral values clients send by default."""
    n = _opt_int(body, "n", lo=1)
    if n is not None and n != 1:
        raise _bad("n", f"only n = 1 is supported, got {n}")
    best_of = _opt_int(body, "best_of", lo=1)
    if best_of is not None and best_of != 1:
        raise _bad("best_of", f"only best_of = 1 is supported, got {best_of}")
    for key in ("presence_penalty", "frequency_penalty"):
        v = _opt_num(body, key, lo=-2.0, hi=2.0)
        if v not in (None, 0.0):
            raise _bad(key, f"only 0 is supported, got {v:g}")
    rp = _opt_num(body, "repeat_penalty", lo=0.0, hi=10.0)
    if rp not in (None, 1.0):
        raise _bad("repeat_penalty", f"only 1.0 is supported, got {rp:g}")
    logprobs = body.get("logprobs")
    if logprobs not in (None, False, 0):
        raise _bad("logprobs", "log probabilities are not supported")
    if body.get("top_logprobs") not in (None, 0):
        raise _bad("top_logprobs", "log probabilities are not supported")
    bias = body.get("logit_bias")
    if bias is not None and (not isinstance(bias, dict) or bias):
        raise _bad("logit_bias", "logit bias is not supported")
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
            raise _bad("response_format", "expected an object with a string `type`")
        if rf["type"] != "text":
            raise _bad("response_format", f"only type 'text' is supported, got {rf['type']!r}")
    if body.get("suffix") not in (None, ""):
        raise _bad("suffix", "suffix (fill-in-the-middle) is not supported")


def _sampling(body: Mapping[str, Any], *, chat: bool) -> SamplingParams:
    max_tokens = _opt_int(body, "max_tokens", lo=1)
    if chat:
        mct = _opt_int(body, "max_completion_tokens", lo=1)
        if mct is not None:
            max_tokens = mct if max_tokens is None else min(max_tokens, mct)
    temperature = _opt_num(body, "temperature", lo=0.0, hi=2.0)
    top_p = _opt_num(body, "top_p", lo=0.0, hi=1.0, lo_open=True)
    top_k = _opt_int(body, "top_k", lo=0)
    seed = _opt_int(body, "seed")
    stop_raw = body.get("stop")
    if stop_raw is None:
        stop: tuple[str, ...] = ()
    elif isinstance(stop_raw, str):
        stop = (stop_raw,) if stop_raw else ()
    elif isinstance(stop_raw, list):
        if len(stop_raw) > MAX_STOP_SEQUENCES:
            raise _bad("stop", f"at most {MAX_STOP_SEQUENCES} sequences, got {len(stop_raw)}")
        for i, s in enumerate(stop_raw):
            if not isinstance(s, str):
                raise _bad(f"stop[{i}]", f"expected a string, got {_type_name(s)}")
        stop = tuple(s for s in stop_raw if s)
    else:
        raise _bad("stop", f"expected a string or an array of strings, got {_type_name(stop_raw)}")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if temperature is None else temperature,  # the OpenAI default
        top_p=1.0 if top_p is None else top_p,
        top_k=0 if top_k is None else top_k,
        seed=seed,
        stop=stop,
    )


def _stream_options(body: Mapping[str, Any], stream: bool) -> bool:
    so = body.get("stream_options")
    if so is None:
        return False
    if not isinstance(so, dict):
        raise _bad("stream_options", f"expected an object, got {_type_name(so)}")
    if not stream:
        raise _bad("stream_options", "only allowed when stream is true")
    v = so.get("include_usage")
    if v is not None and not isinstance(v, bool):
        raise _bad("stream_options.include_usage", f"expected a boolean, got {_type_name(v)}")
    return bool(v)


def safe_id(raw: Any, param: str) -> str:
    """A client's session or agent id as the server uses it (`client_id`); a 400 naming
    `param` when it is refused."""
    try:
        return client_id(raw, param)
    except ValueError as exc:
        raise APIError(400, str(exc), param=param) from None


def _explicit_session(body: Mapping[str, Any]) -> str | None:
    meta = body.get("metadata")
    if meta is not None:
        if not isinstance(meta, dict):
            raise _bad("metadata", f"expected an object, got {_type_name(meta)}")
        sid = meta.get("session_id")
        if sid is not None:
            return safe_id(sid, "metadata.session_id")
    user = _opt_str(body, "user")
    return safe_id(user, "user") if user else None


def _content_text(content: Any, where: str, *, required: bool) -> str:
    if content is None:
        if required:
            raise _bad(where, "is required for this role")
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            pw = f"{where}[{j}]"
            if isinstance(part, str):
                parts.append(part)
                continue
            if not isinstance(part, dict):
                raise _bad(pw, f"expected an object, got {_type_name(part)}")
            kind = part.get("type")
            if kind != "text":
                raise _bad(f"{pw}.type", f"only 'text' parts are supported, got {kind!r}")
            text = part.get("text")
            if not isinstance(text, str):
                raise _bad(f"{pw}.text", f"expected a string, got {_type_name(text)}")
            parts.append(text)
        return "".join(parts)
    raise _bad(where, f"expected a string or an array of parts, got {_type_name(content)}")


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise _bad(where, f"expected an array, got {_type_name(calls)}")
    out = []
    for j, call in enumerate(calls):
        cw = f"{where}[{j}]"
        if not isinstance(call, dict):
            raise _bad(cw, f"expected an object, got {_type_name(call)}")
        fn = call.get("function")
        if not isinstance(fn, dict):
            raise _bad(f"{cw}.function", f"expected an object, got {_type_name(fn)}")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"{cw}.function.name", "expected a non-empty string")
        args = fn.get("arguments", "")
        if not isinstance(args, (str, dict)):
            raise _bad(f"{cw}.function.arguments", f"expected a string, got {_type_name(args)}")
        out.append(
            {
                "id": str(call.get("id") or f"call_{j}"),
                "type": "function",
                "function": {"name": name, "arguments": args},
            }
        )
    return out


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise _bad("messages", f"expected an array of messages, got {_type_name(raw)}")
    if not raw:
        raise _bad("messages", "must hold at least one message")
    out = []
    for i, m in enumerate(raw):
        mw = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(mw, f"expected an object, got {_type_name(m)}")
        role = m.get("role")
        if not isinstance(role, str):
            raise _bad(f"{mw}.role", f"expected a string, got {_type_name(role)}")
        if role not in MESSAGE_ROLES:
            raise _bad(f"{mw}.role", f"unknown role {role!r}; one of {', '.join(MESSAGE_ROLES)}")
        has_calls = role == "assistant" and m.get("tool_calls") not in (None, [])
        text = _content_text(
            m.get("content"), f"{mw}.content", required=role != "assistant" or not has_calls
        )
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": text}
        name = m.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise _bad(f"{mw}.name", f"expected a string, got {_type_name(name)}")
            msg["name"] = name
        if has_calls:
            msg["tool_calls"] = _tool_calls(m["tool_calls"], f"{mw}.tool_calls")
        if role == "tool":
            tcid = m.get("tool_call_id")
            if tcid is not None and not isinstance(tcid, str):
                raise _bad(f"{mw}.tool_call_id", f"expected a string, got {_type_name(tcid)}")
            if tcid:
                msg["tool_call_id"] = tcid
        out.append(msg)
    return out


def _tools(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]] | None, str]:
    raw = body.get("tools")
    choice_raw = body.get("tool_choice")
    if raw is None or raw == []:
        if choice_raw not in (None, "none", "auto"):
            raise _bad("tool_choice", "needs `tools`")
        return None, "none"
    if not isinstance(raw, list):
        raise _bad("tools", f"expected an array, got {_type_name(raw)}")
    tools = []
    for i, t in enumerate(raw):
        tw = f"tools[{i}]"
        if not isinstance(t, dict):
            raise _bad(tw, f"expected an object, got {_type_name(t)}")
        if t.get("type", "function") != "function":
            raise _bad(f"{tw}.type", f"only 'function' tools are supported, got {t.get('type')!r}")
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise _bad(f"{tw}.function", f"expected an object, got {_type_name(fn)}")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"{tw}.function.name", "expected a non-empty string")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise _bad(f"{tw}.function.parameters", f"expected an object, got {_type_name(params)}")
        tools.append({"type": "function", "function": dict(fn)})
    if choice_raw is None:
        choice = "auto"
    elif choice_raw in ("auto", "none"):
        choice = str(choice_raw)
    elif choice_raw == "required" or isinstance(choice_raw, dict):
        raise _bad(
            "tool_choice",
            "only 'auto' and 'none' are supported (forcing a tool call needs constrained "
            "decoding, which this server does not do)",
        )
    else:
        raise _bad("tool_choice", f"expected 'auto' or 'none', got {choice_raw!r}")
    return tools, choice


def parse_chat(body: Any) -> ChatRequest:
    """Validate a `/v1/chat/completions` body (see the module docstring)."""
    body = _need_object(body)
    check_text(body)
    model = _opt_str(body, "model")
    messages = _messages(body.get("messages"))
    _unsupported(body)
    stream = bool(_opt_bool(body, "stream"))
    tools, choice = _tools(body)
    return ChatRequest(
        model=model,
        messages=messages,
        sampling=_sampling(body, chat=True),
        stream=stream,
        include_usage=_stream_options(body, stream),
        tools=tools,
        tool_choice=choice,
        session=_explicit_session(body),
        raw_messages=list(body["messages"]),
    )


def parse_completion(body: Any) -> CompletionRequest:
    """Validate a `/v1/completions` body: `prompt` is a string or one list of token ids."""
    body = _need_object(body)
    check_text(body)
    model = _opt_str(body, "model")
    raw = body.get("prompt")
    prompt: str | list[int]
    if isinstance(raw, str):
        prompt = raw
    elif isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
        prompt = raw[0]
    elif isinstance(raw, list) and raw and all(isinstance(t, str) for t in raw):
        raise _bad("prompt", f"only one prompt per request is supported, got {len(raw)}")
    elif (
        isinstance(raw, list)
        and raw
        and all(isinstance(t, int) and not isinstance(t, bool) for t in raw)
    ):
        prompt = [int(t) for t in raw]
    elif raw is None:
        raise _bad("prompt", "is required")
    else:
        raise _bad("prompt", "expected a string or an array of token ids")
    _unsupported(body)
    stream = bool(_opt_bool(body, "stream"))
    echo = bool(_opt_bool(body, "echo"))
    sampling = _sampling(body, chat=False)
    if sampling.max_tokens is None:
        # The OpenAI default for /v1/completions.
        sampling = replace(sampling, max_tokens=16)
    return CompletionRequest(
        model=model,
        prompt=prompt,
        sampling=sampling,
        stream=stream,
        include_usage=_stream_options(body, stream),
        echo=echo,
        session=_explicit_session(body),
    )
