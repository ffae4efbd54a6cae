"""llama.cpp adapter: greedy speculative output equals greedy output, token for token.

Needs llama-cpp-python (scripts/install_llama_cpp.sh) and the SmolLM2 GGUF
(`agspec models fetch smollm2-135m-instruct`); the lossless tests also need the dev traces
in ../shared/data/traces. Each part skips with a message when absent.

Where llama.cpp's batched kernels flip a near-tie (the verify batch and the one-token
decode use different matmul paths), the outputs may part at one position; a divergence
is accepted only when the one-token logits of the two candidates are within
`NEAR_TIE_LOGITS` of each other, and the count is printed (docs/live.md reports it).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from guards import require_engine, require_model

from agspec.adapters.llama_cpp import (
    AgSpecLlamaDraftModel,
    _eval_batch,
    generate,
    prefill,
    time_verification_step,
)
from agspec.baselines.pld import PLD_HF, PromptLookupDrafter

TRACES = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces"
NEAR_TIE_LOGITS = 0.5  # flips seen on SmolLM2 Q4_1: logit gaps 0.001 to 0.21
NUM_PROMPTS = 20
MAX_NEW_TOKENS = 12


class RecordingDrafter:
    """Proposes from a script and records every lifecycle call."""

    def __init__(self, script: Sequence[int] = (), log: list | None = None) -> None:
        self.script = list(script)
        self.log: list = [] if log is None else log
        self.seen: list[int] = []

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.log.append(("begin", list(prompt_ids)))
        self.seen = list(prompt_ids)

    def propose(self, max_tokens: int) -> list[int]:
        # Continue the scripted sequence from where the real sequence is now.
        pos = len(self.seen)
        return self.script[pos : pos + max_tokens]

    def accept(self, committed_ids: Sequence[int]) -> None:
        self.log.append(("accept", list(committed_ids)))
        self.seen.extend(committed_ids)

    def end(self) -> None:
        self.log.append(("end",))


def test_draft_model_infers_acceptance_from_the_next_prefix() -> None:
    """No llama.cpp needed: drive the hook the way Llama.generate does."""
    log: list = []
    script = [5, 6, 7, 8, 9, 10, 11, 1, 2]
    hook = AgSpecLlamaDraftModel(lambda: RecordingDrafter(script, log), num_draft_tokens=3)
    # Call 1: prompt [5, 6, 7] plus the first generated token 8.
    assert hook(np.array([5, 6, 7, 8], dtype=np.intc)).tolist() == [9, 10, 11]
    # The model kept 9 and 10 and wrote 4 instead of 11; the script goes on at 1, 2.
    assert hook(np.array([5, 6, 7, 8, 9, 10, 4], dtype=np.intc)).tolist() == [1, 2]
    # The model rejected 1 and wrote 3.
    assert hook(np.array([5, 6, 7, 8, 9, 10, 4, 3], dtype=np.intc)).tolist() == [2]
    # A new request that extends the old text is a new call, not a continuation.
    hook(np.array([5, 6, 7, 8, 9, 10, 4, 3, 77, 78], dtype=np.intc))
    assert log == [
        ("begin", [5, 6, 7]),
        ("accept", [8]),
        ("accept", [9, 10, 4]),
        ("accept", [3]),
        ("end",),
        ("begin", [5, 6, 7, 8, 9, 10, 4, 3, 77]),
        ("accept", [78]),
    ]
    assert (hook.num_calls, hook.num_steps, hook.num_accepted_tokens) == (2, 2, 2)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        AgSpecLlamaDraftModel(RecordingDrafter, num_draft_tokens=0)


# ---------------------------------------------------------------- needs llama.cpp + model


@pytest.fixture(scope="module")
def llama_module():
    return require_engine("llama_cpp")


@pytest.fixture(scope="module")
def model_path(llama_module) -> str:
    return str(require_model("smollm2-135m-instruct"))


@pytest.fixture(scope="module")
def llm(llama_module, model_path):
    return llama_module.Llama(
        model_path=model_path,
        n_ctx=1024,
        n_batch=256,
        n_threads=1,
        n_threads_batch=1,
        seed=0,
        verbose=False,
    )


def agent_prompts(count: int) -> list[str]:
    """Text of real agent calls: the tail of a mini-swe-agent conversation before an
    assistant turn (observations and commands), as plain text."""
    folder = TRACES / "mini-swe-agent" / "gemini-3-pro"
    files = sorted(folder.glob("*.traj.json"))
    if not files:
        pytest.skip(f"dev traces not found under {folder}")
    prompts = []
    for path in files:
        messages = json.loads(path.read_text())["messages"]
        for i in (4, 8):  # two calls per session
            if i < len(messages) and messages[i]["role"] == "assistant":
                history = "\n".join(
                    f"{m['role']}: {m['content']}" for m in messages[max(1, i - 3) : i]
                )
                prompts.append(history[-240:] + "\nassistant: THOUGHT:")
        if len(prompts) >= count:
            break
    return prompts[:count]


def one_token_logit_gap(llm, prompt: list[int], prefix: list[int], a: int, b: int) -> float:
    """|logit(a) - logit(b)| at the next position, decoded one token at a time."""
    llm.reset()
    pending, _ = prefill(llm, prompt + prefix, reuse_prefix=False)
    logits = _eval_batch(llm, [pending], all_logits=False)[0]
    return float(abs(logits[a] - logits[b]))


FLIP_GAPS: list[float] = []  # logit gaps of the near-tie flips seen, for the printed report


def compare(llm, prompt: list[int], reference: list[int], got: list[int]) -> int:
    """0 if equal, 1 if they part at a near-tie; fail otherwise."""
    if got == reference:
        return 0
    p = next(i for i, (x, y) in enumerate(zip(reference, got)) if x != y)
    gap = one_token_logit_gap(llm, prompt, reference[:p], reference[p], got[p])
    FLIP_GAPS.append(gap)
    assert gap < NEAR_TIE_LOGITS, (
        f"speculative output differs at {p}: {reference[p]} vs {got[p]}, logit gap {gap:.3f}"
    )
    return 1


@pytest.mark.slow
def test_lossless_on_agent_prompts(llm) -> None:
    """Per prompt: plain greedy, then PLD, then a drafter that knows the greedy answer but
    is wrong at every 5th position (many accepts and rejections, so every rollback path
    runs). The later runs reuse the prompt's KV cache (`reuse_prefix`)."""
    prompts = [llm.tokenize(t.encode()) for t in agent_prompts(NUM_PROMPTS)]
    assert len(prompts) == NUM_PROMPTS
    flips = pld_drafted = scripted_accepted = 0
    rng = np.random.default_rng(0)
    for prompt in prompts:
        llm.reset()
        reference = generate(llm, prompt, None, MAX_NEW_TOKENS).tokens

        result = generate(
            llm, prompt, PromptLookupDrafter(PLD_HF), MAX_NEW_TOKENS, num_draft_tokens=8
        )
        assert result.reused_prompt_tokens == len(prompt) - 1
        # Invariant: the KV cache holds prompt + output except the pending last token.
        assert llm.n_tokens == len(prompt) + len(result.tokens) - 1
        pld_drafted += result.num_drafted_tokens
        flips += compare(llm, prompt, reference, result.tokens)

        script = list(prompt) + list(reference)
        for i in range(len(prompt) + int(rng.integers(0, 5)), len(script), 5):
            script[i] = (script[i] + 1) % llm.n_vocab()
        log: list = []
        result = generate(
            llm, prompt, RecordingDrafter(script, log), MAX_NEW_TOKENS, num_draft_tokens=6
        )
        scripted_accepted += result.num_accepted_tokens
        flips += compare(llm, prompt, reference, result.tokens)
        # The drafter saw begin(prompt), every committed token in order, then end.
        assert log[0] == ("begin", list(prompt)) and log[-1] == ("end",)
        assert [t for entry in log[1:-1] for t in entry[1]] == result.tokens
        assert all(s.committed_tokens == s.accepted_tokens + 1 for s in result.steps[:-1])
    print(
        f"\nllama.cpp: {NUM_PROMPTS} prompts x 2 drafters, {flips} near-tie flips; "
        f"PLD drafted {pld_drafted}, scripted drafter accepted {scripted_accepted}; "
        f"flip logit gaps {min(FLIP_GAPS, default=0):.4f}..{max(FLIP_GAPS, default=0):.4f}"
    )
    assert pld_drafted > 0
    assert scripted_accepted > NUM_PROMPTS * 5


