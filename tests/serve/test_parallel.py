"""`agspec serve --parallel N`: continuous batching, through the real `openai` client
against real server processes (SmolLM2-135M, one thread each).

Oracles: every answer of N clients at once equals what the same request gets alone from
a `--parallel 1 --drafter none` server, token for token, or parts from it only at a
near-tie (the two candidates' one-token logits within `NEAR_TIE_LOGITS`, computed
in-process), as tests/serve/test_api.py checks drafting. Slot release, queueing and
refusals are synchronised on server events (answers, /health, /metrics), never on sleeps.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from guards import smollm2_llm

pytest.importorskip("fastapi", reason="agspec serve needs the serve extra (pip install .[serve])")
pytest.importorskip("uvicorn", reason="agspec serve needs the serve extra")
openai = pytest.importorskip("openai", reason="the serve tests drive the server with `openai`")
try:
    import httpx
except ImportError:
    httpx = pytest.importorskip("httpx2", reason="the openai client brings httpx")
llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from serve_oracle import agent_messages  # noqa: E402
from serve_oracle import same_or_near_tie as _same_or_near_tie  # noqa: E402

from agspec.models import ModelFileError, resolve_model  # noqa: E402
from agspec.serve.launch import ServerProcess  # noqa: E402

MODEL = "smollm2-135m-instruct"
NEAR_TIE_LOGITS = 0.5  # as tests/serve/test_api.py
# Trees: a tree step keeps its accepted cells in another KV order and its batches mix
# sizes (other kernel tiles), which moves logits by up to 0.86 on SmolLM2 against plain
# decoding, while a cell wrongly seen or missed moves them by 5.9 or more
# (tests/adapters/test_llama_cpp_tree.py, KV_TOLERANCE). A flip at gap 0.63 was seen.
TREE_NEAR_TIE_LOGITS = 1.5
MAX_TOKENS = 24
ROOT = Path(__file__).resolve().parents[2]
COST_PROFILE = ROOT / "src/agspec/data/costmodels/epyc2t-llamacpp-qwen2.5-coder-0.5b-ctx1024.json"
IDS = {"X-AgSpec-Return-Ids": "1"}
LONG = [{"role": "user", "content": "Write a very long story about a dragon, at least 1500 words."}]


@pytest.fixture(scope="module")
def model_path() -> Path:
    try:
        return Path(resolve_model(MODEL))
    except (ModelFileError, FileNotFoundError, KeyError) as exc:
        pytest.skip(f"SmolLM2 GGUF not available ({exc}); agspec models fetch {MODEL}")


def _start(args: list[str]) -> ServerProcess:
    base = ["--model", MODEL, "--threads", "1", "--n-ctx", "2048", "--max-queue", "64"]
    return ServerProcess(base + args).start()


@pytest.fixture(scope="module")
def servers(model_path):
    """(reference: --parallel 1 --drafter none, plain: --parallel 4 --drafter none,
    spec: --parallel 4 with the default drafter)."""
    started: list[ServerProcess] = []
    try:
        for args in (
            ["--parallel", "1", "--drafter", "none"],
            ["--parallel", "4", "--drafter", "none"],
            ["--parallel", "4", "--drafter", "agspec", "--cost-profile", str(COST_PROFILE)],
        ):
            started.append(_start(args))
    except Exception:
        for s in started:
            s.stop()
        raise
    yield tuple(started)
    codes = tuple(s.stop() for s in started)
    assert codes == (0, 0, 0), f"exit codes {codes}"


@pytest.fixture(scope="module")
def llm(model_path):
    return smollm2_llm(2048)


def client(srv: ServerProcess, **kw: Any) -> Any:
    return openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, **kw)


def chat(srv: ServerProcess, messages: list[dict[str, str]], **kw: Any) -> Any:
    kw.setdefault("max_tokens", MAX_TOKENS)
    kw.setdefault("temperature", 0)
    return client(srv).chat.completions.create(model=MODEL, messages=messages, **kw)


FLIPS: list[float] = []


def same_or_near_tie(
    llm, prompt: list[int], reference: list[int], got: list[int], limit: float = NEAR_TIE_LOGITS
) -> bool:
    return _same_or_near_tie(llm, prompt, reference, got, flips=FLIPS, limit=limit)


def concurrently(fn: Any, items: list[Any]) -> list[Any]:
    results: list[Any] = [None] * len(items)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = fn(i, items[i])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    return results


def wait_until(cond: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "the server did not get there in time"
        time.sleep(0.02)


# --------------------------------------------------------------------------- tests


def test_concurrent_clients_get_what_each_gets_alone(servers, llm) -> None:
    """8 clients at once on 4 slots (plain and drafting): each answer is the one the
    request gets alone from a one-slot plain server."""
    ref_srv, plain, spec = servers
    prompts = agent_messages(8)
    refs = [chat(ref_srv, m, extra_headers=IDS).model_extra["agspec"] for m in prompts]
    equal = total = 0
    for srv in (plain, spec):
        got = concurrently(
            lambda i, m, srv=srv: chat(srv, m, user=f"par-{srv.port}-{i}", extra_headers=IDS),
            prompts,
        )
        for r, g in zip(refs, got):
            a = g.model_extra["agspec"]
            assert a["prompt_ids"] == r["prompt_ids"]
            equal += same_or_near_tie(llm, r["prompt_ids"], r["output_ids"], a["output_ids"])
            total += 1
    print(f"\n--parallel 4: {equal} of {total} answers equal to --parallel 1 --drafter none, "
          f"{total - equal} near-tie flips (gaps {FLIPS})")  # fmt: skip


def _flat_profile(path: Path) -> Path:
    """A cost profile where verifying 32 tokens costs what one does: wide trees pay."""
    n = list(range(1, 33))
    path.write_text(json.dumps({
        "format": "agspec-cost-profile", "version": 1, "backend": "llama.cpp",
        "model": MODEL, "device": "test (flat)", "context_tokens": 1024,
        "batch_sizes": {"1": {"n_tokens": n, "step_ms": [10.0] * len(n)}},
    }))  # fmt: skip
    return path


def test_concurrent_clients_with_token_trees(servers, llm, tmp_path) -> None:
    """8 clients at once on 4 slots of a server whose (flat) cost profile makes token
    trees pay: each answer is the one the request gets alone from a one-slot plain
    server, up to near-ties, and trees of several branches were verified."""
    ref_srv = servers[0]
    profile = _flat_profile(tmp_path / "flat.json")
    variants = [
        {"role": "user", "content": "Repeat exactly, then go on: the red fox ran. the red "
         "dog sat. the red fox sat. the red cat ran. the red"},
        {"role": "user", "content": "Repeat exactly: a = 1\nb = 2\na = 3\nc = 2\na = 1\nb ="},
    ]  # fmt: skip
    prompts = [*agent_messages(6), [variants[0]], [variants[1]]]
    refs = [chat(ref_srv, m, extra_headers=IDS).model_extra["agspec"] for m in prompts]
    srv = _start(["--parallel", "4", "--drafter", "agspec", "--cost-profile", str(profile),
                  "--fixed-cost-profile"])  # fmt: skip
    try:
        equal = 0
        for _ in range(2):  # the second round drafts from the first's answers too
            got = concurrently(
                lambda i, m: chat(srv, m, user=f"tree-{i}", extra_headers=IDS), prompts
            )
            for r, g in zip(refs, got):
                a = g.model_extra["agspec"]
                assert a["prompt_ids"] == r["prompt_ids"]
                equal += same_or_near_tie(
                    llm, r["prompt_ids"], r["output_ids"], a["output_ids"], TREE_NEAR_TIE_LOGITS
                )
        text = httpx.get(f"{srv.url}/metrics", timeout=30).text
    finally:
        assert srv.stop() == 0
    trees = sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("agspec_tree_steps_total{")
    )
    print(f"\ntrees: {equal} of {2 * len(prompts)} answers equal, {trees:g} tree steps")
    assert trees > 0, "no step verified a tree of more than one branch"


def test_speculative_decoding_metrics_in_vllm_schema(servers) -> None:
    """The vLLM per-request object agrees with the request's own counts, streamed or not."""
    _, _, spec = servers
    ask = [{"role": "user", "content": "Repeat exactly: the quick brown fox jumps over the "
            "lazy dog. The quick brown fox jumps over the lazy dog."}]  # fmt: skip
    for _ in range(2):  # the second call drafts from the first one's answer (one session)
        r = chat(spec, ask, user="metrics-1", max_tokens=40)
    sd = r.model_extra["metrics"]["speculative_decoding"]
    a = r.model_extra["agspec"]
    assert sd["num_draft_tokens"] == a["drafted_tokens"] > 0
    assert sd["num_accepted_draft_tokens"] == a["accepted_tokens"]
    assert sum(sd["acceptance_histogram"]) == sd["num_spec_steps"] <= a["steps"]
    assert sum(k * n for k, n in enumerate(sd["acceptance_histogram"])) == a["accepted_tokens"]
    assert sd["mean_acceptance_length"] == pytest.approx(
        1 + a["accepted_tokens"] / sd["num_spec_steps"], abs=1e-4
    )
    assert sd["draft_acceptance_rate"] == pytest.approx(
        a["accepted_tokens"] / a["drafted_tokens"], abs=1e-4
    )
    body = {"model": MODEL, "messages": ask, "max_tokens": 40, "temperature": 0,
            "stream": True, "user": "metrics-1"}  # fmt: skip
    chunks = []
    with httpx.Client(timeout=120) as h:
        with h.stream("POST", f"{spec.base_url}/chat/completions", json=body) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
    assert "metrics" in chunks[-1] and all("metrics" not in c for c in chunks[:-1])
    streamed = chunks[-1]["metrics"]["speculative_decoding"]
    assert set(streamed) == set(sd) and streamed["num_spec_steps"] >= 1


