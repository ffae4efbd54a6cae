"""agspec.adapters.vllm: the speculative config, and AgSpec inside vLLM's CPU build.

The first tests need no vLLM. The offline ones run `LLM(...)` with SmolLM2-135M (an HF
folder exported from the pinned GGUF) in the interpreter of scripts/install_vllm.sh; they
skip with the reason elsewhere. One LLM without speculation gives the oracle, then one
LLM with AgSpec runs every check (enforce_eager, max_model_len 2048).
"""

from __future__ import annotations

import gc
import importlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from guards import missing_engine

from agspec.adapters.vllm import ProposerOptions, speculative_config
from agspec.adapters.vllm import workload as vllm_common

MAX_NEW = 32
MAX_PROMPT = 1400
# Both LLMs compute in float32 (the bf16 weights upcast exactly). In bf16, verifying k+1
# tokens in one batch and decoding one token run different kernels, and on an AMX Xeon
# they parted from plain greedy at log-prob gaps up to 0.25 (0.15 sufficed on an AVX-512
# EPYC): too loose an oracle, and one that hung on the CPU. In float32 the same paths
# differ by rounding alone, orders of magnitude below this gap.
DTYPE = "float32"
NEAR_TIE = 0.02  # log-prob gap under which float32 rounding may flip greedy's choice


# -- no vLLM needed ----------------------------------------------------------------------


def test_speculative_config_defaults() -> None:
    cfg = speculative_config()
    assert cfg == {
        "method": "custom_class",
        "model": "agspec.adapters.vllm.proposer.AgSpecProposer",
        "num_speculative_tokens": 16,
    }


def test_options_travel_in_the_class_name(tmp_path: Path) -> None:
    corpus = tmp_path / "g.idx"
    corpus.write_bytes(b"x")  # only its existence is checked here
    cfg = speculative_config(
        8, variant="agspec-paper+recent+history+cap32", global_corpus=str(corpus)
    )
    module, name = cfg["model"].rsplit(".", 1)
    assert "." not in name and name.startswith("AgSpecProposer__")
    cls = getattr(importlib.import_module(module), name)  # what vLLM does
    assert cls.options_override == ProposerOptions(
        variant="agspec-paper+recent+history+cap32", global_corpus=str(corpus)
    )
    assert getattr(importlib.import_module(module), name) is cls
    assert json.loads(json.dumps(cfg)) == cfg  # fits --speculative-config as JSON


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"variant": "nope"}, "unknown AgSpec variant"),
        ({"global_corpus": "/no/such/file.idx"}, "no file at"),
        ({"colour": "red"}, "unknown AgSpec option"),
        ({"cost_profile": "no-such-preset"}, "no file at"),
        ({"batch_size": 0}, "must be positive"),
    ],
)
def test_bad_options_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        speculative_config(8, **kwargs)


@pytest.mark.parametrize("k", [0, -1, 2.5, True, 5000])
def test_bad_draft_length_is_refused(k: Any) -> None:
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        speculative_config(k)


def test_malformed_encoded_name_is_refused() -> None:
    mod = importlib.import_module("agspec.adapters.vllm.proposer")
    with pytest.raises(ValueError, match="malformed"):
        getattr(mod, "AgSpecProposer__!!!")
    with pytest.raises(AttributeError):
        mod.SomethingElse  # noqa: B018


def _profile_config(k: int = 16, vocab: int = 1000) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(get_vocab_size=lambda: vocab),
    )