@pytest.mark.slow
def test_stock_llama_draft_model_hook(llama_module, model_path, llm) -> None:
    """`Llama(draft_model=AgSpecLlamaDraftModel(...))` gives the same text as plain greedy."""
    hook = AgSpecLlamaDraftModel(lambda: PromptLookupDrafter(PLD_HF), num_draft_tokens=8)
    spec = llama_module.Llama(
        model_path=model_path,
        n_ctx=1024,
        n_batch=256,
        n_threads=1,
        n_threads_batch=1,
        seed=0,
        verbose=False,
        draft_model=hook,
    )
    flips = 0
    for text in agent_prompts(3):
        prompt = llm.tokenize(text.encode())
        llm.reset()
        reference = generate(llm, prompt, None, MAX_NEW_TOKENS).tokens
        spec.reset()
        out = spec.create_completion(text, max_tokens=MAX_NEW_TOKENS, temperature=0.0)
        got = spec.tokenize(out["choices"][0]["text"].encode(), add_bos=False, special=True)
        if llm.detokenize(reference) != llm.detokenize(got):
            # Compare at the token level to find and judge the first difference.
            got_ids = list(got) + [0] * max(0, len(reference) - len(got))
            flips += compare(llm, prompt, reference, got_ids[: len(reference)])
    assert hook.num_calls == 3 and hook.num_drafted_tokens > 0
    print(f"\nstock hook: {flips} near-tie flips, {hook.num_accepted_tokens} accepted")