def test_interleaved_sessions_keep_their_prefix(servers) -> None:
    """Two sessions sharing a system prompt, called A, B, A, B: each second call finds
    its first call's tokens in a slot and prefills only what is new."""
    _, plain, _ = servers
    system = {"role": "system", "content": "You are a helpful assistant. (prefix test)"}
    first = {
        s: [system, {"role": "user", "content": f"Name three {s} animals, one per line."}]
        for s in ("sea", "desert")
    }
    r1 = {s: chat(plain, m, extra_headers=IDS) for s, m in first.items()}
    r2 = {}
    for s, m in first.items():
        answer = r1[s].choices[0].message.content
        follow = [*m, {"role": "assistant", "content": answer},
                  {"role": "user", "content": "And one more?"}]  # fmt: skip
        r2[s] = chat(plain, follow, extra_headers=IDS)
    for s in first:
        n1 = len(r1[s].model_extra["agspec"]["prompt_ids"])
        assert r2[s].model_extra["agspec"]["reused_prompt_tokens"] >= n1 - 1, s


@pytest.fixture
def two_slots(model_path):
    srv = _start(["--parallel", "2", "--drafter", "none", "--queue-timeout", "3"])
    yield srv
    assert srv.stop() == 0


def _open_stream(srv: ServerProcess, h: Any, messages: list[dict[str, str]]) -> Any:
    body = {"model": MODEL, "messages": messages, "max_tokens": 1500, "temperature": 0,
            "stream": True}  # fmt: skip
    resp = h.send(h.build_request("POST", f"{srv.base_url}/chat/completions", json=body),
                  stream=True)  # fmt: skip
    assert resp.status_code == 200
    lines = resp.iter_lines()
    for line in lines:  # the first content chunk: the request holds a slot and decodes
        if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
            break
    # The line iterator stays referenced with the response: dropping it mid-body would
    # close the stream (a disconnect) when it is collected.
    resp.lines_left = lines
    return resp


