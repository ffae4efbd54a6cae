"""`agspec serve`: an OpenAI-compatible HTTP server with AgSpec drafting (docs/serve.md).

Layers: `app` (ASGI routes, validation in `schema`, chat templates and tool calls in
`chat`) → `engine` (one decode worker thread over `agspec.adapters.llama_cpp.generate`,
text and stop strings in `text`) → session inference
(`agspec.drafter.session_inference`) → the drafter (`agspec.drafter.AgSpecServer`).
`metrics` (Prometheus), `record` (`--record` traces), `profile_cache` (the start-up cost
profile). Needs the `serve` extra.
"""
