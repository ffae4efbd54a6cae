"""A multi-agent coding pipeline that records its own sessions (issue 7).

- `tasks`: the bundled task repos (`agspec/data/tasks`).
- `agents`: the localizer's and coder's prompts and reply parsing.
- `diffapply` and `executor`: apply a unified diff, run the tests, report.
- `runner`: the turn loop, on llama.cpp (`LlamaLLM`) or a scripted fake (`ScriptedLLM`).

Its sessions are written by `agspec.traces.recorder` (resumable JSONL plus a live-stats
sidecar), as `agspec serve --record` writes its own. See docs/pipeline.md.
"""
