"""The ASGI routes of `agspec serve` (FastAPI on uvicorn).

    POST /v1/chat/completions   POST /v1/completions   GET /v1/models   GET /health
    GET /metrics (Prometheus text)

A route validates the request (`agspec.serve.schema`), renders and tokenizes the prompt
off the event loop, resolves the session (`agspec.drafter.session_inference`), and hands a
`Job` to the engine's decode worker; it then waits on an asyncio queue that the worker
fills from its thread. Nothing here decodes. A client that disconnects sets the job's cancel flag,
which the generation loop checks before every step. Every error is an OpenAI-shaped body
(`{"error": {"message", "type", "param", "code"}}`); a stream that fails after it started
ends with such an object as its last `data:` event, then `[DONE]`.

Responses carry the AgSpec view of the call in headers (`X-AgSpec-Session`,
`X-AgSpec-Agent`) and, in non-streamed bodies, an `agspec` object (session, steps, drafted
and accepted tokens, timings; with the request header `X-AgSpec-Return-Ids: 1` also the
prompt and output token ids), which OpenAI clients ignore.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from agspec.drafter.session_inference import agent_name
from agspec.serve.chat import parse_tool_calls
from agspec.serve.engine import Delta, Engine, Failed, Finished, Job, QueueFull
from agspec.serve.metrics import CONTENT_TYPE
from agspec.serve.schema import (
    APIError,
    ChatRequest,
    CompletionRequest,
    parse_chat,
    parse_completion,
    safe_id,
)

__all__ = ["create_app"]

# The access log: one line per request (method, path, status, time, tokens, drafted and
# accepted tokens, session and agent ids, which are in their safe form by then).
access = logging.getLogger("agspec.serve.access")

MAX_BODY_BYTES = 64 << 20


def _error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def _read_json(request: Request) -> Any:
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


def create_app(engine: Engine, *, drain_timeout_s: float = 30.0) -> FastAPI:
    m = engine.metrics

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        yield
        # uvicorn has stopped accepting connections and waited for the open ones; end the
        # worker (queued jobs run, up to the drain timeout) and save the drafter state.
        await run_in_threadpool(engine.close, timeout_s=drain_timeout_s)

    app = FastAPI(title="agspec serve", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)  # fmt: skip
    names = engine.model_names()

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        access.info(
            "%s %s %d %s", request.method, request.url.path, exc.status,
            f"param={exc.param}" if exc.param else exc.code or exc.type,
        )  # fmt: skip
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        err = APIError(
            exc.status_code,
            f"{request.method} {request.url.path}: {exc.detail}",
            code="not_found" if exc.status_code == 404 else None,
        )
        return _error_response(err)

    @app.exception_handler(Exception)
    async def _any_error(request: Request, exc: Exception) -> JSONResponse:
        job = getattr(request.state, "job", None)
        if job is not None:  # no later request may join a session that failed unchecked
            engine.fail_session(job.resolution.session_id)
        return _error_response(APIError(500, f"internal error: {exc}", type="server_error"))

    def check_model(model: str | None) -> None:
        if model is not None and model not in names:
            raise APIError(
                404,
                f"model: the model {model!r} does not exist; this server serves "
                f"{engine.model_name!r}",
                param="model",
                code="model_not_found",
            )

    def too_long(n: int, param: str) -> APIError:
        return APIError(
            400,
            f"{param}: the prompt has {n} tokens; the context holds {engine.n_ctx} "
            "(prompt and answer together)",
            param=param,
            code="context_length_exceeded",
        )

    def submit(job: Job, endpoint: str) -> None:
        try:
            engine.submit(job)
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
        *, prompt_ids: list[int], sampling: Any, agent: str, explicit: str | None, kind: str,
        messages: list[dict[str, Any]] | None = None, prompt_text: str = "",
        hold_all: bool = False, stream: bool = False, return_ids: bool = False,
    ) -> tuple[Job, asyncio.Queue[Any]]:  # fmt: skip
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
        request: Request, job: Job, events: asyncio.Queue[Any]
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

    def headers_for(job: Job) -> dict[str, str]:
        return {"X-AgSpec-Session": job.resolution.session_id, "X-AgSpec-Agent": job.agent}

    def count(endpoint: str, job: Job, status: str, t0: float) -> None:
        m.requests.labels(endpoint, m.agent_label(job.agent), status).inc()
        m.latency.observe(time.monotonic() - t0)
        _log_access(job, endpoint, status, t0)

    # --- routes ---------------------------------------------------------------------------

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": engine.model_name,
            "drafter": engine.config.drafter,
            "queue_depth": engine.queue_depth,
            "running": engine.running,
            "parallel": engine.config.parallel,
            "sessions": len(engine.resolver),
            "cost_profile": engine.cost_summary,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(engine)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        check_model(model_id)
        return _model_card(engine)

    @app.get("/metrics")
    async def metrics() -> Response:
        m.queue_depth.set(engine.queue_depth)
        m.sessions.set(len(engine.resolver))
        return Response(m.render(), media_type=CONTENT_TYPE)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        t0 = time.monotonic()
        req: ChatRequest = parse_chat(await _read_json(request))
        check_model(req.model)
        if engine.chat_template is None:
            raise APIError(400, "messages: this model has no chat template in its GGUF "
                           "metadata; use /v1/completions", param="messages")  # fmt: skip
        tools = req.tools if req.tool_choice != "none" else None
        prompt = await run_in_threadpool(engine.chat_template.render, req.messages, tools)
        ids = await run_in_threadpool(engine.tokenize, prompt, add_bos=False, special=True)
        if len(ids) >= engine.n_ctx:
            raise too_long(len(ids), "messages")
        system = next((mm["content"] for mm in req.messages if mm["role"] == "system"), None)
        agent, explicit = _client_ids(request, agent_name(system), req.session)
        job, events = make_job(
            prompt_ids=ids, sampling=req.sampling, agent=agent, explicit=explicit, kind="chat",
            messages=req.messages, hold_all=bool(tools), stream=req.stream,
            return_ids=_wants_ids(request),
        )  # fmt: skip
        request.state.job = job
        use_tools = bool(tools)
        tool_names = {t["function"]["name"] for t in tools or ()}

        def on_done(done: Finished) -> dict[str, Any]:
            msg: dict[str, Any] = {"role": "assistant", "content": done.text}
            if use_tools:
                content, calls = parse_tool_calls(done.text, tool_names)
                if calls:
                    msg["content"] = content
                    msg["tool_calls"] = [
                        {"id": f"call_{secrets.token_hex(12)}", "type": "function",
                         "function": {"name": n, "arguments": a}}
                        for n, a in calls
                    ]  # fmt: skip
            return msg

        job.on_done = on_done
        submit(job, "chat")
        cid = f"chatcmpl-{secrets.token_hex(12)}"
        created = int(time.time())
        if req.stream:
            return StreamingResponse(
                _chat_stream(job, events, cid, created, engine.model_name, req.include_usage,
                             lambda status: count("chat", job, status, t0)),
                media_type="text/event-stream", headers=headers_for(job),
            )  # fmt: skip
        done = await wait_result(request, job, events)
        if done is None:
            count("chat", job, "499", t0)
            return Response(status_code=499)
        answer = done.answer or {"role": "assistant", "content": done.text}
        finish = "tool_calls" if answer.get("tool_calls") else done.finish_reason
        message = {"role": "assistant", "content": answer.get("content")}
        if answer.get("tool_calls"):
            message["tool_calls"] = answer["tool_calls"]
            message["content"] = answer.get("content") or None
        body = {
            "id": cid, "object": "chat.completion", "created": created,
            "model": engine.model_name,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": finish}],
            "usage": _usage(done),
            "metrics": _metrics(done),
            "agspec": done.stats,
        }  # fmt: skip
        count("chat", job, "200", t0)
        return JSONResponse(body, headers=headers_for(job))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        t0 = time.monotonic()
        req: CompletionRequest = parse_completion(await _read_json(request))
        check_model(req.model)
        if isinstance(req.prompt, str):
            text = req.prompt
            ids = await run_in_threadpool(engine.tokenize, text, add_bos=True, special=True)
        else:
            ids = req.prompt
            n_vocab = engine.llm.n_vocab()
            bad = next((t for t in ids if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise APIError(400, f"prompt: token id {bad} is outside [0, {n_vocab})",
                               param="prompt")  # fmt: skip
            text = engine.detokenize(ids)
        if not ids:
            raise APIError(400, "prompt: is empty after tokenization", param="prompt")
        if len(ids) >= engine.n_ctx:
            raise too_long(len(ids), "prompt")
        agent, explicit = _client_ids(request, "agent-default", req.session)
        job, events = make_job(
            prompt_ids=ids, sampling=req.sampling, agent=agent, explicit=explicit,
            kind="completion", prompt_text=text, stream=req.stream,
            return_ids=_wants_ids(request),
        )  # fmt: skip
        request.state.job = job
        submit(job, "completions")
        cid = f"cmpl-{secrets.token_hex(12)}"
        created = int(time.time())
        echo = text if req.echo else ""
        if req.stream:
            return StreamingResponse(
                _completion_stream(job, events, cid, created, engine.model_name,
                                   req.include_usage, echo,
                                   lambda status: count("completions", job, status, t0)),
                media_type="text/event-stream", headers=headers_for(job),
            )  # fmt: skip
        done = await wait_result(request, job, events)
        if done is None:
            count("completions", job, "499", t0)
            return Response(status_code=499)
        body = {
            "id": cid, "object": "text_completion", "created": created,
            "model": engine.model_name,
            "choices": [{"text": echo + done.text, "index": 0, "logprobs": None,
                         "finish_reason": done.finish_reason}],
            "usage": _usage(done),
            "metrics": _metrics(done),
            "agspec": done.stats,
        }  # fmt: skip
        count("completions", job, "200", t0)
        return JSONResponse(body, headers=headers_for(job))

    return app


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


def _client_ids(request: Request, agent: str, session: str | None) -> tuple[str, str | None]:
    """The agent and explicit session of a request, each in the safe form (`safe_id`):
    the X-AgSpec-Agent / X-AgSpec-Session headers win over the body's ids."""
    raw_agent = request.headers.get("x-agspec-agent")
    if raw_agent:
        agent = safe_id(raw_agent, "X-AgSpec-Agent")
    raw_session = request.headers.get("x-agspec-session")
    if raw_session:
        session = safe_id(raw_session, "X-AgSpec-Session")
    return agent, session


