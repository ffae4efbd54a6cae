"""`agspec serve`: prompts start from the longest prefix whose KV the server holds, in
another slot (`copy_prefix`) or in the saved-KV store (`--kv-store`), through the real
`openai` client against real server processes (SmolLM2-135M, one thread, `--drafter
none`, so an answer depends on the KV alone).

Oracles: each answer equals what the same request gets from a one-slot server without
the store (which prefills every prompt past its own slot's cache), or parts from it only
at a checked near-tie; `reused_prompt_tokens` equals the common prefix of the prompt
with the tokens the server provably holds (computed from the returned ids), and the
same request on the reference server reuses only its slot's prefix. Concurrency is
synchronised on the stream's first chunk, never on sleeps.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from guards import require_model, require_server, smollm2_llm

pytestmark = [pytest.mark.server, pytest.mark.slow]
_clients = require_server()  # skips the module with the reason when one is missing
openai, httpx = _clients.openai, _clients.httpx

from serve_oracle import same_or_near_tie as _same_or_near_tie  # noqa: E402

from agspec.adapters.llama_cpp_batch import common_prefix_length as cpl  # noqa: E402
from agspec.serve.launch import ServerProcess  # noqa: E402

MODEL = "smollm2-135m-instruct"
NEAR_TIE_LOGITS = 0.5  # as tests/serve/test_api.py
IDS = {"X-AgSpec-Return-Ids": "1"}
SYSTEM = "You are a careful coding assistant. Answer briefly."
_CPU_PROFILE = (
    Path(__file__).resolve().parents[2]
    / "src/agspec/data/costmodels/epyc2t-llamacpp-qwen2.5-coder-0.5b-ctx1024.json"
)
FILES = {
    "a": "".join(f"def f{i}(x):\n    return x * {i} + {i * i}\n\n" for i in range(12)),
    "b": "".join(f"class C{i}:\n    value = '{chr(97 + i) * 3}'\n\n" for i in range(12)),
}


@pytest.fixture(scope="module")
def model_path() -> Path:
    return require_model(MODEL)


@pytest.fixture(scope="module")
def llm(model_path):
    return smollm2_llm(2048)


def _start(args: list[str]) -> ServerProcess:
    base = ["--model", MODEL, "--threads", "1", "--n-ctx", "2048", "--drafter", "none"]
    return ServerProcess(base + args).start()


@pytest.fixture(scope="module")
def reference(model_path):
    srv = _start(["--parallel", "1", "--kv-store", "0"])
    yield srv
    assert srv.stop() == 0


def chat(srv: ServerProcess, messages: list[dict[str, str]], max_tokens: int = 16, **kw: Any):
    c = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
    return c.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0,
        extra_headers=IDS, **kw,
    )  # fmt: skip


def info(resp: Any) -> dict[str, Any]:
    return resp.model_extra["agspec"]


def first_call(name: str) -> list[dict[str, str]]:
    question = f"File {name}.py:\n{FILES[name]}\nWhat does it define?"
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def next_call(msgs: list[dict[str, str]], answer: str) -> list[dict[str, str]]:
    return [*msgs, {"role": "assistant", "content": answer},
            {"role": "user", "content": "Name the first one only."}]  # fmt: skip


def metric(srv: ServerProcess, name: str) -> float:
    text = httpx.get(f"{srv.url}/metrics", timeout=30).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


FLIPS: list[float] = []


def same(llm, ref: Any, got: Any) -> bool:
    r, g = info(ref), info(got)
    assert g["prompt_ids"] == r["prompt_ids"]
    return _same_or_near_tie(
        llm, r["prompt_ids"], r["output_ids"], g["output_ids"], flips=FLIPS, limit=NEAR_TIE_LOGITS
    )


def _engine(parallel: int) -> Any:
    """An in-process `Engine` (not started) of `parallel` slots, prefill chunks of 64."""
    from agspec.serve.engine import Engine, EngineConfig

    return Engine(EngineConfig(model=MODEL, threads=1, n_ctx=2048, drafter="none",
                               parallel=parallel, kv_store_bytes=0, prefill_chunk=64,
                               cost_profile=str(_CPU_PROFILE)),
                  progress=lambda msg: None)  # fmt: skip


def _job(
    engine: Any,
    key: Any,
    ids: list[int],
    got: dict[Any, Any],
    done: dict[Any, threading.Event],
    *,
    on_event: Any = None,
    stream: bool = False,
) -> Any:
    """A greedy 12-token job of its own session for an in-process `Engine`: its final
    event lands in got[key] and sets done[key]; `on_event(ev)` sees every event first, on
    the worker thread."""
    from agspec.serve.engine import Finished, Job
    from agspec.serve.schema import SamplingParams

    def emit(ev: Any) -> None:
        if on_event is not None:
            on_event(ev)
        if not hasattr(ev, "text") or isinstance(ev, Finished):
            got[key] = ev
            done[key].set()

    sampling = SamplingParams(max_tokens=12, temperature=0.0, top_p=1.0, top_k=0, seed=None,
                              stop=())  # fmt: skip
    msgs = [{"role": "user", "content": f"call {key}"}]
    return Job(prompt_ids=ids, sampling=sampling, emit=emit, agent="coder",
               resolution=engine.resolver.resolve_messages(msgs), return_ids=True,
               stream=stream)  # fmt: skip


def test_sessions_beyond_the_slots_restore_their_kv(model_path, reference, llm) -> None:
    """Two sessions take turns on one slot: each next call restores its session's saved
    KV instead of prefilling its history again."""
    srv = _start(["--parallel", "1"])
    try:
        answers: dict[str, dict[str, Any]] = {}
        for server in (srv, reference):
            got: dict[str, Any] = {}
            for name in ("a", "b"):
                got[name + "1"] = chat(server, first_call(name), user=f"s-{name}")
            for name in ("a", "b"):
                msgs = next_call(first_call(name), got[name + "1"].choices[0].message.content)
                got[name + "2"] = chat(server, msgs, user=f"s-{name}")
            answers["store" if server is srv else "ref"] = got
        saves = metric(srv, "agspec_kv_saves_total")
        restored = metric(srv, 'agspec_kv_restores_total{result="ok"}')
        health = httpx.get(f"{srv.url}/health", timeout=30).json()["kv_store"]
    finally:
        assert srv.stop() == 0
    store, ref = answers["store"], answers["ref"]
    for key in ("a1", "b1", "a2", "b2"):
        same(llm, ref[key], store[key])
    for name, other in (("a", "b"), ("b", "a")):
        first, again = info(store[name + "1"]), info(store[name + "2"])
        # What the slot held after the first call: its prompt and answer, but the last
        # token (pending, never evaluated).
        held = (first["prompt_ids"] + first["output_ids"])[:-1]
        prompt = again["prompt_ids"][:-1]
        assert again["reused_prompt_tokens"] == cpl(held, prompt)
        assert cpl(held, prompt) > len(first["prompt_ids"]) - 2
        # Without the store the slot holds the other session's last call: only the
        # system prompt and template are reused.
        before = info(ref[other + ("1" if name == "a" else "2")])
        held_other = (before["prompt_ids"] + before["output_ids"])[:-1]
        assert info(ref[name + "2"])["reused_prompt_tokens"] == cpl(held_other, prompt)
        assert info(ref[name + "2"])["reused_prompt_tokens"] < len(first["prompt_ids"]) // 2
    assert restored == 2 and saves >= 2, (restored, saves)
    assert health["entries"] >= 1 and 0 < health["bytes"] <= health["budget_bytes"]


def test_a_prompt_starts_from_a_busy_slots_cells(model_path, reference, llm) -> None:
    """A second call sharing a long prefix with a call still decoding in another slot
    takes that slot's cells instead of prefilling the prefix."""
    srv = _start(["--parallel", "2", "--kv-store", "0"])
    first = first_call("a")
    second = [first[0], {"role": "user", "content": first[1]["content"] + " And f3?"}]
    try:
        c = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        stream = c.chat.completions.create(
            model=MODEL, messages=first, max_tokens=64, temperature=0, stream=True
        )
        chunks = iter(stream)
        head = next(chunks)  # the first call is decoding: its prompt's KV is in its slot
        out: dict[str, Any] = {}
        t = threading.Thread(target=lambda: out.setdefault("second", chat(srv, second)))
        t.start()
        text = (head.choices[0].delta.content or "") + "".join(
            ch.choices[0].delta.content or "" for ch in chunks if ch.choices
        )
        t.join()
        copies = metric(srv, "agspec_kv_prefix_copies_total")
    finally:
        assert srv.stop() == 0
    ref_first = chat(reference, first, max_tokens=64)
    ref_second = chat(reference, second)
    same(llm, ref_second, out["second"])
    # The first call decoded beside the one that shares its cells: its answer is intact.
    ref_text = ref_first.choices[0].message.content
    if text != ref_text:
        tok = lambda s: llm.tokenize(s.encode(), add_bos=False, special=False)  # noqa: E731
        _same_or_near_tie(llm, info(ref_first)["prompt_ids"], tok(ref_text), tok(text),
                          flips=FLIPS, limit=NEAR_TIE_LOGITS)  # fmt: skip
    got = info(out["second"])
    shared = cpl(info(ref_first)["prompt_ids"], got["prompt_ids"][:-1])
    assert shared >= 100
    assert got["reused_prompt_tokens"] == shared
    assert copies == 1