def test_profile_proposer_drafts_its_cycle_and_logs_each_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agspec.adapters.vllm import costprofile

    log = tmp_path / "steps.jsonl"
    monkeypatch.setenv(costprofile.ENV_OUT, str(log))
    monkeypatch.setenv(costprofile.ENV_CYCLE, "0,2,5")
    prop = costprofile.FixedDraftProposer(_profile_config())
    got = [prop.propose([[1], [], [2, 3]], None, None) for _ in range(4)]
    # Every decoding row gets the step's length of the vocabulary's last id; a row in
    # prefill (no sampled tokens) gets none.
    assert got[0] == [[], [], []]
    assert got[1] == [[999, 999], [], [999, 999]]
    assert got[2] == [[999] * 5, [], [999] * 5]
    assert got[3] == got[0]
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["n"] for r in recs] == [0, 2, 5, 0]
    assert recs[0]["rows"] == 3 and recs[0]["decoding"] == 2 and recs[0]["committed"] == [1, 2]
    monkeypatch.setenv(costprofile.ENV_CYCLE, "0,17")
    with pytest.raises(ValueError, match="must be in"):
        costprofile.FixedDraftProposer(_profile_config(k=16))


def test_profile_step_times_keep_only_full_batch_steps_with_rejected_drafts() -> None:
    from agspec.adapters.vllm.costprofile import step_times

    def rec(t: float, n: int, rows: int = 2, committed: tuple[int, ...] = (1, 1)) -> dict:
        return {"t": t, "n": n, "rows": rows, "decoding": len(committed), "committed": committed}

    # Record j: the step that ended at time t committed `committed` and drafted n.
    records = [
        rec(0.000, 0),
        rec(0.010, 3),  # verified 1 token per row in 10 ms
        rec(0.040, 0),  # verified 1 + 3 in 30 ms
        rec(0.050, 3, committed=(1, 2)),  # a draft token was accepted: 10 ms not counted
        rec(0.100, 0),  # verified 1 + 3 (all rejected) in 50 ms
        rec(0.130, 3, committed=(1,), rows=1),  # a request finished: not a full batch
        rec(0.200, 0),  # the step after a partial batch: not counted either
    ]
    got = step_times(records, 2)
    assert {n: [round(x, 6) for x in v] for n, v in got.items()} == {1: [10.0], 4: [30.0, 50.0]}


# -- vLLM (CPU build) ----------------------------------------------------------------------

_SKIP = missing_engine("vllm")
live = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")


def _llm(folder: Path, spec: dict | None) -> Any:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    return LLM(
        model=str(folder),
        enforce_eager=True,
        max_model_len=2048,
        dtype=DTYPE,
        speculative_config=spec,
        disable_log_stats=False,
        seed=0,
    )


def _shutdown(llm: Any) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def folder() -> Path:
    if _SKIP is not None:
        pytest.skip(_SKIP)
    try:
        return vllm_common.model_folder("smollm2-135m-instruct")
    except Exception as exc:  # no GGUF fetched, or no transformers/gguf
        pytest.skip(f"no SmolLM2 HF folder ({exc}); run `agspec models fetch smollm2`")


def _toy_proposer(
    tmp_path: Path, max_tokens: list[int | None] | None = None, **options: Any
) -> tuple[Any, Any]:
    """An AgSpecProposer outside an engine, with the runner fields it reads (as
    benchmarks/bench_vllm.py drives it)."""
    from types import SimpleNamespace

    import numpy as np

    from agspec.adapters.vllm.proposer import AgSpecProposer

    cfg = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=8),
        model_config=SimpleNamespace(max_model_len=4096, tokenizer=None, model=None),
    )
    prop = AgSpecProposer(cfg, ProposerOptions(tokenizer="qwen2.5", **options))
    rows = 8
    ib = SimpleNamespace(
        token_ids_cpu=np.zeros((rows, 4096), dtype=np.int32),
        num_tokens_no_spec=np.zeros(rows, dtype=np.int32),
        req_ids=[f"r{i}" for i in range(rows)],
        req_id_to_index={f"r{i}": i for i in range(rows)},
    )
    requests = {
        f"r{i}": SimpleNamespace(
            prompt_token_ids=[100 + i, 5, 6, 7, 5, 6],
            sampling_params=SimpleNamespace(
                extra_args={"agspec_session": f"s{i}"},
                max_tokens=max_tokens[i] if max_tokens else None,
            ),
        )
        for i in range(rows)
    }
    for i in range(rows):
        ib.token_ids_cpu[i, :7] = [100 + i, 5, 6, 7, 5, 6, 7]
        ib.num_tokens_no_spec[i] = 7
    runner = SimpleNamespace(input_batch=ib, requests=requests)
    sched = SimpleNamespace(scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set()))
    prop.on_update_states(runner, sched, before=True)
    prop.on_update_states(runner, sched, before=False)
    return prop, ib


