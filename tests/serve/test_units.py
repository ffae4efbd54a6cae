"""The parts of `agspec serve` that need no model: text streaming with stop strings,
request validation, tool-call parsing, and (with llama-cpp-python and the Qwen GGUF's
metadata) the chat template rendering tools and tool messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from guards import require_engine, require_model
from hypothesis import given, settings
from hypothesis import strategies as st

from agspec.serve.chat import parse_tool_calls
from agspec.serve.schema import APIError, parse_chat, parse_completion
from agspec.serve.text import TextStream

# Pieces with multi-byte characters split across tokens ("é" = c3 a9, "€" = e2 82 ac).
PIECES = {1: b"ab", 2: b"c", 3: b"\xc3", 4: b"\xa9", 5: b" x", 6: b"\xe2\x82", 7: b"\xac",
          8: b"STOP", 9: b"S", 10: b"TO", 11: b"P!", 12: b"\xff"}  # fmt: skip
EOG = {0}


def _reference(tokens: list[int], stops: tuple[str, ...]) -> tuple[str, bool]:
    """Brute force: the whole text up to the first end-of-generation token, cut at the
    earliest stop string."""
    body = []
    for t in tokens:
        if t in EOG:
            break
        body.append(t)
    text = b"".join(PIECES[t] for t in body).decode("utf-8", errors="ignore")
    hits = [text.find(s) for s in stops if s and s in text]
    return (text[: min(hits)], True) if hits else (text, False)


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.sampled_from([0, *PIECES]), max_size=30),
    cuts=st.lists(st.integers(1, 5), max_size=30),
    stops=st.lists(st.sampled_from(["STOP", "x", "c\u00e9", "P!", "zz"]), max_size=3),
)
def test_streamed_text_equals_the_whole_text(tokens, cuts, stops) -> None:
    """However the tokens arrive (steps of 1-5), the streamed deltas concatenate to the
    text of the whole answer, cut at the earliest stop string, and no delta ever holds
    text past a stop."""
    ts = TextStream(lambda t: PIECES[t], stops=tuple(stops), eog=EOG)
    sent = []
    i = 0
    for c in [*cuts, len(tokens)]:
        if i >= len(tokens):
            break
        ts.add(tokens[i : i + c])
        i += c
        sent.append(ts.pending())
    sent.append(ts.pending(final=True))
    want, stopped = _reference(tokens, tuple(stops))
    assert "".join(sent) == want == ts.text
    assert ts.stopped == stopped


def test_usage_counts_the_token_that_completed_the_stop() -> None:
    ts = TextStream(lambda t: PIECES[t], stops=("STOP",), eog=EOG)
    ts.add([1, 9, 10])  # "abSTO": "STO" is held back
    assert ts.pending() == "ab" and not ts.stopped
    ts.add([11, 2, 2])  # "P!" completes "STOP"; the tokens after it do not count
    assert ts.stopped and ts.text == "ab" and ts.num_tokens == 4


def test_tool_call_parsing() -> None:
    text = 'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n'
    text += '</tool_call>\n<tool_call>{"name": "read", "arguments": "{\\"p\\": 1}"}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me look."
    assert calls[0][0] == "bash" and json.loads(calls[0][1]) == {"command": "ls -la"}
    assert calls[1] == ("read", '{"p": 1}')
    # Not JSON, or no name: left in the text, no call.
    content, calls = parse_tool_calls("<tool_call>oops</tool_call>")
    assert calls == [] and content == "<tool_call>oops</tool_call>"


def test_validation_normalises_messages_and_reads_sessions() -> None:
    req = parse_chat({
        "model": "m", "user": "u-1",
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "be "}, "brief"]},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "bash", "arguments": "{\"c\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
        "max_tokens": 50, "max_completion_tokens": 20, "stop": "END", "seed": 3,
    })  # fmt: skip
    assert req.messages[0] == {"role": "system", "content": "be brief"}
    assert req.messages[2]["content"] == "" and req.messages[2]["tool_calls"][0]["id"] == "c1"
    assert req.messages[3]["tool_call_id"] == "c1"
    assert req.sampling.max_tokens == 20 and req.sampling.stop == ("END",)
    assert req.session == "u-1" and not req.sampling.greedy
    meta = parse_chat({"messages": [{"role": "user", "content": "x"}], "temperature": 0,
                       "metadata": {"session_id": "s9"}, "user": "u"})  # fmt: skip
    assert meta.session == "s9" and meta.sampling.greedy
    comp = parse_completion({"prompt": ["only one"]})
    assert comp.prompt == "only one" and comp.sampling.max_tokens == 16


@pytest.mark.parametrize(
    "body,param",
    [
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "x", "name": 3}]}, "messages[0].name"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]},
         "messages[0].tool_calls[0].function.name"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval"}]},
         "tools[0].type"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto",
          "tools": "bash"}, "tools"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": True,
          "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
        ({"messages": [{"role": "user", "content": "x"}], "metadata": []}, "metadata"),
        ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"1": 5}}, "logit_bias"),
    ],
)  # fmt: skip
def test_validation_names_the_field(body, param) -> None:
    with pytest.raises(APIError) as info:
        parse_chat(body)
    assert info.value.status == 400 and info.value.param == param
    assert info.value.body()["error"]["message"].startswith(param)


def test_qwen_template_renders_tools_and_tool_messages() -> None:
    llama_cpp = require_engine("llama_cpp")
    from agspec.serve.chat import ChatTemplate

    path = require_model("qwen2.5-coder-0.5b-instruct")
    meta = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False).metadata
    tpl = ChatTemplate(meta["tokenizer.chat_template"], eos_token="<|im_end|>", bos_token="")
    assert tpl.renders_tools and tpl.parses_tools
    params = {"type": "object", "properties": {"command": {"type": "string"}}}
    fn = {"name": "bash", "description": "run a command", "parameters": params}
    tools = [{"type": "function", "function": fn}]
    req = parse_chat({"messages": [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py\nb.py"},
    ], "tools": tools})  # fmt: skip
    prompt = tpl.render(req.messages, req.tools)
    assert prompt.startswith("<|im_start|>system\nYou fix bugs.\n\n# Tools")
    assert '"name": "bash"' in prompt
    # The earlier call is rendered the way the model writes one (arguments as an object).
    assert '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>' in prompt
    assert "<tool_response>\na.py\nb.py\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    # A template without tools refuses them with a 400 naming the field.
    plain = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", eos_token="",
                         bos_token="")  # fmt: skip
    with pytest.raises(APIError) as info:
        plain.render(req.messages, req.tools)
    assert info.value.param == "tools"
    bad = ChatTemplate("{{ raise_exception('roles must alternate') }}", eos_token="",
                       bos_token="")  # fmt: skip
    with pytest.raises(APIError, match="roles must alternate"):
        bad.render(req.messages)


def test_fast_sampling_picks_the_full_sort_token() -> None:
    """`Sampling.sample` sorts only the likeliest tokens; for the same draw it must pick
    the token of the full sort, whatever the logits (peaked, flat, with ties)."""
    import random

    import numpy as np

    from agspec.adapters.llama_cpp import Sampling

    gen = np.random.default_rng(3)
    grid = [(t, k, p) for t in (0.5, 1.0, 1.7) for k in (0, 1, 40, 300) for p in (1.0, 0.9, 0.3)]
    settings_ = [Sampling(temperature=t, top_k=k, top_p=p) for t, k, p in grid]
    checked = 0
    for trial in range(30):
        n = int(gen.choice([50, 3000, 40_000]))
        z = gen.normal(0, float(gen.choice([0.5, 2.0, 4.0])), n).astype(np.float32)
        if trial % 3 == 0:
            z[gen.integers(0, n, 20)] += 12  # peaked, as a language model's logits are
        if trial % 4 == 0:
            z = np.round(z)  # many exact ties
        for s in settings_:
            seed = int(gen.integers(0, 2**31))
            u = random.Random(seed).random()
            assert s.sample(z, random.Random(seed)) == s.sample_full_sort(z, u), (trial, s)
            checked += 1
    assert checked == 30 * len(settings_)


def test_a_step_decodes_the_width_that_pays_taking_turns() -> None:
    """`BatchLoop._decode_width` against the measured profiles: on the 2-core CPU (a second
    row costs 2.2 one-row steps, three 2.8, four 3.0) two decoding requests take turns
    one at a time, each in the order it last stepped, and three or four step together; on
    the H200 profile (memory-bound: a wider step costs little more) every request steps.
    Oracle: the width is the brute-force argmax of k / step_time_ms(1, k)."""
    from types import SimpleNamespace

    from agspec.policy.costmodel import ProfileCostModel
    from agspec.serve.batching import BatchLoop

    data = Path(__file__).resolve().parents[2] / "src" / "agspec" / "data" / "costmodels"
    cpu = ProfileCostModel.load(data / "epyc2t-llamacpp-qwen2.5-coder-0.5b-ctx1024.json")
    gpu = ProfileCostModel.load(data / "h200-qwen2.5-7b-ctx4096.json")

    def width(costs: ProfileCostModel, n: int) -> int:
        return max(range(1, n + 1), key=lambda k: (k / costs.step_time_ms(1, k), k))

    for costs, name in ((cpu, "cpu"), (gpu, "gpu")):
        for n in (1, 2, 3, 4, 6):
            loop = SimpleNamespace(engine=SimpleNamespace(step_costs=costs, live_cost=None),
                                   num_steps=1)  # fmt: skip
            reqs = [SimpleNamespace(last_step=-1, slot=i) for i in range(n)]
            seen: list[list[int]] = []
            for step in range(6):
                chosen = BatchLoop._decode_width(loop, reqs)  # type: ignore[arg-type]
                assert len(chosen) == width(costs, n), (name, n)
                seen.append([r.slot for r in chosen])
                for r in chosen:
                    r.last_step = step
            if name == "cpu" and n == 2:
                # One at a time, in turn.
                assert seen == [[0], [1]] * 3
            if name == "gpu":
                assert seen == [list(range(n))] * 6
    assert width(cpu, 2) == 1 and width(cpu, 3) == 3 and width(cpu, 4) == 4
    # No step costs: every decoding request steps.
    loop = SimpleNamespace(engine=SimpleNamespace(step_costs=None, live_cost=None), num_steps=1)
    reqs = [SimpleNamespace(last_step=-1, slot=i) for i in range(3)]
    assert BatchLoop._decode_width(loop, reqs) == reqs  # type: ignore[arg-type]