def test_a_store_that_holds_one_entry_restores_before_it_saves(model_path, reference, llm):
    """A store with room for one saved cache: session a's call 2 restores a's entry, and
    saving the slot's cache of session b, which that cuts, must not drop a's entry first
    (it did: the worker thread died on the missing entry and every later request hung)."""

    def run(srv: ServerProcess) -> tuple[dict[str, Any], dict[str, Any]]:
        got = {name + "1": chat(srv, first_call(name), user=f"s-{name}") for name in ("a", "b")}
        after_b1 = httpx.get(f"{srv.url}/health", timeout=30).json()["kv_store"]
        msgs = next_call(first_call("a"), got["a1"].choices[0].message.content)
        got["a2"] = chat(srv, msgs, user="s-a", timeout=120)
        got["b1-again"] = chat(srv, first_call("b"), user="s-b2", timeout=120)
        return got, after_b1

    sizer = _start(["--parallel", "1"])  # how big the two entries are
    try:
        _, after_b1 = run(sizer)
        size_b = httpx.get(f"{sizer.url}/health", timeout=30).json()["kv_store"]["bytes"]
    finally:
        assert sizer.stop() == 0
    size_a = after_b1["bytes"]
    assert after_b1["entries"] == 1 and size_a > 0 and size_b > 0
    budget = max(size_a, size_b) + min(size_a, size_b) // 2  # either alone, never both
    srv = _start(["--parallel", "1", "--kv-store", str(budget)])
    try:
        got, _ = run(srv)
        restored = metric(srv, 'agspec_kv_restores_total{result="ok"}')
        assert httpx.get(f"{srv.url}/health", timeout=30).json()["status"] == "ok"
    finally:
        assert srv.stop() == 0
    assert restored >= 1
    ref_a2 = chat(reference, next_call(first_call("a"), got["a1"].choices[0].message.content))
    same(llm, ref_a2, got["a2"])
    held = (info(got["a1"])["prompt_ids"] + info(got["a1"])["output_ids"])[:-1]
    assert info(got["a2"])["reused_prompt_tokens"] == cpl(held, info(got["a2"])["prompt_ids"][:-1])


