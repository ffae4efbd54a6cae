"""`agspec serve` over its life: start-up profile, queue limit, timeout, many sessions,
SIGTERM drain with saved state and recorded traces, restart.

One server for the module (SmolLM2, AgSpec drafting, no `--cost-profile`: it measures
one at start-up into a temporary cache), with a queue of one, 40 live sessions at most,
a 3 s request timeout, `--state-dir` and `--record`. The last test stops it with SIGTERM
and starts it again. The 10,000-session test drives the engine's session layers
in-process (resolver, drafter sessions, recorder), where a session costs no decoding.

Needs the `serve` extra, `openai`, llama-cpp-python and the SmolLM2 GGUF; skips otherwise.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from guards import require_model, require_server

pytestmark = [pytest.mark.server, pytest.mark.slow]
_clients = require_server()  # skips the module with the reason when one is missing
openai, httpx = _clients.openai, _clients.httpx

from agspec.serve.launch import ServerProcess  # noqa: E402

MODEL = "smollm2-135m-instruct"
MAX_SESSIONS = 40
TIMEOUT_S = 3
COST_PROFILE = (
    Path(__file__).resolve().parents[2]
    / "src/agspec/data/costmodels/epyc2t-llamacpp-qwen2.5-coder-0.5b-ctx1024.json"
)


@pytest.fixture(scope="module")
def model_path() -> Path:
    return require_model(MODEL)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve")
    return {"cache": root / "profiles", "state": root / "state", "record": root / "rec.jsonl"}


def server_args(dirs: dict[str, Path]) -> list[str]:
    return ["--model", MODEL, "--threads", "1", "--n-ctx", "2048", "--drafter", "agspec",
            "--max-queue", "1", "--max-sessions", str(MAX_SESSIONS),
            "--request-timeout", str(TIMEOUT_S), "--state-dir", str(dirs["state"]),
            "--record", str(dirs["record"])]  # fmt: skip


@pytest.fixture(scope="module")
def server(model_path, dirs):
    srv = ServerProcess(server_args(dirs), env={"AGSPEC_PROFILE_CACHE": str(dirs["cache"])})
    srv.start()
    yield srv
    srv.stop()


def client(srv: ServerProcess) -> Any:
    return openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)


def test_startup_measures_and_caches_a_cost_profile(server, dirs) -> None:
    from agspec.policy.costmodel import ProfileCostModel

    log = server.log()
    assert "measuring a cost profile" in log and "cost profile round 3/3" in log, log
    assert "(measured now)" in log
    files = list(dirs["cache"].glob("*.json"))
    assert len(files) == 1
    model = ProfileCostModel.load(files[0])
    assert model.step_cost(1, 1) == 1.0 and model.step_cost(16, 1) > 1.0


def test_queue_full_gets_503_with_retry_after(server) -> None:
    results: list[Any] = []
    typed: list[BaseException] = []

    def post(k: int) -> None:
        body = {"model": MODEL, "prompt": f"Story {k}: once upon a time", "max_tokens": 24,
                "temperature": 0}  # fmt: skip
        results.append(httpx.post(f"{server.base_url}/completions", json=body, timeout=60))

    def typed_client() -> None:
        try:
            client(server).completions.create(model=MODEL, prompt="x", max_tokens=2)
        except openai.APIStatusError as exc:
            typed.append(exc)

    first = threading.Thread(target=post, args=(0,))
    first.start()
    time.sleep(0.3)  # the first one is decoding; one more fits the queue; the rest do not
    rest = [threading.Thread(target=post, args=(k,)) for k in range(1, 5)]
    rest.append(threading.Thread(target=typed_client))
    for t in rest:
        t.start()
    for t in [first, *rest]:
        t.join(timeout=120)
    codes = sorted(r.status_code for r in results)
    busy = [r for r in results if r.status_code == 503]
    assert len(busy) >= 2, codes
    assert all(c in (200, 503) for c in codes) and codes.count(200) >= 1, codes
    for r in busy:
        assert int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["code"] == "queue_full"
    # The openai client sees the 503 as its typed error (unless it got the free slot).
    assert all(e.status_code == 503 for e in typed)


def test_request_timeout(server) -> None:
    ask = [{"role": "user", "content": "Count from 1 to 5000, one number per line."}]
    # Sampled at temperature 2: near-uniform tokens, so no early end-of-text.
    body = {"model": MODEL, "messages": ask, "max_tokens": 1990, "temperature": 2.0, "seed": 1}
    t0 = time.monotonic()
    r = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120)
    took = time.monotonic() - t0
    if r.status_code == 200:
        pytest.skip(f"the machine decoded 1990 tokens within {TIMEOUT_S} s ({took:.1f} s)")
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout", r.text
    assert took < TIMEOUT_S + 5
    assert server.get_json("/health")["running"] == 0
    # A stream that fails mid-way ends with an error event, which the client raises.
    stream = client(server).chat.completions.create(**body, stream=True)
    got = []
    with pytest.raises(openai.APIError, match="ran past its time bound"):
        for chunk in stream:
            got.append(chunk.choices[0].delta.content or "")
    assert "".join(got)  # text came before the error


def test_sessions_past_the_limit_are_dropped(server) -> None:
    """Through HTTP: 3x the session limit; live sessions and drafter state stay bounded."""
    rss = []
    with httpx.Client(timeout=60) as h:
        for i in range(3 * MAX_SESSIONS):
            r = h.post(f"{server.base_url}/completions",
                       json={"model": MODEL, "prompt": f"Note {i}:", "max_tokens": 1,
                             "user": f"many-{i}"})  # fmt: skip
            assert r.status_code == 200, r.text
            if i in (MAX_SESSIONS, 3 * MAX_SESSIONS - 1):
                rss.append(server.rss_bytes())
    m = server.metrics()
    assert m["agspec_sessions"] <= MAX_SESSIONS
    assert m["agspec_drafter_sessions"] <= MAX_SESSIONS + 1
    assert rss[1] - rss[0] < 32 << 20, f"RSS grew {(rss[1] - rss[0]) >> 20} MiB"


def test_ten_thousand_sessions_keep_memory_bounded(model_path) -> None:
    """The session layers of the engine (resolver, AgSpec drafter sessions with their
    indexes, turn counters, the recorder) over 10,000 sessions of two calls each, with
    a limit of 100 live sessions: memory after 10,000 is what it was after 2,000."""
    from agspec.serve.engine import Engine, EngineConfig

    engine = Engine(
        EngineConfig(model=MODEL, threads=1, n_ctx=256, drafter="agspec",
                     cost_profile=str(COST_PROFILE), max_sessions=100),
        progress=lambda msg: None,
    )  # fmt: skip
    system = {"role": "system", "content": "You are a coding agent. " * 20}
    tokens = engine.tokenize(system["content"], add_bos=False, special=False)

    def session(i: int) -> None:
        first = [system, {"role": "user", "content": f"task {i}: fix the bug in module {i}"}]
        answer = {"role": "assistant", "content": f"cat module_{i}.py"}
        second = [*first, answer, {"role": "user", "content": "def f(): pass"}]
        for turn, msgs in enumerate((first, second)):
            res = engine.resolver.resolve_messages(msgs)
            assert res.is_new == (turn == 0)
            call = engine._drafter_call(res.session_id, "agent-x", turn)
            prompt = tokens + [i % 1000 + 1, turn + 1]
            call.begin(prompt)
            call.propose(8)
            call.accept([5])
            call.end()
            engine.resolver.record_messages(res, msgs, answer)
        engine._drain_expired()

    tracemalloc.start()
    try:
        for i in range(2000):
            session(i)
        base, _ = tracemalloc.get_traced_memory()
        base_rss = _own_rss()
        for i in range(2000, 10_000):
            session(i)
        now, _ = tracemalloc.get_traced_memory()
        now_rss = _own_rss()
    finally:
        tracemalloc.stop()
    # Native memory too (the C++ indexes of the drafter sessions): the process RSS.
    assert now_rss - base_rss < 32 << 20, f"RSS grew {(now_rss - base_rss) / 1e6:.1f} MB"
    assert len(engine.resolver) <= 100
    assert len(engine._sessions) <= 101 and len(engine._turns) <= 101
    assert len(engine.drafter_server._sessions) <= 101
    assert now - base < 2 << 20, f"Python heap grew {(now - base) / 1e6:.1f} MB"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_stopped_worker_fails_what_waits_and_refuses_what_comes(model_path) -> None:
    """Should the decode worker ever stop on an error (the loop survives a failing step or
    admission, so this takes a loop that raises), no request is left waiting for it: the
    queued one gets a 503, and so does every later one."""
    import threading

    from agspec.serve.engine import Engine, EngineConfig, Failed, Job
    from agspec.serve.schema import APIError, SamplingParams

    engine = Engine(EngineConfig(model=MODEL, threads=1, n_ctx=256, drafter="none"),
                    progress=lambda msg: None)  # fmt: skip
    go = threading.Event()

    def broken_run() -> None:
        go.wait(30)
        raise RuntimeError("a bug in the loop")

    engine.loop.run = broken_run  # type: ignore[method-assign]
    got: list[object] = []
    msgs = [{"role": "user", "content": "hello"}]

    def job() -> Job:
        sampling = SamplingParams(max_tokens=4, temperature=0.0, top_p=1.0, top_k=0,
                                  seed=None, stop=())  # fmt: skip
        return Job(prompt_ids=[1, 2, 3], sampling=sampling, emit=got.append, agent="a",
                   resolution=engine.resolver.resolve_messages(msgs))  # fmt: skip

    engine.submit(job())
    engine.start()
    go.set()
    assert engine._thread is not None
    engine._thread.join(30)
    assert not engine._thread.is_alive() and engine.worker_failed
    assert len(got) == 1 and isinstance(got[0], Failed) and got[0].error.status == 503
    with pytest.raises(APIError) as e:
        engine.submit(job())
    assert e.value.status == 503 and "decode worker stopped" in str(e.value)


def _own_rss() -> int:
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise OSError("VmRSS not found")


def test_sigterm_drains_saves_state_records_and_restarts(server, dirs) -> None:
    """Last test of the module: it stops the server."""
    from agspec.traces.io import read_sessions
    from agspec.traces.recorder import read_sidecar

    system = {"role": "system", "content": "You are a helpful coding assistant (drain test)."}
    first = [system, {"role": "user", "content": "Write a Python function add(a, b)."}]
    r1 = client(server).chat.completions.create(model=MODEL, messages=first, max_tokens=24,
                                                temperature=0)  # fmt: skip
    second = [*first, {"role": "assistant", "content": r1.choices[0].message.content},
              {"role": "user", "content": "Repeat it exactly."}]  # fmt: skip
    chunks: list[str] = []
    finish: list[str | None] = []

    def stream() -> None:
        s = client(server).chat.completions.create(
            model=MODEL, messages=second, max_tokens=40, temperature=0, stream=True
        )
        for ch in s:
            if ch.choices:
                chunks.append(ch.choices[0].delta.content or "")
                finish.append(ch.choices[0].finish_reason)

    t = threading.Thread(target=stream)
    t.start()
    deadline = time.monotonic() + 60
    while len(chunks) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    code = server.stop(sig=signal.SIGTERM)
    t.join(timeout=60)
    assert code == 0, server.log()[-3000:]
    # The request in flight finished (it was not cut off by the shutdown).
    assert finish and finish[-1] in ("stop", "length"), (chunks, finish)
    log = server.log()
    assert "Waiting for application shutdown" in log and "stopped; state saved" in log
    # The drafter state is saved at shutdown (the default agspec: learned acceptance curves).
    curves = json.loads((dirs["state"] / "curves.json").read_text())
    assert curves["format"] == "agspec-acceptance-curves"
    # Every session served is a trace line; the conversation above is one session.
    sessions = list(read_sessions(dirs["record"]))
    assert sessions and len({s.session_id for s in sessions}) == len(sessions)
    drain = [s for s in sessions if s.calls and "(drain test)" in s.calls[0].messages[0].content]
    assert len(drain) == 1 and len(drain[0].calls) == 2, [len(s.calls) for s in drain]
    assert drain[0].calls[1].messages[2].content == r1.choices[0].message.content
    live = read_sidecar(dirs["record"].with_name("rec.live.jsonl"))[drain[0].session_id]
    steps = live["calls"][1]["steps"]
    assert sum(c for _, _, c in steps) >= len(live["calls"][1]["output_ids"]) > 0
    # (Whether it drafted depends on the profile measured at start-up, i.e. on the load.)
    assert all(0 <= a <= d and 1 <= c <= a + 1 for d, a, c in steps)
    # A restart finds the cached profile and the saved state.
    again = ServerProcess(server_args(dirs), env={"AGSPEC_PROFILE_CACHE": str(dirs["cache"])})
    with again:
        assert "(cached)" in again.log() and "measuring" not in again.log()
        r = client(again).chat.completions.create(model=MODEL, messages=first, max_tokens=4)
        assert r.usage.completion_tokens >= 1
    assert again.proc is not None and again.proc.returncode == 0
