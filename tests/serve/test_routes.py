"""The routers of `agspec serve` (agspec.serve.routes) against a stand-in engine: every
route is there once, and the answers that need no model (health, models, metrics, the
checks before a job is made) are the OpenAI-shaped ones. The real server's answers are
tested in test_api.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from guards import require_server

require_server()

from fastapi.testclient import TestClient  # noqa: E402

from agspec.drafter.session_inference import SessionResolver  # noqa: E402
from agspec.serve.app import create_app  # noqa: E402
from agspec.serve.engine import EngineConfig  # noqa: E402
from agspec.serve.metrics import ServeMetrics  # noqa: E402


class StandInEngine:
    """What the routes read of an `Engine`, without a model; submit fails (500)."""

    def __init__(self) -> None:
        self.metrics = ServeMetrics()
        self.model_name = "m"
        self.model_path = Path(__file__)
        self.config = EngineConfig(drafter="agspec")
        self.queue_depth = self.running = 0
        self.resolver = SessionResolver()
        self.cost_summary = None
        self.chat_template = None
        self.n_ctx = 16
        self.llm = SimpleNamespace(n_vocab=lambda: 100)
        self.failed: list[str] = []
        self.worker_failed = False

    def model_names(self) -> set[str]:
        return {"m", "alias"}

    def start(self) -> None: ...

    def close(self, *, timeout_s: float) -> None: ...

    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        return list(range(len(text)))

    def detokenize(self, ids: list[int]) -> str:
        return "x" * len(ids)

    def fail_session(self, sid: str) -> None:
        self.failed.append(sid)

    def submit(self, job: Any) -> None:
        raise RuntimeError("boom")


def routes_of(routes: Any) -> list[tuple[str, str]]:
    out = []
    for r in routes:
        if hasattr(r, "path"):
            out += [(m, r.path) for m in sorted(r.methods or ())]
        else:  # an included router (FastAPI >= 0.16x keeps it whole)
            out += routes_of(r.original_router.routes)
    return out


@pytest.fixture()
def stand_in() -> Any:
    engine = StandInEngine()
    with TestClient(create_app(engine), raise_server_exceptions=False) as c:  # type: ignore[arg-type]
        yield engine, c


def test_every_route_once() -> None:
    app = create_app(StandInEngine())  # type: ignore[arg-type]
    assert sorted(routes_of(app.routes)) == [
        ("GET", "/health"), ("GET", "/metrics"), ("GET", "/v1/models"),
        ("GET", "/v1/models/{model_id:path}"), ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
    ]  # fmt: skip


def test_health_says_when_the_decode_worker_stopped(stand_in: Any) -> None:
    engine, c = stand_in
    engine.worker_failed = True
    r = c.get("/health")
    assert r.status_code == 503 and r.json()["status"] == "worker_stopped"


def error(r: Any) -> tuple[int, str, str | None, str | None]:
    e = r.json()["error"]
    return r.status_code, e["message"], e["param"], e["code"]


def test_answers_without_a_model(stand_in: Any) -> None:
    engine, c = stand_in
    assert c.get("/health").json() == {
        "status": "ok", "model": "m", "drafter": "agspec", "queue_depth": 0, "running": 0,
        "parallel": 4, "sessions": 0, "cost_profile": None, "kv_store": None,
    }  # fmt: skip
    assert [d["id"] for d in c.get("/v1/models").json()["data"]] == ["m"]
    assert c.get("/v1/models/alias").json()["id"] == "m"
    missing = "model: the model 'zz' does not exist; this server serves 'm'"
    assert error(c.get("/v1/models/zz")) == (404, missing, "model", "model_not_found")
    assert error(c.get("/nope")) == (404, "GET /nope: Not Found", None, "not_found")
    assert error(c.get("/v1/completions"))[0] == 405
    r = c.get("/metrics")
    assert r.status_code == 200 and "agspec_queue_depth" in r.text

    def post(path: str, body: Any) -> Any:
        return c.post(path, content=body if isinstance(body, bytes) else json.dumps(body))

    empty = "the request body is empty; expected a JSON object"
    assert error(post("/v1/completions", b"")) == (400, empty, None, None)
    assert error(post("/v1/completions", {"model": "zz", "prompt": "hi"}))[0] == 404
    assert error(post("/v1/completions", {"prompt": [1, 200]})) == (
        400, "prompt: token id 200 is outside [0, 100)", "prompt", None)  # fmt: skip
    assert error(post("/v1/completions", {"prompt": "x" * 40})) == (
        400, "prompt: the prompt has 40 tokens; the context holds 16 (prompt and answer "
        "together)", "prompt", "context_length_exceeded")  # fmt: skip
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert error(post("/v1/chat/completions", chat))[:3] == (
        400, "messages: this model has no chat template in its GGUF metadata; use "
        "/v1/completions", "messages")  # fmt: skip
    # An unchecked failure once the job exists: 500, and its session may not be joined.
    assert error(post("/v1/completions", {"prompt": "hi"}))[:2] == (500, "internal error: boom")
    assert len(engine.failed) == 1