def test_a_disconnect_frees_its_slot_for_a_waiting_request(two_slots) -> None:
    """Both slots decode long answers; a third request waits; one client goes away:
    the waiting request gets its slot and is answered while the other long answer is
    still being written (nothing one client does stalls the others)."""
    srv = two_slots
    before = srv.metrics().get('agspec_cancelled_total{reason="disconnected"}', 0)
    with httpx.Client(timeout=120) as h1, httpx.Client(timeout=120) as h2:
        s1 = _open_stream(srv, h1, LONG)
        s2 = _open_stream(srv, h2, LONG)
        assert srv.get_json("/health")["running"] == 2
        done: list[Any] = []
        waiter = threading.Thread(
            target=lambda: done.append(chat(srv, [{"role": "user", "content": "Say hi."}]))
        )
        waiter.start()
        wait_until(lambda: srv.get_json("/health")["queue_depth"] == 1)
        s1.close()  # the first client goes away
        waiter.join(timeout=120)
        assert done and done[0].choices[0].finish_reason in ("stop", "length")
        # The other long answer was never interrupted: it still holds its slot.
        assert srv.get_json("/health")["running"] >= 1
        s2.close()
    wait_until(lambda: srv.get_json("/health")["running"] == 0)
    after = srv.metrics()['agspec_cancelled_total{reason="disconnected"}']
    assert after == before + 2


