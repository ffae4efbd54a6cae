"""transformers adapter: assisted `generate` fed by a CallDrafter equals plain greedy.

A tiny random-weight Llama built from a config (no hub). Near-tie flips between the
batched verify pass and one-token decoding are accepted only when the one-token logits of
the two candidates are within NEAR_TIE_LOGITS, and counted.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from guards import require_engine

pytestmark = pytest.mark.engine("torch", "transformers")
torch = require_engine("torch")
transformers = require_engine("transformers")

from agspec.adapters.transformers import (  # noqa: E402
    DrafterCandidateGenerator,
    generate_with_drafter,
)
from agspec.baselines.pld import PLD_HF, PromptLookupDrafter  # noqa: E402

NEAR_TIE_LOGITS = 1e-3
NUM_PROMPTS = 20
MAX_NEW_TOKENS = 16


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)  # tiny model: threads only add overhead on a busy machine
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def random_prompts() -> list[list[int]]:
    """Random token prompts with a repeated span, so prompt lookup finds matches."""
    gen = torch.Generator().manual_seed(1)
    prompts = []
    for _ in range(NUM_PROMPTS):
        span = torch.randint(1, 96, (8,), generator=gen).tolist()
        noise = torch.randint(1, 96, (6,), generator=gen).tolist()
        prompts.append(span + noise + span[:5])
    return prompts


class ScriptedDrafter:
    """Proposes a known continuation; records the lifecycle."""

    def __init__(self, script: Sequence[int]) -> None:
        self.script = list(script)
        self.log: list = []
        self.length = 0

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.log.append(("begin", list(prompt_ids)))
        self.length = len(prompt_ids)

    def propose(self, max_tokens: int) -> list[int]:
        return self.script[self.length : self.length + max_tokens]

    def accept(self, committed_ids: Sequence[int]) -> None:
        self.log.append(("accept", list(committed_ids)))
        self.length += len(committed_ids)

    def end(self) -> None:
        self.log.append(("end",))


def greedy(model, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    return out[0, len(prompt) :].tolist()


def compare(model, prompt: list[int], reference: list[int], got: list[int]) -> int:
    assert len(got) == len(reference)
    if got == reference:
        return 0
    p = next(i for i, (x, y) in enumerate(zip(reference, got)) if x != y)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + reference[:p]])).logits[0, -1]
    gap = float(abs(logits[reference[p]] - logits[got[p]]))
    assert gap < NEAR_TIE_LOGITS, f"differs at {p}: {reference[p]} vs {got[p]}, gap {gap}"
    return 1


def test_lossless_with_pld_and_a_mostly_right_drafter(model) -> None:
    """Per prompt: plain greedy, PLD, and a drafter that knows the greedy answer but is
    wrong at every 4th position (accepts and rejections, so every crop path runs)."""
    flips = pld_drafted = accepted = 0
    for n, prompt in enumerate(random_prompts()):
        reference = greedy(model, prompt)
        out, stats = generate_with_drafter(
            model, torch.tensor([prompt]), PromptLookupDrafter(PLD_HF),
            max_new_tokens=MAX_NEW_TOKENS, num_draft_tokens=8,
        )  # fmt: skip
        pld_drafted += sum(stats.drafted_tokens)
        flips += compare(model, prompt, reference, out[0, len(prompt) :].tolist())

        script = prompt + reference
        for i in range(len(prompt) + n % 4, len(script), 4):
            script[i] = (script[i] + 1) % 96
        drafter = ScriptedDrafter(script)
        out, stats = generate_with_drafter(
            model, torch.tensor([prompt]), drafter, max_new_tokens=MAX_NEW_TOKENS,
            num_draft_tokens=6,
        )  # fmt: skip
        got = out[0, len(prompt) :].tolist()
        flips += compare(model, prompt, reference, got)
        # begin(prompt), then the committed tokens in order, then end.
        assert drafter.log[0] == ("begin", prompt) and drafter.log[-1] == ("end",)
        committed = [entry[1] for entry in drafter.log[1:-1]]
        assert [t for c in committed for t in c] == got
        # Accept length (bonus excluded) = committed - 1 when nothing was cut at max length.
        for c, a in zip(committed[:-1], stats.accepted_tokens[:-1]):
            assert len(c) == a + 1
        accepted += sum(stats.accepted_tokens)
    print(
        f"\ntransformers: {NUM_PROMPTS} prompts x 2 drafters, {flips} near-tie flips; "
        f"PLD drafted {pld_drafted}, scripted drafter accepted {accepted}"
    )
    assert pld_drafted > 0
    assert accepted > NUM_PROMPTS * 4


def test_model_is_left_unpatched(model) -> None:
    generate_with_drafter(
        model, torch.tensor([[1, 2, 3]]), PromptLookupDrafter(PLD_HF), max_new_tokens=4
    )
    assert "_get_candidate_generator" not in vars(model)


def test_bad_input_is_rejected(model) -> None:
    with pytest.raises(ValueError, match=r"\[1, seq_len\]"):
        generate_with_drafter(
            model, torch.tensor([[1, 2], [3, 4]]), PromptLookupDrafter(PLD_HF), max_new_tokens=4
        )
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_with_drafter(
            model, torch.tensor([[1, 2]]), PromptLookupDrafter(PLD_HF), max_new_tokens=0
        )
    with pytest.raises(ValueError, match="num_draft_tokens"):
        DrafterCandidateGenerator(PromptLookupDrafter(PLD_HF), num_draft_tokens=0, max_length=10)


def test_costmodel_measure_on_transformers(model, tmp_path) -> None:
    """`agspec costmodel measure --backend transformers` on a saved model folder writes a
    profile the cost model reads; the function behind it times every n."""
    from agspec.adapters.transformers import measure_cost_profile
    from agspec.cli import main as cli_main
    from agspec.policy.costmodel import ProfileCostModel

    profile = measure_cost_profile(model, max_tokens=4, context_tokens=8, repeats=2)
    curve = profile["batch_sizes"]["1"]
    assert curve["n_tokens"] == [1, 2, 3, 4] and all(ms > 0 for ms in curve["step_ms"])
    assert ProfileCostModel.from_dict(profile).step_cost(1, 1) == 1.0

    folder = tmp_path / "tiny"
    model.save_pretrained(folder)
    out = tmp_path / "tf.json"
    args = ["costmodel", "measure", "--backend", "transformers", "--model", str(folder),
            "-o", str(out), "--max-tokens", "3", "--context-tokens", "8", "--repeats", "1",
            "--threads", "1"]  # fmt: skip
    assert cli_main(args) == 0
    loaded = ProfileCostModel.load(out)
    assert loaded.batch_sizes == (1,)
    assert json_field(out, "backend") == "transformers (float32)"
    with pytest.raises(ValueError, match="must be >= 1"):
        measure_cost_profile(model, max_tokens=0)


def json_field(path, key):
    import json

    return json.loads(path.read_text())[key]