def test_calls_that_arrive_together_prefill_their_shared_history_once(model_path, llm) -> None:
    """Two requests that share a long prompt prefix are admitted in one pass (both queued
    before the worker starts, so nothing races): the second prefills nothing until the
    first holds the shared prefix, then takes its cells and prefills only its own tail.
    Oracle: its `reused_prompt_tokens` is the common prefix of the two prompts (less the
    pending last token), the first reuses nothing, and both answers equal each prompt
    decoded alone afterwards (up to checked near-ties)."""
    from agspec.serve.engine import Finished

    engine = _engine(2)
    tok = lambda s: llm.tokenize(s.encode(), add_bos=False, special=False)  # noqa: E731
    shared = tok(f"File a.py:\n{FILES['a']}\nFile b.py:\n{FILES['b']}\n")
    prompts = [shared + tok("What does f3 return?"), shared + tok("Which class has 'ccc'?")]
    done = {i: threading.Event() for i in range(4)}
    got: dict[int, Any] = {}

    def job(i: int, ids: list[int]) -> Any:
        return _job(engine, i, ids, got, done)

    try:
        engine.submit(job(0, prompts[0]))
        engine.submit(job(1, prompts[1]))
        engine.start()
        for i in (0, 1):
            assert done[i].wait(300)
        for i in (2, 3):  # each alone: the reference
            engine.submit(job(i, prompts[i - 2]))
            assert done[i].wait(300)
    finally:
        engine.close()
    assert len(got) == 4 and all(isinstance(g, Finished) for g in got.values()), got
    common = cpl(prompts[0][:-1], prompts[1][:-1])
    assert common >= len(shared) - 2 and common >= 200
    assert got[0].stats["reused_prompt_tokens"] == 0
    assert got[1].stats["reused_prompt_tokens"] == common
    for i in (0, 1):
        alone, together = got[i + 2].stats["output_ids"], got[i].stats["output_ids"]
        _same_or_near_tie(llm, prompts[i], alone, together, flips=FLIPS, limit=NEAR_TIE_LOGITS)


