"""POST /v1/completions: a text or token-id prompt, optionally echoed; streamed as
`text_completion` events or not."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from agspec.serve.engine import Finished, Job
from agspec.serve.routes.common import (
    RouteContext,
    client_ids,
    read_json,
    stream,
    usage,
    wants_ids,
)
from agspec.serve.schema import APIError, CompletionRequest, parse_completion

__all__ = ["completions_router"]


def completions_router(ctx: RouteContext) -> APIRouter:
    engine = ctx.engine
    router = APIRouter()

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        t0 = time.monotonic()
        req: CompletionRequest = parse_completion(await read_json(request))
        ctx.check_model(req.model)
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
            raise ctx.too_long(len(ids), "prompt")
        agent, explicit = client_ids(request, "agent-default", req.session)
        job, events = ctx.make_job(
            prompt_ids=ids, sampling=req.sampling, agent=agent, explicit=explicit,
            kind="completion", prompt_text=text, stream=req.stream,
            return_ids=wants_ids(request),
        )  # fmt: skip
        request.state.job = job
        echo = text if req.echo else ""
        return await ctx.answer(
            request, job, events, endpoint="completions", t0=t0, id_prefix="cmpl",
            obj="text_completion",
            choice=lambda done: {"text": echo + done.text, "index": 0, "logprobs": None,
                                 "finish_reason": done.finish_reason},
            stream_body=lambda cid, created, count: _completion_stream(
                job, events, cid, created, engine.model_name, req.include_usage, echo, count),
        )  # fmt: skip

    return router


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
                "model": model, "choices": [], "usage": usage(ev),
            })  # fmt: skip
        return out

    return stream(
        job, events, count, opening=[chunk(echo)] if echo else [], on_delta=chunk,
        on_finish=on_finish,
    )  # fmt: skip
