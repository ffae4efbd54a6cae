"""Chat templates from the GGUF metadata, and tool calls in the model's output.

The prompt of a chat request is rendered with the model's own template
(`tokenizer.chat_template` in the GGUF metadata) by llama-cpp-python's
`Jinja2ChatFormatter`, the same renderer, with the same variables, that
llama-cpp-python's own server uses for such a model (it picks it when the template is
not one of its built-in formats), and tokenized the same way (no extra BOS: the template
writes it; special tokens parsed). So the prompt ids, and a greedy answer, equal what
`python -m llama_cpp.server` gives for the same request (with `repeat_penalty: 1.0`:
that server penalises repeats by default even at temperature 0).

Tools: a template that mentions `tools` renders them (Qwen2.5 writes them into the
system message and asks for `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`);
the answer's `<tool_call>` blocks become OpenAI `tool_calls`. A template that does not
render tools, or renders them in a format this parser does not read, gets a 400.

>>> parse_tool_calls('ok <tool_call>\\n{"name": "bash", "arguments": {"cmd": "ls"}}\\n</tool_call>')
('ok', [('bash', '{"cmd": "ls"}')])
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from typing import Any

from agspec.serve.schema import APIError

__all__ = ["ChatTemplate", "parse_tool_calls", "TOOL_CALL_OPEN"]

TOOL_CALL_OPEN = "<tool_call>"
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_FENCED = re.compile(r"```(?:json)?\s*\n(.*?)\n?```", re.S)


def _as_call(obj: Any) -> tuple[str, str] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def parse_tool_calls(
    text: str, tool_names: Collection[str] | None = None
) -> tuple[str, list[tuple[str, str]]]:
    """(text outside the blocks, [(name, arguments as a JSON string)]) of `<tool_call>`
    blocks; a block that is not a JSON object with a string `name` stays in the text.

    Small models often drop the tags: with `tool_names`, an answer that is nothing but one
    JSON object (bare or in a fenced block) naming one of those tools, with `arguments`,
    is a call too.

    >>> parse_tool_calls('```json\\n{"name": "bash", "arguments": {"c": 1}}\\n```', {"bash"})
    ('', [('bash', '{"c": 1}')])
    """
    calls: list[tuple[str, str]] = []
    kept: list[str] = []
    pos = 0
    for m in _TOOL_CALL.finditer(text):
        try:
            call = _as_call(json.loads(m.group(1)))
        except ValueError:
            continue
        if call is None:
            continue
        calls.append(call)
        kept.append(text[pos : m.start()])
        pos = m.end()
    kept.append(text[pos:])
    if not calls and tool_names:
        bare = _FENCED.fullmatch(text.strip())
        body = bare.group(1) if bare else text.strip()
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
        call = _as_call(obj)
        if call is not None and call[0] in tool_names and "arguments" in obj:
            return "", [call]
    return "".join(kept).strip(), calls


def _template_message(m: dict[str, Any]) -> dict[str, Any]:
    """A message as templates expect it: string content; tool-call arguments as objects
    (what HF templates such as Qwen2.5's `tojson`), when they parse as JSON."""
    out = dict(m)
    if "tool_calls" in m:
        calls = []
        for c in m["tool_calls"]:
            fn = dict(c["function"])
            if isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except ValueError:
                    pass
            calls.append({**c, "function": fn})
        out["tool_calls"] = calls
    return out


class ChatTemplate:
    """The model's chat template (needs llama-cpp-python, for its Jinja2 formatter)."""

    def __init__(self, template: str, *, eos_token: str, bos_token: str) -> None:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.source = template
        self.eos_token = eos_token
        self._formatter = Jinja2ChatFormatter(
            template=template, eos_token=eos_token, bos_token=bos_token
        )
        self.renders_tools = "tools" in template
        self.parses_tools = self.renders_tools and TOOL_CALL_OPEN in template

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text; a template that rejects the messages gives a 400."""
        if tools and not self.renders_tools:
            raise APIError(
                400,
                "tools: this model's chat template does not render tools; send the tool "
                "descriptions in a message instead",
                param="tools",
            )
        if tools and not self.parses_tools:
            raise APIError(
                400,
                "tools: this model's chat template renders tools in a format whose tool "
                "calls this server cannot parse (it reads <tool_call> JSON blocks)",
                param="tools",
            )
        try:
            msgs: Any = [_template_message(m) for m in messages]
            tool_list: Any = tools or None
            result = self._formatter(messages=msgs, tools=tool_list)
        except Exception as exc:  # jinja2 errors and the template's raise_exception
            raise APIError(
                400, f"messages: the model's chat template rejected them: {exc}", param="messages"
            ) from None
        return str(result.prompt)
