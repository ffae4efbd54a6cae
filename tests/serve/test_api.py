"""`agspec serve` through the real `openai` client, against real server processes.

Two servers start once for the module, on free ports, with SmolLM2-135M: one drafting
with AgSpec (`--drafter agspec-paper`), one plain (`--drafter none`). The oracle for AgSpec's
greedy output is the plain server, token for token; where llama.cpp's batched kernels
flip a near-tie the outputs may part at one position, which is accepted only when the
one-token logits of the two candidates there are within `NEAR_TIE_LOGITS` (computed
in-process, as tests/adapters/test_llama_cpp.py does), and counted in the printed report.
The plain server's answers are themselves checked against llama-cpp-python's own
`create_chat_completion` (same GGUF chat template, greedy, no repeat penalty).

Needs the `serve` extra, `openai`, llama-cpp-python and the SmolLM2 GGUF; skips otherwise.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from guards import require_model, require_server, smollm2_llm

pytestmark = [pytest.mark.server, pytest.mark.slow]
_clients = require_server()  # skips the module with the reason when one is missing
openai, httpx, llama_cpp = _clients.openai, _clients.httpx, _clients.llama_cpp

from serve_oracle import agent_messages  # noqa: E402
from serve_oracle import same_or_near_tie as _same_or_near_tie  # noqa: E402

from agspec.serve.launch import ServerProcess  # noqa: E402

MODEL = "smollm2-135m-instruct"
NEAR_TIE_LOGITS = 0.5  # as the adapter's live tests: SmolLM2 Q4_1 flips at gaps up to ~0.2
NUM_PROMPTS = 20
MAX_TOKENS = 16
COST_PROFILE = (
    Path(__file__).resolve().parents[2]
    / "src/agspec/data/costmodels/epyc2t-llamacpp-qwen2.5-coder-0.5b-ctx1024.json"
)
IDS = {"X-AgSpec-Return-Ids": "1"}


@pytest.fixture(scope="module")
def model_path() -> Path:
    return require_model(MODEL)


def _start(args: list[str]) -> ServerProcess:
    base = ["--model", MODEL, "--threads", "1", "--n-ctx", "2048", "--max-queue", "64"]
    return ServerProcess(base + args).start()


@pytest.fixture(scope="module")
def servers(model_path):
    # The shipped CPU profile stands in for a measured one (start-up measurement and its
    # cache are tested in test_serve_lifecycle.py), kept fixed: corrected online from this
    # machine's timings, whether drafting pays would depend on how busy the machine is.
    spec = _start(
        ["--drafter", "agspec", "--cost-profile", str(COST_PROFILE), "--fixed-cost-profile"]
    )
    try:
        plain = _start(["--drafter", "none"])
    except Exception:
        spec.stop()
        raise
    yield spec, plain
    codes = (spec.stop(), plain.stop())
    assert codes == (0, 0), f"exit codes {codes}\n{spec.log()[-2000:]}\n{plain.log()[-2000:]}"


@pytest.fixture(scope="module")
def llm(model_path):
    return smollm2_llm(2048)


def client(srv: ServerProcess, **kw: Any) -> Any:
    return openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, **kw)


FLIPS: list[float] = []


def same_or_near_tie(llm, prompt: list[int], reference: list[int], got: list[int]) -> bool:
    return _same_or_near_tie(llm, prompt, reference, got, flips=FLIPS, limit=NEAR_TIE_LOGITS)


def chat(srv: ServerProcess, messages, **kw: Any) -> Any:
    kw.setdefault("max_tokens", MAX_TOKENS)
    kw.setdefault("temperature", 0)
    return client(srv).chat.completions.create(model=MODEL, messages=messages, **kw)


# --------------------------------------------------------------------------- tests


def test_models_health_and_metrics(servers) -> None:
    spec, _ = servers
    models = client(spec).models.list()
    assert [m.id for m in models.data] == [MODEL]
    health = spec.get_json("/health")
    assert health["status"] == "ok" and health["drafter"] == "agspec"
    text = spec.get("/metrics")
    assert "agspec_queue_depth" in text and "# TYPE agspec_requests_total counter" in text


def test_greedy_with_agspec_equals_plain_decoding(servers, llm) -> None:
    """>= 20 real agent prompts: AgSpec's greedy tokens equal the plain server's."""
    spec, plain = servers
    prompts = agent_messages(NUM_PROMPTS)
    assert len(prompts) >= 20
    equal = drafted = accepted = 0
    for i, messages in enumerate(prompts):
        ref = chat(plain, messages, extra_headers=IDS)
        r = ref.model_extra["agspec"]
        assert r["drafted_tokens"] == 0
        # Each prompt twice in one explicit session: the retry drafts from the first answer.
        for _ in range(2):
            got = chat(spec, messages, user=f"eq-{i}", extra_headers=IDS)
            g = got.model_extra["agspec"]
            assert r["prompt_ids"] == g["prompt_ids"]
            drafted += g["drafted_tokens"]
            accepted += g["accepted_tokens"]
            equal += same_or_near_tie(llm, r["prompt_ids"], r["output_ids"], g["output_ids"])
            assert got.usage.completion_tokens == len(g["output_ids"])
            assert got.usage.prompt_tokens == len(g["prompt_ids"])
    print(
        f"\nagspec serve: {2 * len(prompts)} greedy answers, {equal} equal to --drafter none, "
        f"{2 * len(prompts) - equal} near-tie flips (logit gaps "
        f"{min(FLIPS, default=0):.4f}..{max(FLIPS, default=0):.4f}); "
        f"{accepted} of {drafted} draft tokens accepted"
    )
    assert accepted > len(prompts) * MAX_TOKENS // 2  # the retries copy the first answers


def test_plain_server_equals_llama_cpp_python(servers, llm) -> None:
    """The chat template from the GGUF: the plain server's greedy answer is what
    llama-cpp-python's own create_chat_completion gives (repeat_penalty=1: its server
    penalises repeats by default)."""
    _, plain = servers
    flips = 0
    for messages in agent_messages(6):
        ours = chat(plain, messages, extra_headers=IDS)
        llm.reset()
        theirs = llm.create_chat_completion(
            messages=messages, max_tokens=MAX_TOKENS, temperature=0.0, repeat_penalty=1.0
        )
        text = theirs["choices"][0]["message"]["content"]
        if text != ours.choices[0].message.content:
            info = ours.model_extra["agspec"]
            their_ids = [int(t) for t in llm.tokenize(text.encode(), add_bos=False, special=True)]
            flips += not same_or_near_tie(llm, info["prompt_ids"], info["output_ids"], their_ids)
    print(f"\nllama-cpp-python create_chat_completion: {flips} near-tie flips of 6")


def test_stream_equals_non_stream(servers, llm) -> None:
    spec, plain = servers
    for srv in (plain, spec):
        for i, messages in enumerate(agent_messages(4)):
            whole = chat(srv, messages, user=f"stream-{srv.port}-{i}", extra_headers=IDS)
            stream = chat(srv, messages, user=f"stream-{srv.port}-{i}-s", stream=True,
                          stream_options={"include_usage": True})  # fmt: skip
            parts, usage, finish = [], None, None
            for chunk in stream:
                if chunk.choices:
                    parts.append(chunk.choices[0].delta.content or "")
                    finish = chunk.choices[0].finish_reason or finish
                else:
                    usage = chunk.usage
            text = "".join(parts)
            assert usage is not None and finish == whole.choices[0].finish_reason
            if srv is plain:
                assert text == whole.choices[0].message.content
                assert usage.completion_tokens == whole.usage.completion_tokens
            elif text != whole.choices[0].message.content:
                # Drafting differs between the two calls (the curves learn): a near-tie?
                info = whole.model_extra["agspec"]
                ids = [int(t) for t in llm.tokenize(text.encode(), add_bos=False, special=True)]
                same_or_near_tie(llm, info["prompt_ids"], info["output_ids"], ids)


def test_completions_endpoint(servers) -> None:
    spec, plain = servers
    c = client(plain)
    prompt = "def fibonacci(n):\n    "
    whole = c.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    parts = [
        ch.choices[0].text
        for ch in c.completions.create(
            model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True
        )  # fmt: skip
    ]
    assert "".join(parts) == whole.choices[0].text and whole.usage.completion_tokens == 12
    stop = c.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                stop=[whole.choices[0].text[3:6]])  # fmt: skip
    assert stop.choices[0].finish_reason == "stop"
    assert stop.choices[0].text == whole.choices[0].text[:3]
    again = client(spec).completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, temperature=0
    )
    assert again.choices[0].text == whole.choices[0].text or again.choices[0].text


def test_session_inference_drafts_from_the_first_call(servers) -> None:
    """No session id: the second request (first messages + the answer + a new message)
    continues the first one's session and drafts from its text (seen in /metrics)."""
    spec, _ = servers
    system = {"role": "system", "content": "You are a careful Python assistant. (session test)"}
    first = [system, {"role": "user", "content": "Write a Python function add(a, b)."}]
    before = spec.metrics()
    r1 = chat(spec, first, max_tokens=40)
    answer = r1.choices[0].message.content
    second = [*first, {"role": "assistant", "content": answer},
              {"role": "user", "content": "Repeat your previous answer exactly."}]  # fmt: skip
    r2 = chat(spec, second, max_tokens=40)
    after = spec.metrics()
    a1, a2 = r1.model_extra["agspec"], r2.model_extra["agspec"]
    assert a1["session_new"] and not a2["session_new"]
    assert a2["session_id"] == a1["session_id"] and a2["session_known_units"] == 3
    agent = a1["agent"]
    key = f'agspec_accepted_tokens_total{{agent="{agent}",source="session"}}'
    gained = after.get(key, 0) - before.get(key, 0)
    assert gained >= 10, f"{key}: {before.get(key)} -> {after.get(key)}"
    cont = 'agspec_session_requests_total{kind="continued"}'
    assert after[cont] - before.get(cont, 0) == 1
    assert a2["by_source"]["session"][1] >= 10