@pytest.mark.parametrize("how", ["cancelled", "timeout"])
def test_a_request_that_leaves_mid_prefill_frees_the_one_waiting_for_it(
    model_path, llm, how: str
) -> None:
    """A request waiting for another's prefill goes on when that one leaves half way.
    Queued before the worker starts, in this order: C (a short prompt), A (a long one),
    B (A's prompt less its question, then another question). C and A prefill in the first
    step; B shares A's history and waits for A. C's first answer event (emitted on the
    worker thread, between two steps) ends A mid-prefill: its client goes away, or its time
    bound passes. Oracle: B finishes, having taken exactly the cells A had prefilled (more
    than nothing, fewer than the shared prefix: A left before holding it), A ends as a
    cancel or a 504 naming its prefill, and B's and C's answers equal each prompt decoded
    alone afterwards (up to checked near-ties)."""
    from agspec.serve.batching import MIN_SHARED_TOKENS
    from agspec.serve.engine import Failed, Finished

    engine = _engine(3)
    tok = lambda s: llm.tokenize(s.encode(), add_bos=False, special=False)  # noqa: E731
    history = tok("".join(f"File {n}.py:\n{FILES[n]}\n" for n in ("a", "b") * 3))
    prompts = {
        "c": tok("Say hello."),
        "a": history + tok("What does f3 return?"),
        "b": history + tok("Which class has 'ccc'?"),
    }
    # A must still be prefilling when C's first token ends it: the first step prefills at
    # most --n-batch (512) tokens, each later one --prefill-chunk (64).
    assert len(prompts["a"]) > 1024, len(prompts["a"])
    done = {k: threading.Event() for k in ("c", "a", "b", "c1", "b1")}
    got: dict[str, Any] = {}
    jobs: dict[str, Any] = {}
    # (A's prefilled tokens, whether it was decoding) when C's first event ended it;
    # checked on the test's thread (an assert in `emit` would fail the worker's batch).
    when_left: list[tuple[int, bool]] = []

    def end_a() -> None:
        if when_left:
            return
        a = [r for r in engine.loop.slots if r is not None and r.job is jobs["a"]]
        when_left.append((a[0].prefilled, a[0].decoding) if a else (-1, False))
        if how == "cancelled":
            jobs["a"].cancel.set()
        else:
            jobs["a"].deadline = 0.0  # past: the next step ends it

    def job(key: str, ids: list[int]) -> Any:
        def on_event(ev: Any) -> None:
            if key == "c" and not isinstance(ev, Failed):
                end_a()

        # C streams: its first token's event comes in the step that decodes it.
        jobs[key] = _job(engine, key, ids, got, done, on_event=on_event, stream=key == "c")
        return jobs[key]

    try:
        for key in ("c", "a", "b"):
            engine.submit(job(key, prompts[key]))
        engine.start()
        for key in ("c", "a", "b"):
            assert done[key].wait(300), f"{key} never finished: {got}"
        for key in ("c1", "b1"):  # each alone: the reference
            engine.submit(job(key, prompts[key[0]]))
            assert done[key].wait(300)
    finally:
        engine.close()
    if how == "cancelled":
        assert isinstance(got["a"], Finished) and got["a"].finish_reason == "cancelled"
    else:
        assert isinstance(got["a"], Failed) and got["a"].error.status == 504
        assert "during prefill" in got["a"].error.message
    assert all(isinstance(got[k], Finished) for k in ("c", "b", "c1", "b1")), got
    ((left_at, decoding),) = when_left
    assert left_at >= 0 and not decoding, "A was no longer prefilling when C's event came"
    common = cpl(prompts["a"][:-1], prompts["b"][:-1])
    # A held what it had prefilled when it left, at most one chunk more (C's emit runs
    # before the step's prefill is counted); B took those cells, not the whole history.
    reused = got["b"].stats["reused_prompt_tokens"]
    assert MIN_SHARED_TOKENS <= left_at <= reused <= left_at + 64 < common
    for key in ("c", "b"):
        alone, together = got[key + "1"].stats["output_ids"], got[key].stats["output_ids"]
        _same_or_near_tie(llm, prompts[key], alone, together, flips=FLIPS, limit=NEAR_TIE_LOGITS)