def test_no_slot_within_the_queue_timeout_gets_503(two_slots) -> None:
    srv = two_slots
    with httpx.Client(timeout=120) as h1, httpx.Client(timeout=120) as h2:
        s1 = _open_stream(srv, h1, LONG)
        s2 = _open_stream(srv, h2, LONG)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4}  # fmt: skip
        r = httpx.post(f"{srv.base_url}/chat/completions", json=body, timeout=60)
        s1.close()
        s2.close()
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["code"] == "no_free_slot" and "--queue-timeout" in err["message"]
    assert int(r.headers["Retry-After"]) >= 1
    wait_until(lambda: srv.get_json("/health")["running"] == 0)
    assert chat(srv, [{"role": "user", "content": "Say hi."}], max_tokens=4).choices


def test_a_wrong_cost_profile_heals_within_200_steps(model_path, tmp_path) -> None:
    """Started with a profile where every extra token costs a whole step (drafting never
    pays), the default drafter drafts again within 200 verification steps of repetitive
    traffic: the server's own timed steps (and probes) correct the profile. Kept fixed, the
    same profile never drafts."""
    wrong = {
        "format": "agspec-cost-profile", "version": 1, "backend": "llama.cpp",
        "model": MODEL, "device": "cpu (deliberately wrong)", "context_tokens": 512,
        "batch_sizes": {"1": {"n_tokens": list(range(1, 34)),
                              "step_ms": [20.0 * n for n in range(1, 34)]}},
    }  # fmt: skip
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(wrong))
    srv = _start(["--parallel", "1", "--drafter", "agspec", "--cost-profile", str(path)])
    try:
        assert "drafting never pays" in srv.log()
        text = ("def area(width, height):\n    return width * height\n\n"
                "def perimeter(width, height):\n    return 2 * (width + height)\n")  # fmt: skip
        ask = [{"role": "user", "content": f"Repeat this code exactly:\n{text}"}]
        steps = drafted = calls = 0
        while drafted == 0 and steps <= 200:
            r = chat(srv, ask, user="heal", max_tokens=48)
            a = r.model_extra["agspec"]
            steps += a["steps"]
            drafted = a["drafted_tokens"]
            calls += 1
        health = srv.get_json("/health")["cost_profile"]
        print(f"\nwrong profile: drafting again after {steps} verification steps ({calls} "
              f"calls); live step costs {health['step_cost']['1']}")  # fmt: skip
        assert drafted > 0, f"no draft after {steps} steps: {health}"
        assert steps <= 200
        assert health["live_samples"] > 0 and health["source"] == str(path)
        assert srv.metrics()["agspec_cost_profile_live_samples"] > 0
    finally:
        assert srv.stop() == 0
    # The contrast: the same profile kept fixed (--fixed-cost-profile) never drafts over
    # 200 steps of the same traffic (the rule's ties go to the shorter length, so a
    # profile where every token costs a step drafts nothing; no timing decides this).
    srv = _start(["--parallel", "1", "--drafter", "agspec", "--cost-profile", str(path),
                  "--fixed-cost-profile"])  # fmt: skip
    try:
        steps = drafted = 0
        while steps <= 200:
            a = chat(srv, ask, user="heal", max_tokens=48).model_extra["agspec"]
            steps += a["steps"]
            drafted += a["drafted_tokens"]
        assert drafted == 0, f"a fixed never-pays profile drafted {drafted} tokens"
        assert srv.get_json("/health")["cost_profile"] is None  # no live profile kept
    finally:
        assert srv.stop() == 0
