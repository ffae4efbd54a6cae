"""What the routes of `agspec serve` share.

`RouteContext` is the engine as a route sees it: the model check, a `Job` made and
submitted, its answer awaited, the request counted and logged. The functions below read
a request (body, client ids), shape the `usage` / `metrics` objects of an answer, and
write a streamed answer as server-sent events (`stream`), for both endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agspec.serve.engine import Delta, Engine, Failed, Finished, Job, QueueFull
from agspec.serve.schema import APIError, safe_id

__all__ = [
    "MAX_BODY_BYTES",
    "RouteContext",
    "access",
    "client_ids",
    "error_response",
    "read_json",
    "speculative_metrics",
    "stream",
    "usage",
    "wants_ids",
]

# The access log: one line per request (method, path, status, time, tokens, drafted and
# accepted tokens, session and agent ids, which are in their safe form by then).
access = logging.getLogger("agspec.serve.access")

MAX_BODY_BYTES = 64 << 20


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def read_json(request: Request) -> Any:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB")
    if not raw.strip():
        raise APIError(400, "the request body is empty; expected a JSON object")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class RouteContext:
    """The engine, its metrics and its model names, with what every generating route does
    around a `Job`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.metrics = engine.metrics
        self.names = engine.model_names()

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.names:
            raise APIError(
                404,
                f"model: the model {model!r} does not exist; this server serves "
                f"{self.engine.model_name!r}",
                param="model",
                code="model_not_found",
            )

    def too_long(self, n: int, param: str) -> APIError:
        return APIError(
            400,
            f"{param}: the prompt has {n} tokens; the context holds {self.engine.n_ctx} "
            "(prompt and answer together)",
            param=param,
            code="context_length_exceeded",
        )

    def submit(self, job: Job, endpoint: str) -> None:
        m = self.metrics
        try:
            self.engine.submit(job)
        except QueueFull as exc:
            m.rejected.labels("queue_full").inc()
            m.requests.labels(endpoint, m.agent_label(job.agent), "503").inc()
            raise APIError(
                503,
                "the server is busy: the request queue is full; retry later",
                type="server_error",
                code="queue_full",
                headers={"Retry-After": str(exc.retry_after_s)},
            ) from None

    def make_job(
        self, *, prompt_ids: list[int], sampling: Any, agent: str, explicit: str | None,
        kind: str, messages: list[dict[str, Any]] | None = None, prompt_text: str = "",
        hold_all: bool = False, stream: bool = False, return_ids: bool = False,
    ) -> tuple[Job, asyncio.Queue[Any]]:  # fmt: skip
        engine, m = self.engine, self.metrics
        if messages is not None:
            res = engine.resolver.resolve_messages(messages, explicit=explicit)
        else:
            res = engine.resolver.resolve_tokens(prompt_ids, explicit=explicit)
        kind_label = "explicit" if res.explicit else "new" if res.is_new else "continued"
        m.session_requests.labels(kind_label).inc()
        m.known_messages.inc(res.num_known_units if messages is not None else 0)
        m.sessions.set(len(engine.resolver))
        events: asyncio.Queue[Any] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def emit(ev: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone at shutdown
                loop.call_soon_threadsafe(events.put_nowait, ev)

        job = Job(
            prompt_ids=prompt_ids, sampling=sampling, emit=emit, agent=agent, resolution=res,
            kind=kind, messages=messages or [], prompt_text=prompt_text, hold_all=hold_all,
            stream=stream, deadline=time.monotonic() + engine.config.request_timeout_s,
        )  # fmt: skip
        job.return_ids = return_ids
        return job, events

    async def wait_result(
        self, request: Request, job: Job, events: asyncio.Queue[Any]
    ) -> Finished | None:
        """The finished answer; None if the client went away (the job is cancelled)."""
        gone = asyncio.ensure_future(_wait_disconnect(request))
        try:
            while True:
                getter = asyncio.ensure_future(events.get())
                done, _ = await asyncio.wait({getter, gone}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    job.cancel.set()
                    return None
                ev = getter.result()
                if isinstance(ev, (Failed, Finished)):
                    job.final = ev
                if isinstance(ev, Failed):
                    raise ev.error
                if isinstance(ev, Finished):
                    return None if ev.finish_reason == "cancelled" else ev
        except asyncio.CancelledError:
            job.cancel.set()
            raise
        finally:
            gone.cancel()

    async def answer(
        self, request: Request, job: Job, events: asyncio.Queue[Any], *, endpoint: str,
        t0: float, id_prefix: str, obj: str,
        stream_body: Callable[[str, int, Callable[[str], None]], AsyncIterator[bytes]],
        choice: Callable[[Finished], dict[str, Any]],
    ) -> Response:  # fmt: skip
        """Submits `job` and answers it, as both endpoints do: server-sent events from
        `stream_body(id, created, count)` when the job streams, else one JSON body of
        object `obj` whose only choice is `choice(done)`, with `usage`, vLLM's
        `metrics.speculative_decoding` and our `agspec` stats. A client gone before the
        end is counted as 499."""
        self.submit(job, endpoint)
        cid = f"{id_prefix}-{secrets.token_hex(12)}"
        created = int(time.time())

        def count(status: str) -> None:
            self.count(endpoint, job, status, t0)

        if job.stream:
            return StreamingResponse(
                stream_body(cid, created, count), media_type="text/event-stream",
                headers=self.headers_for(job),
            )  # fmt: skip
        done = await self.wait_result(request, job, events)
        if done is None:
            count("499")
            return Response(status_code=499)
        body = {
            "id": cid, "object": obj, "created": created, "model": self.engine.model_name,
            "choices": [choice(done)], "usage": usage(done),
            "metrics": speculative_metrics(done), "agspec": done.stats,
        }  # fmt: skip
        count("200")
        return JSONResponse(body, headers=self.headers_for(job))

    @staticmethod
    def headers_for(job: Job) -> dict[str, str]:
        return {"X-AgSpec-Session": job.resolution.session_id, "X-AgSpec-Agent": job.agent}

    def count(self, endpoint: str, job: Job, status: str, t0: float) -> None:
        m = self.metrics
        m.requests.labels(endpoint, m.agent_label(job.agent), status).inc()
        m.latency.observe(time.monotonic() - t0)
        _log_access(job, endpoint, status, t0)


def _log_access(job: Job, endpoint: str, status: str, t0: float) -> None:
    """One line per answered request: endpoint, status, time, tokens, drafting, ids."""
    if not access.isEnabledFor(logging.INFO):
        return
    done = job.final if isinstance(job.final, Finished) else None
    stats = done.stats if done is not None else {}
    access.info(
        "POST /v1/%s %s %.0fms prompt=%d completion=%d drafted=%d accepted=%d "
        "session=%s agent=%s",
        "chat/completions" if endpoint == "chat" else endpoint, status,
        (time.monotonic() - t0) * 1000.0, len(job.prompt_ids),
        done.completion_tokens if done is not None else 0,
        stats.get("drafted_tokens", 0), stats.get("accepted_tokens", 0),
        job.resolution.session_id, job.agent,
    )  # fmt: skip


def client_ids(request: Request, agent: str, session: str | None) -> tuple[str, str | None]:
    """The agent and explicit session of a request, each in the safe form (`safe_id`):
    the X-AgSpec-Agent / X-AgSpec-Session headers win over the body's ids."""
    raw_agent = request.headers.get("x-agspec-agent")
    if raw_agent:
        agent = safe_id(raw_agent, "X-AgSpec-Agent")
    raw_session = request.headers.get("x-agspec-session")
    if raw_session:
        session = safe_id(raw_session, "X-AgSpec-Session")
    return agent, session


def wants_ids(request: Request) -> bool:
    return request.headers.get("x-agspec-return-ids", "").lower() in ("1", "true", "yes")


def usage(done: Finished) -> dict[str, int]:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }


def speculative_metrics(done: Finished) -> dict[str, Any]:
    """vLLM's per-request metrics object: `{"speculative_decoding": {...}}`."""
    return {"speculative_decoding": done.speculative_decoding}


async def _events_until_done(
    job: Job, events: asyncio.Queue[Any]
) -> AsyncIterator[Delta | Finished | Failed]:
    while True:
        ev = await events.get()
        yield ev
        if not isinstance(ev, Delta):
            return


_DONE = b"data: [DONE]\n\n"


async def stream(
    job: Job,
    events: asyncio.Queue[Any],
    count: Any,
    *,
    opening: list[dict[str, Any]],
    on_delta: Callable[[str], dict[str, Any]],
    on_finish: Callable[[Finished, str], list[dict[str, Any]]],
) -> AsyncIterator[bytes]:
    """The server-sent events of one streamed answer, for both endpoints: the `opening`
    chunks, a chunk per text delta, then the endpoint's closing chunks (`on_finish(done,
    text_sent)`) and `[DONE]`; a failure sends its OpenAI-shaped error body and `[DONE]`.
    A client that goes away (the generator is closed early) cancels the job; every
    outcome is counted once (`count(status)`)."""
    sent = ""
    finished = False
    try:
        for c in opening:
            yield _sse(c)
        async for ev in _events_until_done(job, events):
            if isinstance(ev, Delta):
                sent += ev.text
                yield _sse(on_delta(ev.text))
                continue
            finished = True
            job.final = ev
            if isinstance(ev, Failed):
                count(str(ev.error.status))
                yield _sse(ev.error.body())
                yield _DONE
                return
            if ev.finish_reason == "cancelled":
                count("499")
                return
            closing = on_finish(ev, sent)
            # The last chunk carries vLLM's per-request metrics object.
            closing[-1]["metrics"] = speculative_metrics(ev)
            for c in closing:
                yield _sse(c)
            yield _DONE
            count("200")
    finally:
        if not finished:
            job.cancel.set()  # the client went away (the stream was cancelled)
            count("499")