@live
def test_the_proposer_sets_p_star_from_its_cost_profile(tmp_path: Path) -> None:
    """As every caller of AgSpecServer.from_variant: agspec-paper inside vLLM ran at
    p* = 0.5 whatever its profile said before."""
    from agspec.policy.costmodel import break_even_accept_prob, get_cost_model

    preset = "epyc2t-vllmcpu-qwen2.5-coder-0.5b-measured"
    prop, _ = _toy_proposer(tmp_path, variant="agspec-paper", cost_profile=preset, batch_size=4)
    want = float(break_even_accept_prob(get_cost_model(preset), 4))
    assert prop.server.config.break_even_prob == want != 0.5


@live
def test_cost_rule_is_priced_at_each_steps_batch(tmp_path: Path) -> None:
    from agspec.policy.costmodel import ProfileCostModel

    profile = {
        "format": "agspec-cost-profile", "version": 1, "backend": "vllm", "model": "m",
        "device": "cpu", "context_tokens": 512,
        "batch_sizes": {
            "1": {"n_tokens": [1, 2, 17], "step_ms": [10.0, 10.5, 20.0]},
            "8": {"n_tokens": [1, 2, 17], "step_ms": [12.0, 18.0, 100.0]},
        },
    }  # fmt: skip
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    model = ProfileCostModel.load(path)
    prop, ib = _toy_proposer(tmp_path, variant="agspec", cost_profile=str(path))
    lengths = prop.server.lengths

    def want(b: int) -> list[float]:
        n = len(lengths.step_costs)
        return [model.step_cost(i, b) / model.step_cost(1, b) for i in range(1, n + 1)]

    # Three rows decode (the others are in prefill: nothing sampled): priced at batch 3,
    # between the measured 1 and 8, with the ragged-batch rule on.
    sampled = [[7], [7], [7], [], [], [], [], []]
    prop.propose(sampled, ib.num_tokens_no_spec, ib.token_ids_cpu)
    assert lengths.batch_size == 3 and prop.server.batch_cost_mode
    assert lengths.step_costs == pytest.approx(want(3))
    assert want(3) != pytest.approx(want(1))
    # Then one row: batch 1, the single-request rule.
    for i in range(3):
        ib.num_tokens_no_spec[i] += 1
    sampled = [[5], [], [], [], [], [], [], []]
    prop.propose(sampled, ib.num_tokens_no_spec, ib.token_ids_cpu)
    assert lengths.batch_size == 1 and not prop.server.batch_cost_mode
    assert lengths.step_costs == pytest.approx(want(1))


@live
def test_no_draft_past_a_requests_max_tokens(tmp_path: Path) -> None:
    # Each row: prompt [x, 5, 6, 7, 5, 6] and one output token 7, so "5 6 7" matches and
    # "5 6 7" follows it: a 3-token draft, unless max_tokens leaves less room.
    prop, ib = _toy_proposer(
        tmp_path, [None, 1000, 3, 2, 1, None, None, None], variant="agspec-paper"
    )
    drafts = prop.propose([[7]] * 5 + [[]] * 3, ib.num_tokens_no_spec, ib.token_ids_cpu)
    # 1 token out; max_tokens 3 leaves 2, so the next step commits at most 2: a 1-token
    # draft; max_tokens 2 leaves 1 (the step's own token): no draft; 1 is already done.
    assert drafts[:5] == [[5, 6, 7], [5, 6, 7], [5], [], []]


REPEAT_TEXT = (
    "def area(w, h):\n    return w * h\n\n"
    "def perimeter(w, h):\n    return 2 * (w + h)\n\n"
    "def diagonal(w, h):\n    return (w * w + h * h) ** 0.5\n\n"
)