def test_eight_concurrent_clients(servers, llm) -> None:
    spec, plain = servers
    prompts = agent_messages(8)
    refs = [chat(plain, m, extra_headers=IDS) for m in prompts]
    results: list[Any] = [None] * 8
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = chat(spec, prompts[i], user=f"conc-{i}", extra_headers=IDS)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    for ref, got in zip(refs, results):
        r, g = ref.model_extra["agspec"], got.model_extra["agspec"]
        same_or_near_tie(llm, r["prompt_ids"], r["output_ids"], g["output_ids"])
    assert len({g.model_extra["agspec"]["session_id"] for g in results}) == 8


def test_disconnect_mid_stream_frees_the_slot(servers) -> None:
    spec, _ = servers
    before = spec.metrics().get('agspec_cancelled_total{reason="disconnected"}', 0)
    ask = [{"role": "user", "content": "Count from 1 to 2000, one per line."}]
    body = {"model": MODEL, "max_tokens": 1500, "temperature": 0, "stream": True, "messages": ask}
    with httpx.Client(timeout=60) as h:
        with h.stream("POST", f"{spec.base_url}/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            got = 0
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    got += 1
                if got >= 4:
                    break
        t0 = time.monotonic()
    # The generation stops within a step or so: the slot is free long before 1500 tokens.
    while spec.get_json("/health")["running"] and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    freed_s = time.monotonic() - t0
    assert spec.get_json("/health")["running"] == 0
    after = spec.metrics()['agspec_cancelled_total{reason="disconnected"}']
    assert after == before + 1
    assert freed_s < 5, f"slot freed only after {freed_s:.1f} s"
    r = chat(spec, [{"role": "user", "content": "Say hi."}], max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length")
    # A plain (non-streamed) request whose client gives up is cancelled the same way. Its
    # prompt makes SmolLM2 write all 1500 tokens (12.7 s here); the counting prompt above
    # stops after 121, which a fast host finished within the client's 1.5 s (no timeout).
    story = "Write a very long story about a dragon, at least 1500 words."
    body = {**body, "stream": False, "messages": [{"role": "user", "content": story}]}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{spec.base_url}/chat/completions", json=body, timeout=1.5)
    t0 = time.monotonic()
    while spec.get_json("/health")["running"] and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert time.monotonic() - t0 < 5 and spec.get_json("/health")["running"] == 0
    assert spec.metrics()['agspec_cancelled_total{reason="disconnected"}'] == before + 2


BAD_INPUTS: list[tuple[str, Any, int, str | None]] = [
    # (name, body (bytes: raw), status, param named in the error)
    ("malformed json", b'{"model": "x", "messages": [', 400, None),
    ("not an object", b"[1, 2]", 400, None),
    ("messages not a list", {"messages": "hi"}, 400, "messages"),
    ("empty messages", {"messages": []}, 400, "messages"),
    ("unknown role", {"messages": [{"role": "wizard", "content": "x"}]}, 400,
     "messages[0].role"),
    ("content wrong type", {"messages": [{"role": "user", "content": 5}]}, 400,
     "messages[0].content"),
    ("image part", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages[0].content[0].type"),
    ("unknown model", {"model": "gpt-17"}, 404, "model"),
    ("max_tokens 0", {"max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens negative", {"max_tokens": -3}, 400, "max_tokens"),
    ("max_tokens string", {"max_tokens": "5"}, 400, "max_tokens"),
    ("max_completion_tokens 0", {"max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ("n 2", {"n": 2}, 400, "n"),
    ("temperature string", {"temperature": "hot"}, 400, "temperature"),
    ("temperature too high", {"temperature": 3.5}, 400, "temperature"),
    ("top_p 0", {"top_p": 0}, 400, "top_p"),
    ("stream string", {"stream": "yes"}, 400, "stream"),
    ("stop number", {"stop": 7}, 400, "stop"),
    ("stop list of numbers", {"stop": ["a", 7]}, 400, "stop[1]"),
    ("seed float", {"seed": 1.5}, 400, "seed"),
    ("logprobs", {"logprobs": True}, 400, "logprobs"),
    ("presence penalty", {"presence_penalty": 1.0}, 400, "presence_penalty"),
    ("json mode", {"response_format": {"type": "json_object"}}, 400, "response_format"),
    ("tools on a template without tools",
     {"tools": [{"type": "function", "function": {"name": "bash"}}]}, 400, "tools"),
    ("tool_choice required",
     {"tools": [{"type": "function", "function": {"name": "bash"}}], "tool_choice": "required"},
     400, "tool_choice"),
    ("stream_options without stream", {"stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    ("prompt longer than the context",
     {"messages": [{"role": "user", "content": "word " * 3000}]}, 400, "messages"),
]  # fmt: skip


@pytest.mark.parametrize("name,body,status,param", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_gets_an_openai_error(servers, name, body, status, param) -> None:
    spec, _ = servers
    if isinstance(body, bytes):
        raw = body
    else:
        full = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                **body}  # fmt: skip
        raw = json.dumps(full).encode()
    r = httpx.post(f"{spec.base_url}/chat/completions", content=raw, timeout=60,
                   headers={"Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param
    if param is not None:
        assert err["message"].startswith(param), err["message"]
    if name == "prompt longer than the context":
        assert err["code"] == "context_length_exceeded"
    # The openai client sees the same error as its typed exception.
    if not isinstance(body, bytes) and status == 400:
        with pytest.raises(openai.BadRequestError):
            client(spec).chat.completions.create(**json.loads(raw))
    # ... and the server keeps serving.
    assert spec.get_json("/health")["status"] == "ok"


def test_bad_completion_inputs_and_routes(servers) -> None:
    spec, _ = servers
    cases = [
        ({"model": MODEL}, "prompt"),
        ({"model": MODEL, "prompt": ["a", "b"]}, "prompt"),
        ({"model": MODEL, "prompt": [1, 10**9]}, "prompt"),
        ({"model": MODEL, "prompt": "x", "echo": 1}, "echo"),
    ]
    for body, param in cases:
        r = httpx.post(f"{spec.base_url}/completions", json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.get(f"{spec.base_url}/nothing-here", timeout=10)
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(f"{spec.base_url}/chat/completions", timeout=10)
    assert r.status_code == 405 and "error" in r.json()
    ok = client(spec).completions.create(model=MODEL, prompt="Hello", max_tokens=3)
    assert ok.usage.completion_tokens >= 1