def _wants_ids(request: Request) -> bool:
    return request.headers.get("x-agspec-return-ids", "").lower() in ("1", "true", "yes")


def _model_card(engine: Engine) -> dict[str, Any]:
    return {
        "id": engine.model_name,
        "object": "model",
        "created": int(engine.model_path.stat().st_mtime),
        "owned_by": "agspec",
    }


def _usage(done: Finished) -> dict[str, int]:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }


def _metrics(done: Finished) -> dict[str, Any]:
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


async def _stream(
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
            closing[-1]["metrics"] = _metrics(ev)
            for c in closing:
                yield _sse(c)
            yield _DONE
            count("200")
    finally:
        if not finished:
            job.cancel.set()  # the client went away (the stream was cancelled)
            count("499")


def _chat_stream(
    job: Job, events: asyncio.Queue[Any], cid: str, created: int, model: str,
    include_usage: bool, count: Any,
) -> AsyncIterator[bytes]:  # fmt: skip
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {
            "id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }  # fmt: skip
        if include_usage:
            c["usage"] = None
        return c

    def on_finish(ev: Finished, sent: str) -> list[dict[str, Any]]:
        answer = ev.answer or {"role": "assistant", "content": ev.text}
        calls = answer.get("tool_calls")
        rest = (answer.get("content") or "") if calls else ev.text[len(sent) :]
        out = [chunk({"content": rest})] if rest else []
        if calls:
            out.append(chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}))
        out.append(chunk({}, "tool_calls" if calls else ev.finish_reason))
        if include_usage:
            out.append({
                "id": cid, "object": "chat.completion.chunk", "created": created,
                "model": model, "choices": [], "usage": _usage(ev),
            })  # fmt: skip
        return out

    return _stream(
        job, events, count,
        opening=[chunk({"role": "assistant", "content": ""})],
        on_delta=lambda text: chunk({"content": text}),
        on_finish=on_finish,
    )  # fmt: skip


def _completion_stream(
    job: Job, events: asyncio.Queue[Any], cid: str, created: int, model: str,
    include_usage: bool, echo: str, count: Any,
) -> AsyncIterator[bytes]:  # fmt: skip
    def chunk(text: str, finish: str | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {
            "id": cid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
        }  # fmt: skip
        if include_usage:
            c["usage"] = None
        return c

    def on_finish(ev: Finished, sent: str) -> list[dict[str, Any]]:
        out = [chunk(ev.text[len(sent) :], ev.finish_reason)]
        if include_usage:
            out.append({
                "id": cid, "object": "text_completion", "created": created,
                "model": model, "choices": [], "usage": _usage(ev),
            })  # fmt: skip
        return out

    return _stream(
        job, events, count, opening=[chunk(echo)] if echo else [], on_delta=chunk,
        on_finish=on_finish,
    )  # fmt: skip