@pytest.fixture(scope="module")
def prompts(folder: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    agent = vllm_common.agent_prompts(tok, 20, MAX_PROMPT)
    assert len(agent) >= 20, f"only {len(agent)} agent prompts fit {MAX_PROMPT} tokens"
    msgs = [{"role": "user", "content": "Copy this code exactly:\n\n" + REPEAT_TEXT * 2}]
    repeat = tok.encode(
        tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
    )
    return {"agent": agent, "repeat": list(repeat)}


def _params(max_tokens: int = MAX_NEW, logprobs: int | None = 5, **extra: Any) -> Any:
    from vllm import SamplingParams

    return SamplingParams(
        temperature=0.0, max_tokens=max_tokens, logprobs=logprobs, extra_args=extra or None
    )


def _generate(llm: Any, ids: list[list[int]], params: Any) -> list[Any]:
    prompts = [{"prompt_token_ids": p} for p in ids]
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o.outputs[0] for o in outs]


@pytest.fixture(scope="module")
def reference(folder: Path, prompts: dict[str, Any]) -> dict[str, Any]:
    """Plain greedy decoding (no speculation), token ids and top-5 log-probs."""
    llm = _llm(folder, None)
    try:
        agent = _generate(llm, [p["ids"] for p in prompts["agent"]], _params())
        repeat = _generate(llm, [prompts["repeat"]], _params(96))[0]
        long = _generate(llm, [prompts["agent"][0]["ids"]], _params(160))[0]
    finally:
        _shutdown(llm)
    return {"agent": agent, "repeat": repeat, "long": long}


