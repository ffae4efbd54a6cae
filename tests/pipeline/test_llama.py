"""The pipeline's model wrapper on the real model (Qwen2.5-Coder-0.5B on llama.cpp), tiny.

Skips when llama-cpp-python or the GGUF is absent. One localizer call (about 170 prompt
tokens, 12 output tokens): AgSpec's live steps commit exactly the greedy output, and
replaying the recorded call gives the live accept lengths step for step. The full turn
loop is tested with a scripted model in `test_pipeline_runner.py` (a real session takes
minutes on a shared CPU).
"""

from __future__ import annotations

import pytest
from guards import require_engine, require_model

pytestmark = [pytest.mark.engine("llama_cpp"), pytest.mark.slow]
require_engine("llama_cpp")
MODEL = require_model("qwen2.5-coder-0.5b")


def test_real_model_call_is_lossless_and_replays_exactly() -> None:
    from agspec.drafter import VARIANTS, AgSpecServer
    from agspec.lab.greedy import replay_live_record
    from agspec.pipeline import agents
    from agspec.pipeline.runner import LlamaLLM
    from agspec.pipeline.tasks import load_task
    from agspec.tokenizers import get_tokenizer
    from agspec.traces import render_call
    from agspec.traces.schema import Call, Session

    tok = get_tokenizer("qwen2.5")
    task = load_task("paginate")
    call = Call(
        "localizer",
        "localize",
        0,
        agents.localizer_read_messages(task.issue, list(task.files)),
        "",
        emission_format="none",
    )
    prompt_ids, _ = render_call(call)
    llm = LlamaLLM(str(MODEL), name="qwen", n_ctx=512)
    plain = llm.generate(prompt_ids, None, 12, 16)
    server = AgSpecServer(tokenizer=tok, config=VARIANTS["agspec-paper"])
    dsession = server.session("s", emission_format="none")
    spec = llm.generate(prompt_ids, dsession.call("localizer", "localize", 0), 12, 16)
    assert spec.tokens == plain.tokens, "greedy output changed by drafting (near-tie flip?)"
    assert sum(s[2] for s in spec.steps) == len(spec.tokens) <= 12
    body = spec.tokens[:-1] if spec.stopped_by == "eos" else spec.tokens
    assert spec.text == tok.decode(body) and "READ" in spec.text
    call.output = spec.text
    session = Session("s", "agspec-pipeline", "qwen", "paginate", [call])
    record = {"calls": [{"stopped_by": spec.stopped_by, "max_new_tokens": 12, "steps": spec.steps}]}
    if list(render_call(call)[1]) == body:  # the text re-encodes to the model's own ids
        assert replay_live_record(session, record, 16) == [[s[1] for s in spec.steps]]
