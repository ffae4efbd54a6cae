"""The pipeline on the real model (Qwen2.5-Coder-0.5B on llama.cpp), kept tiny.

Skips when llama-cpp-python or the GGUF is absent. One session with one coder attempt and
a few output tokens per call: AgSpec's live steps commit exactly the recorded output,
and replaying the recorded session gives the live accept lengths step for step.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from agspec.models import ModelFileError, resolve_model

if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("llama-cpp-python is not installed", allow_module_level=True)
try:
    MODEL = resolve_model("qwen2.5-coder-0.5b")
except (ModelFileError, ValueError) as exc:
    pytest.skip(f"the Qwen2.5-Coder-0.5B GGUF is not cached: {exc}", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


def test_real_model_session_is_recorded_and_replays_exactly() -> None:
    from bench_replay_vs_live import replay_loop

    from agspec.drafter import VARIANTS, AgSpecServer
    from agspec.pipeline.runner import LlamaLLM, PipelineConfig, run_session
    from agspec.tokenizers import get_tokenizer
    from agspec.traces import render_call

    tok = get_tokenizer("qwen2.5")
    llm = LlamaLLM(str(MODEL), name="qwen", n_ctx=2048)
    cfg = PipelineConfig(max_turns=1, max_new_tokens=24, localizer_max_new_tokens=8)
    r = run_session(
        "paginate",
        llm,
        server_factory=lambda: AgSpecServer(tokenizer=tok, config=VARIANTS["agspec"]),
        config=cfg,
    )
    assert r.status in ("passed", "failed"), r.detail
    assert [c.agent for c in r.session.calls] == ["localizer", "localizer", "coder"]
    for call, live in zip(r.session.calls, r.live):
        assert sum(s[2] for s in live.steps) == len(live.output_ids) <= live.max_new_tokens
        assert live.stopped_by in ("eos", "length")
        body = live.output_ids[:-1] if live.stopped_by == "eos" else live.output_ids
        assert tok.decode(body) == call.output
    record = {"calls": [c.to_dict() for c in r.live]}
    replayed = replay_loop(r.session, record, cfg.num_draft_tokens)
    for i, (call, live) in enumerate(zip(r.session.calls, r.live)):
        body = live.output_ids[:-1] if live.stopped_by == "eos" else live.output_ids
        if list(render_call(call)[1]) == body:  # the text re-encodes to the model's ids
            assert replayed[i] == [s[1] for s in live.steps], f"call {i}"
