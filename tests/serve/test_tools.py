"""Tool calls through `agspec serve` with the default model (Qwen2.5-Coder-0.5B, whose
GGUF chat template renders tools): the `openai` client gets typed `tool_calls`, streamed
and not, and the conversation goes on with the tool's result.

Needs the `serve` extra, `openai`, llama-cpp-python and the Qwen GGUF; skips otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from guards import require_model, require_server

pytestmark = [pytest.mark.server, pytest.mark.slow]
openai = require_server().openai  # skips the module with the reason when one is missing

from agspec.serve.launch import ServerProcess  # noqa: E402

MODEL = "qwen2.5-coder-0.5b-instruct"
COST_PROFILE = (
    Path(__file__).resolve().parents[2]
    / "src/agspec/data/costmodels/epyc2t-llamacpp-qwen2.5-coder-0.5b-ctx1024.json"
)
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command and return its output",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]  # fmt: skip


@pytest.fixture(scope="module")
def server():
    require_model(MODEL)
    srv = ServerProcess(["--model", MODEL, "--threads", "1", "--n-ctx", "2048",
                         "--cost-profile", str(COST_PROFILE), "--fixed-cost-profile"])  # fmt: skip
    srv.start()
    yield srv
    assert srv.stop() == 0


def test_tool_calls_streamed_and_not(server) -> None:
    c = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    messages = [
        {"role": "system", "content": "You are a coding agent. Use the bash tool."},
        {"role": "user", "content": "List the files in the current directory."},
    ]
    r = c.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, temperature=0,
                                  max_tokens=64)  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "bash"
    assert isinstance(json.loads(call.function.arguments)["command"], str)

    stream = c.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                       temperature=0, max_tokens=64, stream=True)  # fmt: skip
    deltas, finish = [], None
    for chunk in stream:
        if chunk.choices:
            deltas.extend(chunk.choices[0].delta.tool_calls or [])
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and len(deltas) == 1
    assert deltas[0].function.name == "bash"
    assert deltas[0].function.arguments == call.function.arguments

    # The agent runs the tool and sends its result back; the server continues the session.
    result = {"role": "tool", "tool_call_id": call.id, "content": "README.md\nsetup.py"}
    follow = [*messages, choice.message.model_dump(exclude_none=True), result]
    r2 = c.chat.completions.create(model=MODEL, messages=follow, tools=TOOLS, temperature=0,
                                   max_tokens=32)  # fmt: skip
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
    info = r2.model_extra["agspec"]
    assert not info["session_new"] and info["session_known_units"] == 3