@pytest.fixture(scope="module")
def agspec(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    stats = tmp_path_factory.mktemp("vllm") / "agspec-stats.json"
    llm = _llm(folder, speculative_config(8, stats_path=str(stats)))
    llm.agspec_stats = stats
    llm.agspec_finished = 0
    yield llm
    _shutdown(llm)


def _metric(llm: Any, name: str) -> float | None:
    """A counter of vLLM's own metrics (None when this process's registry lacks it: the
    second LLM built in one process is not always registered)."""
    for m in llm.get_metrics():
        if m.name == name and hasattr(m, "value"):
            return float(m.value)
    return None


def _logprob(step: Any, token: int) -> float | None:
    lp = step.get(token) if step else None
    return None if lp is None else float(lp.logprob)


def _near_tie(ref: Any, pos: int, got_token: int) -> tuple[bool, float | None]:
    """Was plain greedy's choice at `pos` within NEAR_TIE of the token AgSpec's run took?"""
    step = ref.logprobs[pos] if ref.logprobs and pos < len(ref.logprobs) else None
    a, b = _logprob(step, ref.token_ids[pos]), _logprob(step, got_token)
    if a is None or b is None:
        return False, None
    return a - b <= NEAR_TIE, a - b


@live
def test_greedy_with_agspec_equals_plain_decoding(
    agspec: Any, reference: dict[str, Any], prompts: dict[str, Any]
) -> None:
    agent = prompts["agent"]
    params = [_params(agspec_session=p["session"], agspec_agent=p["agent"]) for p in agent]
    outs = agspec.generate([{"prompt_token_ids": p["ids"]} for p in agent], params, use_tqdm=False)
    agspec.agspec_finished += len(agent)
    same, flips, bad = 0, [], []
    for p, ref, out in zip(agent, reference["agent"], outs):
        got = list(out.outputs[0].token_ids)
        want = list(ref.token_ids)
        pos = vllm_common.first_difference(want, got)
        if pos is None:
            same += 1
            continue
        tie, gap = (
            _near_tie(ref, pos, got[pos]) if pos < min(len(got), len(want)) else (False, None)
        )
        (flips if tie else bad).append((p["session"], pos, gap))
    stats = vllm_common.wait_stats(agspec.agspec_stats, agspec.agspec_finished)
    print(
        f"\n{same}/{len(agent)} agent prompts token-identical; near-tie flips {flips}; "
        f"accepted {stats['accepted_tokens']} of {stats['draft_tokens']} drafted tokens"
    )
    assert not bad, f"outputs differ from plain greedy decoding, not at a near tie: {bad}"
    assert len(flips) <= 2, f"too many near-tie flips to be bf16 noise: {flips}"
    assert same >= len(agent) - 2


@live
def test_drafts_accepted_where_the_prompt_repeats(
    agspec: Any, reference: dict[str, Any], prompts: dict[str, Any]
) -> None:
    before = vllm_common.wait_stats(agspec.agspec_stats, agspec.agspec_finished)
    out = _generate(agspec, [prompts["repeat"]], _params(96, None, agspec_session="repeat"))[0]
    agspec.agspec_finished += 1
    after = vllm_common.wait_stats(agspec.agspec_stats, agspec.agspec_finished)
    want = reference["repeat"]
    pos = vllm_common.first_difference(list(want.token_ids), list(out.token_ids))
    if pos is not None:
        got = list(out.token_ids)
        tie, gap = _near_tie(want, pos, got[pos]) if pos < len(got) else (False, None)
        assert tie, f"output parts from plain greedy at {pos} (log-prob gap {gap}): no near tie"
    accepted = after["accepted_tokens"] - before.get("accepted_tokens", 0)
    steps = after["request_steps"] - before.get("request_steps", 0)
    # 96 tokens copied from the prompt: most of them should come from accepted drafts.
    assert accepted >= 40, (accepted, steps)
    assert steps <= 96 - accepted + 1
    metric = _metric(agspec, "vllm:spec_decode_num_accepted_tokens")
    assert metric is None or metric >= accepted


@live
def test_aborted_and_preempted_requests_leave_no_state(
    agspec: Any, reference: dict[str, Any], prompts: dict[str, Any]
) -> None:
    engine = agspec.llm_engine
    ids = prompts["agent"][0]["ids"]
    before = vllm_common.wait_stats(agspec.agspec_stats, agspec.agspec_finished)
    keep_id = engine.add_request("keep", {"prompt_token_ids": ids}, _params(160, None))
    drop_id = engine.add_request("drop", {"prompt_token_ids": ids}, _params(160, None))
    outputs: dict[str, Any] = {}
    steps = 0
    preempted = aborted = False
    while engine.has_unfinished_requests():
        for o in engine.step():
            outputs[o.request_id] = o
        steps += 1
        got = {k: len(v.outputs[0].token_ids) for k, v in outputs.items()}
        if not aborted and got.get("drop", 0) >= 8:
            engine.abort_request([drop_id])
            aborted = True
        if aborted and not preempted and got.get("keep", 0) >= 24:
            # Every running request back to the waiting queue: recomputed later.
            assert engine.reset_prefix_cache(reset_running_requests=True)
            preempted = True
    assert aborted and preempted
    keep = list(outputs[keep_id if keep_id in outputs else "keep"].outputs[0].token_ids)
    want = reference["long"]
    pos = vllm_common.first_difference(list(want.token_ids), keep)
    if pos is not None:
        # The preempted request's KV was recomputed in one prefill (other bf16 rounding
        # than step-by-step decoding): allowed only at a near tie of plain decoding.
        tie, gap = _near_tie(want, pos, keep[pos]) if pos < len(keep) else (False, None)
        print(f"\npreempted request: first difference at token {pos}, gap {gap}")
        assert tie, f"preempted output differs at {pos} (log-prob gap {gap}): not a near tie"
    agspec.agspec_finished += 2
    after = vllm_common.wait_stats(agspec.agspec_stats, agspec.agspec_finished)
    # (vLLM's vllm:num_preemptions does not count a reset_prefix_cache preemption.)
    suspended = after["calls_suspended"] - before.get("calls_suspended", 0)
    assert suspended >= 1, "no call saw the preemption"
    assert after["calls_begun"] >= before.get("calls_begun", 0) + 3  # keep twice, drop once
    assert after["open_calls"] == 0 and after["live_requests"] == 0, after