def test_bad_input_is_rejected(llm) -> None:
    with pytest.raises(ValueError, match="empty"):
        generate(llm, [], None, 4)
    with pytest.raises(ValueError, match="context holds"):
        generate(llm, [1] * 2048, None, 4)
    with pytest.raises(ValueError, match=">= 0"):
        generate(llm, [1, 2], None, -1)
    with pytest.raises(TypeError, match="llama_cpp.Llama"):
        generate(object(), [1, 2], None, 4)  # type: ignore[arg-type]


def test_verification_step_costs_more_for_more_tokens(llm) -> None:
    prompt = llm.tokenize(b"def add(a, b):\n    return a + b\n" * 4)
    one = time_verification_step(llm, prompt, 1, repeats=3)
    many = time_verification_step(llm, prompt, 64, repeats=3)
    assert 0 < one < many


def test_costmodel_measure_writes_a_profile_the_cost_model_reads(model_path, tmp_path) -> None:
    from agspec.cli import main as cli_main
    from agspec.policy.costmodel import ProfileCostModel

    out = tmp_path / "profile.json"
    code = cli_main(
        ["costmodel", "measure", "--model", model_path, "-o", str(out), "--max-tokens", "4",
         "--context-tokens", "32", "--repeats", "1", "--threads", "1"]
    )  # fmt: skip
    assert code == 0
    profile = ProfileCostModel.load(out)
    assert profile.step_cost(1, 1) == 1.0
    data = json.loads(out.read_text())
    assert data["backend"] == "llama.cpp" and data["context_tokens"] == 32
    assert data["batch_sizes"]["1"]["n_tokens"] == [1, 2, 3, 4]
    assert all(t > 0 for t in data["batch_sizes"]["1"]["step_ms"])
    assert (
        cli_main(["costmodel", "measure", "--model", model_path, "-o", str(out), "--repeats", "0"])
        == 1
    )


