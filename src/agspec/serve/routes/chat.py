"""POST /v1/chat/completions: the prompt rendered with the model's chat template, tool
calls parsed from the answer; streamed as `chat.completion.chunk` events or not."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from agspec.drafter.session_inference import agent_name
from agspec.serve.chat import parse_tool_calls
from agspec.serve.engine import Finished, Job
from agspec.serve.routes.common import (
    RouteContext,
    client_ids,
    read_json,
    stream,
    usage,
    wants_ids,
)
from agspec.serve.schema import APIError, ChatRequest, parse_chat

__all__ = ["chat_router"]


def chat_router(ctx: RouteContext) -> APIRouter:
    engine = ctx.engine
    router = APIRouter()

    @router.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        t0 = time.monotonic()
        req: ChatRequest = parse_chat(await read_json(request))
        ctx.check_model(req.model)
        if engine.chat_template is None:
            raise APIError(400, "messages: this model has no chat template in its GGUF "
                           "metadata; use /v1/completions", param="messages")  # fmt: skip
        tools = req.tools if req.tool_choice != "none" else None
        prompt = await run_in_threadpool(engine.chat_template.render, req.messages, tools)
        ids = await run_in_threadpool(engine.tokenize, prompt, add_bos=False, special=True)
        if len(ids) >= engine.n_ctx:
            raise ctx.too_long(len(ids), "messages")
        system = next((mm["content"] for mm in req.messages if mm["role"] == "system"), None)
        agent, explicit = client_ids(request, agent_name(system), req.session)
        job, events = ctx.make_job(
            prompt_ids=ids, sampling=req.sampling, agent=agent, explicit=explicit, kind="chat",
            messages=req.messages, hold_all=bool(tools), stream=req.stream,
            return_ids=wants_ids(request),
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

        def choice(done: Finished) -> dict[str, Any]:
            answer = done.answer or {"role": "assistant", "content": done.text}
            message = {"role": "assistant", "content": answer.get("content")}
            if answer.get("tool_calls"):
                message["tool_calls"] = answer["tool_calls"]
                message["content"] = answer.get("content") or None
                return {"index": 0, "message": message, "logprobs": None,
                        "finish_reason": "tool_calls"}  # fmt: skip
            return {"index": 0, "message": message, "logprobs": None,
                    "finish_reason": done.finish_reason}  # fmt: skip

        return await ctx.answer(
            request, job, events, endpoint="chat", t0=t0, id_prefix="chatcmpl",
            obj="chat.completion", choice=choice,
            stream_body=lambda cid, created, count: _chat_stream(
                job, events, cid, created, engine.model_name, req.include_usage, count),
        )  # fmt: skip

    return router


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
                "model": model, "choices": [], "usage": usage(ev),
            })  # fmt: skip
        return out

    return stream(
        job, events, count,
        opening=[chunk({"role": "assistant", "content": ""})],
        on_delta=lambda text: chunk({"content": text}),
        on_finish=on_finish,
    )  # fmt: skip
