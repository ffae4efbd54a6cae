"""GET /health, GET /v1/models, GET /v1/models/{id} and GET /metrics (Prometheus text)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from agspec.serve.engine import Engine
from agspec.serve.metrics import CONTENT_TYPE
from agspec.serve.routes.common import RouteContext

__all__ = ["health_router"]


def health_router(ctx: RouteContext) -> APIRouter:
    engine, m = ctx.engine, ctx.metrics
    router = APIRouter()

    @router.get("/health")
    async def health(response: Response) -> dict[str, Any]:
        if engine.worker_failed:  # nothing can be served: a load balancer should know
            response.status_code = 503
        return {
            "status": "worker_stopped" if engine.worker_failed else "ok",
            "model": engine.model_name,
            "drafter": engine.config.drafter,
            "queue_depth": engine.queue_depth,
            "running": engine.running,
            "parallel": engine.config.parallel,
            "sessions": len(engine.resolver),
            "cost_profile": engine.cost_summary,
            "kv_store": _kv_store(engine),
        }

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(engine)]}

    @router.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        ctx.check_model(model_id)
        return _model_card(engine)

    @router.get("/metrics")
    async def metrics() -> Response:
        m.queue_depth.set(engine.queue_depth)
        m.sessions.set(len(engine.resolver))
        return Response(m.render(), media_type=CONTENT_TYPE)

    return router


def _kv_store(engine: Engine) -> dict[str, int] | None:
    """The saved-KV store's budget and what it holds (None: `--kv-store 0`)."""
    loop = getattr(engine, "loop", None)
    store = getattr(loop, "kv_store", None)
    if store is None:
        return None
    return {"budget_bytes": store.budget_bytes, "bytes": store.nbytes, "entries": len(store)}


def _model_card(engine: Engine) -> dict[str, Any]:
    return {
        "id": engine.model_name,
        "object": "model",
        "created": int(engine.model_path.stat().st_mtime),
        "owned_by": "agspec",
    }