class _LlamaTokenizer:
    """What AgSpecServer needs of a tokenizer, from the model's own vocabulary."""

    im_start_id = None

    def __init__(self, llm) -> None:
        self._llm = llm

    def encode(self, text: str) -> list[int]:
        return list(self._llm.tokenize(text.encode(), add_bos=False))


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["agspec-paper", "agspec"])
def test_agspec_drafter_in_the_loop_is_lossless_and_copies(llm, variant) -> None:
    """The real AgSpec drafter inside the own loop: a session whose second call retries
    the first (what agents do after a failed attempt). Both calls give plain greedy's
    output (up to near-ties), and the retry is drafted from the session: most of its
    tokens arrive as accepted draft tokens, in fewer steps than tokens."""
    from agspec.drafter import VARIANTS, AgSpecServer
    from agspec.policy.costmodel import get_cost_model

    cost = get_cost_model("epyc2t-llamacpp-qwen2.5-coder-0.5b-measured")
    server = AgSpecServer(tokenizer=_LlamaTokenizer(llm), config=VARIANTS[variant], cost_model=cost)
    flips = accepted = produced = steps = 0
    for k, text in enumerate(agent_prompts(8)):
        prompt = llm.tokenize(text.encode())
        llm.reset()
        reference = generate(llm, prompt, None, 32).tokens
        session = server.session(f"s{k}")
        first = generate(llm, prompt, session.call("coder", "code", 1), 32)
        flips += compare(llm, prompt, reference, first.tokens)
        retry = generate(llm, prompt, session.call("coder", "code", 2), 32)
        flips += compare(llm, prompt, reference, retry.tokens)
        session.end()
        if retry.tokens == first.tokens:
            accepted += retry.num_accepted_tokens
            produced += len(retry.tokens)
            steps += len(retry.steps)
    print(f"\n{variant} in the loop: {flips} near-tie flips, retries: {accepted} of "
          f"{produced} tokens from accepted drafts in {steps} steps")  # fmt: skip
    assert produced > 0
    assert accepted >= 0.6 * produced
    assert steps < 0.5 * produced


@pytest.mark.slow
def test_stock_hook_with_an_agspec_session(llama_module, model_path, llm) -> None:
    """The drop-in path with the real drafter: `create_completion` through
    `AgSpecLlamaDraftModel` fed by one AgSpec session (`agspec-paper+cost`), the same prompt
    asked twice. The text equals plain greedy's (up to near-ties) and the second answer
    is drafted from the first."""
    from agspec.drafter import VARIANTS, AgSpecServer
    from agspec.policy.costmodel import get_cost_model

    server = AgSpecServer(
        tokenizer=_LlamaTokenizer(llm),
        config=VARIANTS["agspec-paper+cost"],
        cost_model=get_cost_model("epyc2t-llamacpp-qwen2.5-coder-0.5b-measured"),
    )
    session = server.session("hook")
    hook = AgSpecLlamaDraftModel(lambda: session.call("coder", "code"), num_draft_tokens=16)
    spec = llama_module.Llama(
        model_path=model_path, n_ctx=1024, n_batch=256, n_threads=1, n_threads_batch=1,
        seed=0, verbose=False, draft_model=hook,
    )  # fmt: skip
    text = agent_prompts(1)[0]
    prompt = llm.tokenize(text.encode())
    llm.reset()
    reference = generate(llm, prompt, None, 32).tokens
    answers = []
    for _ in range(2):
        spec.reset()
        out = spec.create_completion(text, max_tokens=32, temperature=0.0)
        answers.append(out["choices"][0]["text"])
    hook.finish()
    assert answers[0] == answers[1]
    got = spec.tokenize(answers[0].encode(), add_bos=False, special=True)
    if llm.detokenize(reference) != llm.detokenize(got):
        got_ids = list(got) + [0] * max(0, len(reference) - len(got))
        compare(llm, prompt, reference, got_ids[: len(reference)])
    assert hook.num_calls == 2
    assert hook.num_accepted_tokens >= len(got) // 2  # the second answer came as drafts


