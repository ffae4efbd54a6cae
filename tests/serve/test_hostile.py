"""`agspec serve` against hostile and sloppy clients, on a real server process.

One server (SmolLM2-135M, AgSpec drafting) takes, in turn: lone surrogates in every text
field, session ids that cannot go into a header (NUL, newline, 100 KB, emoji), the
poisoned-conversation case (a bad request, then clean requests that share its opening
message and send no id), and a fixed-seed fuzz of bodies to both endpoints. The oracle is
the API contract: every answer is a 2xx, or a 4xx whose body is an OpenAI error naming the
field; response headers are short ASCII; and afterwards the server is healthy and answers
a clean request exactly as it answered it before the fuzz.

Needs the `serve` extra, llama-cpp-python and the SmolLM2 GGUF; skips otherwise.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from guards import require_model, require_server

pytestmark = [pytest.mark.server, pytest.mark.slow]
httpx = require_server().httpx  # skips the module with the reason when one is missing

from agspec.serve.launch import ServerProcess  # noqa: E402

MODEL = "smollm2-135m-instruct"
COST_PROFILE = (
    Path(__file__).resolve().parents[2]
    / "src/agspec/data/costmodels/epyc2t-llamacpp-qwen2.5-coder-0.5b-ctx1024.json"
)
NUM_FUZZ = 160
SAFE_HEADER = re.compile(r"[\x20-\x7e]{1,200}")


@pytest.fixture(scope="module")
def server():
    require_model(MODEL)
    srv = ServerProcess([
        "--model", MODEL, "--threads", "1", "--n-ctx", "2048", "--max-queue", "64",
        "--drafter", "agspec", "--cost-profile", str(COST_PROFILE), "--fixed-cost-profile",
    ]).start()  # fmt: skip
    try:
        yield srv
    finally:
        code = srv.stop()
        assert code == 0, f"exit code {code}\n{srv.log()[-3000:]}"


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120.0) as c:
        yield c


def post(http, path: str, body: Any, headers: dict[str, Any] | None = None) -> Any:
    """POST raw JSON text (ensure_ascii: a lone surrogate travels as its \\u escape)."""
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    h = {"content-type": "application/json", **(headers or {})}
    return http.post(path, content=data, headers=h)


def check_contract(r: Any) -> None:
    """2xx, or a 4xx with an OpenAI error body; never a 5xx; headers fit any client."""
    assert r.status_code < 500, f"{r.status_code}: {r.text[:500]}"
    for name in ("x-agspec-session", "x-agspec-agent"):
        if name in r.headers:
            assert SAFE_HEADER.fullmatch(r.headers[name]), (name, r.headers[name][:80])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert err["type"] == "invalid_request_error" or r.status_code in (404, 413)


def chat(content: str = "Say hi.", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4,
            "temperature": 0, **extra}  # fmt: skip


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/chat/completions", chat("a\ud800b"), "messages[0].content"),
        ("/v1/chat/completions", chat(stop=["\udfff"]), "stop[0]"),
        ("/v1/chat/completions", chat(user="\ud800"), "user"),
        ("/v1/completions", {"prompt": "x\udc00", "max_tokens": 2}, "prompt"),
    ],
)  # fmt: skip
def test_a_lone_surrogate_gets_a_400_naming_the_field(http, path, body, param) -> None:
    r = post(http, path, body)
    check_contract(r)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert "surrogate" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "where,value",
    [("user", "\u0000"), ("user", "a\nb"), ("user", "x" * 100_000),
     ("metadata.session_id", "\r\nSet-Cookie: a=b")],
    ids=["nul", "newline", "100k", "header-injection"],
)  # fmt: skip
def test_an_id_that_cannot_be_a_header_gets_a_400(http, where, value) -> None:
    body = chat() | ({"user": value} if where == "user" else {"metadata": {"session_id": value}})
    r = post(http, "/v1/chat/completions", body)
    check_contract(r)
    assert r.status_code == 400 and r.json()["error"]["param"] == where


def test_a_printable_id_is_mapped_to_a_safe_one_that_stays_stable(http) -> None:
    first = post(http, "/v1/chat/completions", chat(user="Ana García 😀 日本"))
    check_contract(first)
    assert first.status_code == 200
    sid = first.headers["x-agspec-session"]
    assert sid.startswith("h-") and first.json()["agspec"]["session_id"] == sid
    again = post(http, "/v1/chat/completions", chat("Again.", user="Ana García 😀 日本"))
    assert again.headers["x-agspec-session"] == sid
    # The header form too: a latin-1 header value is mapped the same way.
    r = post(http, "/v1/chat/completions", chat(), {"X-AgSpec-Agent": "agent é".encode("latin-1")})
    check_contract(r)
    assert r.status_code == 200 and r.headers["x-agspec-agent"].startswith("h-")


def test_a_poisoned_request_cannot_break_the_conversation_that_follows(http) -> None:
    opening = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "Fix the bug in utils.py."},
    ]
    bad = post(
        http,
        "/v1/chat/completions",
        {"messages": opening, "max_tokens": 4, "temperature": 0, "user": "\u0000"},
    )
    assert bad.status_code == 400  # fmt: skip
    msgs = list(opening)
    sessions = set()
    for turn in range(4):
        r = post(http, "/v1/chat/completions",
                 {"messages": msgs, "max_tokens": 6, "temperature": 0})  # fmt: skip
        check_contract(r)
        assert r.status_code == 200, r.text[:300]
        sessions.add(r.headers["x-agspec-session"])
        answer = r.json()["choices"][0]["message"]["content"]
        msgs = msgs + [{"role": "assistant", "content": answer},
                       {"role": "user", "content": f"Output of step {turn}: ok"}]  # fmt: skip
    assert len(sessions) == 1  # one conversation, recognised across its requests


# --- the fuzz -------------------------------------------------------------------------

HOSTILE_VALUES: list[Any] = [
    None, True, -1, 0, 2**63, 1e308, -0.5, "", "\u0000", "a\ud800", "\udfff\ud800",
    "x" * 5000, "😀" * 50, [], [1, 2], [[]], {}, {"a": {"b": {"c": []}}}, [None],
    [{"type": "image_url"}], [{"type": "text"}], [{"type": "text", "text": 5}],
]  # fmt: skip
FIELDS = [
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "top_k", "seed", "stop", "stream", "stream_options", "n", "user", "metadata",
    "tools", "tool_choice", "logprobs", "logit_bias", "response_format", "echo", "suffix",
    "presence_penalty", "messages[0]", "messages[0].role", "messages[0].content",
    "messages[0].name", "messages[0].tool_calls", "metadata.session_id",
]  # fmt: skip


def _mutate(rng: random.Random, body: dict[str, Any]) -> None:
    field = rng.choice(FIELDS)
    value = rng.choice(HOSTILE_VALUES)
    if field.startswith("messages[0]") and isinstance(body.get("messages"), list):
        if field == "messages[0]":
            body["messages"][0] = value
        elif isinstance(body["messages"][0], dict):
            body["messages"][0][field.split(".", 1)[1]] = value
    elif field == "metadata.session_id":
        body["metadata"] = {"session_id": value}
    elif rng.random() < 0.15:
        body.pop(field, None)
    else:
        body[field] = value


def _usable_count(v: Any, *, missing_ok: bool) -> bool:
    """Whether the server would take `v` as a token count above 4 (or as no limit)."""
    if v is None:
        return missing_ok
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return (isinstance(v, int) or v.is_integer()) and v > 4


def fuzz_cases(seed: int, count: int) -> list[tuple[str, Any]]:
    """Bodies for both endpoints: valid ones with 1-3 hostile fields, and raw bytes that
    are not JSON, not UTF-8, deeply nested or not an object."""
    rng = random.Random(seed)
    nested = b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    raw: list[Any] = [b"", b"{", b"\xff\xfe{}", b"[]", b"null", b"42", b'"text"',
                      b"[" * 100_000 + b"]" * 100_000, nested]  # fmt: skip
    cases: list[tuple[str, Any]] = []
    for i in range(count):
        path = "/v1/chat/completions" if i % 2 == 0 else "/v1/completions"
        if i % 10 == 0:
            cases.append((path, raw[(i // 10) % len(raw)]))
            continue
        body: dict[str, Any] = (
            chat(f"Case {i}.") if path.endswith("chat/completions")
            else {"prompt": f"Case {i}:", "max_tokens": 4, "temperature": 0}
        )  # fmt: skip
        for _ in range(rng.randint(1, 3)):
            _mutate(rng, body)
        # A valid request must stay short (the fuzz is about input, not throughput): a
        # missing or null max_tokens, or one the server takes as a large count (an int or
        # an integral float such as 1e308), becomes 4; otherwise a valid request decodes
        # to the end of the context and the verdict would hang on the machine's speed.
        if _usable_count(body.get("max_tokens"), missing_ok=True):
            body["max_tokens"] = 4
        if _usable_count(body.get("max_completion_tokens"), missing_ok=False):
            body["max_completion_tokens"] = 4
        cases.append((path, body))
    return cases


def test_fuzzed_bodies_get_2xx_or_a_named_4xx_and_the_server_stays_healthy(http) -> None:
    clean = chat("Write the word ok.")
    before = post(http, "/v1/chat/completions", clean).json()["choices"][0]["message"]
    statuses: dict[int, int] = {}
    for path, body in fuzz_cases(seed=20261202, count=NUM_FUZZ):
        r = post(http, path, body)
        check_contract(r)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        if r.status_code == 400:
            err = r.json()["error"]
            # A refusal names the argument it refuses (or the body as a whole).
            assert err["param"] is None or err["message"].startswith(err["param"]), err
    assert statuses.get(400, 0) > NUM_FUZZ // 3 and statuses.get(200, 0) > 0, statuses
    assert http.get("/health").json()["status"] == "ok"
    after = post(http, "/v1/chat/completions", clean).json()["choices"][0]["message"]
    assert after == before


def test_every_request_gets_one_access_log_line(server, http) -> None:
    tag = "log-probe-7f3a"
    ok = post(http, "/v1/chat/completions", chat(f"Echo {tag}.", user=tag))
    bad = post(http, "/v1/chat/completions", chat(user="a\nb"))
    assert ok.status_code == 200 and bad.status_code == 400
    usage = ok.json()["usage"]
    lines = server.log().splitlines()
    mine = [ln for ln in lines if f"session={tag} " in ln]
    assert len(mine) == 1, mine
    assert "POST /v1/chat/completions 200 " in mine[0]
    assert f"prompt={usage['prompt_tokens']} completion={usage['completion_tokens']} " in mine[0]
    assert any("POST /v1/chat/completions 400 param=user" in ln for ln in lines)
