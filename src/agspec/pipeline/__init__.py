"""A multi-agent coding pipeline that records its own sessions (issue 7).

- `tasks`: the bundled task repos (`agspec/data/tasks`).
- `agents`: the localizer's and coder's prompts and reply parsing.
- `diffapply` and `executor`: apply a unified diff, run the tests, report.
- `runner`: the turn loop, on llama.cpp (`LlamaLLM`) or a scripted fake (`ScriptedLLM`).
- `recorder`: resumable JSONL output in the AgSpec trace format plus a live-stats sidecar.

See docs/pipeline.md.
"""