def _warped_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> dict:
    """The sampling distribution, written out the slow way: id -> probability."""
    z = [(float(v) / temperature, i) for i, v in enumerate(logits)]
    z.sort(key=lambda t: (-t[0], t[1]))
    if top_k:
        z = z[:top_k]
    m = z[0][0]
    weights = [(np.exp(v - m), i) for v, i in z]
    total = sum(w for w, _ in weights)
    probs = [(w / total, i) for w, i in weights]
    if top_p < 1.0:
        kept, acc = [], 0.0
        for p, i in probs:
            kept.append((p, i))
            acc += p
            if acc >= top_p:
                break
        total = sum(p for p, _ in kept)
        probs = [(p / total, i) for p, i in kept]
    return {i: p for p, i in probs}


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8)])
def test_sampling_draws_from_the_warped_distribution(temperature, top_k, top_p) -> None:
    import random

    from agspec.adapters.llama_cpp import Sampling

    rng_logits = np.random.default_rng(1)
    logits = rng_logits.normal(0.0, 2.0, size=12).astype(np.float32)
    want = _warped_probs(logits, temperature, top_k, top_p)
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p)
    rng = random.Random(7)
    n = 20000
    counts = Counter(sampling.sample(logits, rng) for _ in range(n))
    assert set(counts) <= set(want)  # never a token outside top-k / top-p
    for token, p in want.items():
        assert abs(counts[token] / n - p) < 4 * (p * (1 - p) / n) ** 0.5 + 1e-3
    with pytest.raises(ValueError, match="temperature"):
        Sampling(temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        Sampling(top_p=0.0)


@pytest.mark.slow
def test_sampled_speculation_is_exact(llm) -> None:
    """Sampling in the own loop. (1) With top_k = 1 the sampled path is greedy decoding,
    drafted or not, so it must reproduce greedy output (up to near-ties): this checks its
    rows, rollbacks and bonus token. (2) The first token committed while a draft is on the
    table (the greedy token, so often accepted) follows the model's sampling distribution
    at that position, over 400 seeds."""
    from agspec.adapters.llama_cpp import Sampling

    flips = 0
    for text in agent_prompts(6):
        prompt = llm.tokenize(text.encode())
        llm.reset()
        reference = generate(llm, prompt, None, MAX_NEW_TOKENS).tokens
        script = list(prompt) + list(reference)
        for i in range(len(prompt) + 2, len(script), 4):
            script[i] = (script[i] + 1) % llm.n_vocab()
        one = Sampling(temperature=1.0, top_k=1)
        for drafter in (None, RecordingDrafter(script, [])):
            result = generate(
                llm, prompt, drafter, MAX_NEW_TOKENS, num_draft_tokens=6, sampling=one
            )
            flips += compare(llm, prompt, reference, result.tokens)

    prompt = llm.tokenize(agent_prompts(1)[0].encode())
    llm.reset()
    pending, _ = prefill(llm, prompt, reuse_prefix=False)
    logits = _eval_batch(llm, [pending], all_logits=False)[0]
    want = _warped_probs(logits, 1.5, 8, 1.0)
    top = max(want, key=want.get)
    n, counts = 400, Counter()
    for seed in range(n):
        sampling = Sampling(temperature=1.5, top_k=8, seed=seed)
        drafter = RecordingDrafter(list(prompt) + [top] * 4, [])
        counts[
            generate(llm, prompt, drafter, 2, num_draft_tokens=3, sampling=sampling).tokens[0]
        ] += 1
    assert set(counts) <= set(want)
    for token, p in want.items():
        assert abs(counts[token] / n - p) < 4 * (p * (1 - p) / n) ** 0.5 + 0.02, (token, p, counts)
    print(f"\nsampled loop: top_k=1 matches greedy ({flips} near-tie flips); first-token "
          f"frequencies match p over {n} seeds: {dict(counts.most_common(3))}")  # fmt: skip
