"""The routes of `agspec serve`, one `APIRouter` per endpoint family.

    health.py        GET /health, GET /v1/models, GET /v1/models/{id}, GET /metrics
    chat.py          POST /v1/chat/completions (streamed or not, tool calls)
    completions.py   POST /v1/completions (streamed or not, echo)
    common.py        what they share: `RouteContext` (model check, jobs, waiting,
                     counting), request reading, the access log, server-sent events

`agspec.serve.app.create_app` includes the three routers and the error handlers.
"""
