"""The ASGI app of `agspec serve` (FastAPI on uvicorn).

    POST /v1/chat/completions   POST /v1/completions   GET /v1/models   GET /health
    GET /metrics (Prometheus text)

One router per endpoint family (`agspec.serve.routes`: health, chat, completions); this
module joins them with the lifespan and the error handlers. A route validates the
request (`agspec.serve.schema`), renders and tokenizes the prompt off the event loop,
resolves the session (`agspec.drafter.session_inference`), and hands a `Job` to the
engine's decode worker; it then waits on an asyncio queue that the worker fills from its
thread. Nothing here decodes. A client that disconnects sets the job's cancel flag, which
the generation loop checks before every step. Every error is an OpenAI-shaped body
(`{"error": {"message", "type", "param", "code"}}`); a stream that fails after it started
ends with such an object as its last `data:` event, then `[DONE]`.

Responses carry the AgSpec view of the call in headers (`X-AgSpec-Session`,
`X-AgSpec-Agent`) and, in non-streamed bodies, an `agspec` object (session, steps, drafted
and accepted tokens, timings; with the request header `X-AgSpec-Return-Ids: 1` also the
prompt and output token ids), which OpenAI clients ignore.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from agspec.serve.engine import Engine
from agspec.serve.routes.chat import chat_router
from agspec.serve.routes.common import RouteContext, access, error_response
from agspec.serve.routes.completions import completions_router
from agspec.serve.routes.health import health_router
from agspec.serve.schema import APIError

__all__ = ["create_app"]


def create_app(engine: Engine, *, drain_timeout_s: float = 30.0) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        yield
        # uvicorn has stopped accepting connections and waited for the open ones; end the
        # worker (queued jobs run, up to the drain timeout) and save the drafter state.
        await run_in_threadpool(engine.close, timeout_s=drain_timeout_s)

    app = FastAPI(title="agspec serve", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)  # fmt: skip

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        access.info(
            "%s %s %d %s", request.method, request.url.path, exc.status,
            f"param={exc.param}" if exc.param else exc.code or exc.type,
        )  # fmt: skip
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        err = APIError(
            exc.status_code,
            f"{request.method} {request.url.path}: {exc.detail}",
            code="not_found" if exc.status_code == 404 else None,
        )
        return error_response(err)

    @app.exception_handler(Exception)
    async def _any_error(request: Request, exc: Exception) -> JSONResponse:
        job = getattr(request.state, "job", None)
        if job is not None:  # no later request may join a session that failed unchecked
            engine.fail_session(job.resolution.session_id)
        return error_response(APIError(500, f"internal error: {exc}", type="server_error"))

    ctx = RouteContext(engine)
    for router in (health_router(ctx), chat_router(ctx), completions_router(ctx)):
        app.include_router(router)
    return app
