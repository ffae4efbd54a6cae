"""Tree verification in one forward (transformers): greedy output equals plain greedy
decoding, token for token up to near-ties (the one-token logit gap at a divergence is
checked, as in test_transformers.py), with trees whose right branch is not the first."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from agspec.adapters.transformers_tree import (  # noqa: E402
    generate_with_tree_drafter,
    tree_attention,
)
from agspec.drafter.tree import DraftTree  # noqa: E402

# The same tiny random-weight Llama, prompts and near-tie rule as test_transformers.py.
NEAR_TIE_LOGITS = 1e-3
NUM_PROMPTS = 20
MAX_NEW_TOKENS = 16


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def random_prompts() -> list[list[int]]:
    """Random token prompts with a repeated span, so the drafters find matches."""
    gen = torch.Generator().manual_seed(1)
    prompts = []
    for _ in range(NUM_PROMPTS):
        span = torch.randint(1, 96, (8,), generator=gen).tolist()
        noise = torch.randint(1, 96, (6,), generator=gen).tolist()
        prompts.append(span + noise + span[:5])
    return prompts


def greedy(model, prompt: list[int]) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    return out[0, len(prompt) :].tolist()


def compare(model, prompt: list[int], reference: list[int], got: list[int]) -> int:
    """0 when equal; 1 when they differ first at a near-tie (checked), else fails."""
    assert len(got) == len(reference)
    if got == reference:
        return 0
    p = next(i for i, (x, y) in enumerate(zip(reference, got)) if x != y)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + reference[:p]])).logits[0, -1]
    gap = float(abs(logits[reference[p]] - logits[got[p]]))
    assert gap < NEAR_TIE_LOGITS, f"differs at {p}: {reference[p]} vs {got[p]}, gap {gap}"
    return 1


class ScriptedTreeDrafter:
    """Knows the right continuation; proposes a tree whose first branch is wrong after
    its first token and whose second branch is right (plus a wrong third branch)."""

    def __init__(self, script: Sequence[int], seed: int) -> None:
        self.script = list(script)
        self.rng = random.Random(seed)
        self.length = 0
        self.log: list = []

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.length = len(prompt_ids)

    def propose_tree(self, max_nodes: int) -> DraftTree:
        right = self.script[self.length : self.length + 4]
        if len(right) < 2:
            return DraftTree.chain(right)
        wrong = [t % 95 + 1 for t in (right[1] + 1, right[1] + 2, right[1] + 3)]
        decoy = (right[0] + 7) % 95 + 1
        # 0: right[0]; 1-3: a wrong continuation of it; 4..: the right one; last: a decoy.
        tokens = [right[0], *wrong, *right[1:], decoy]
        parents = [-1, 0, 1, 2, 0, *range(4, 4 + len(right) - 2), -1]
        tree = DraftTree(tokens, parents)
        return DraftTree(tree.token_ids[:max_nodes], tree.parents[:max_nodes])

    def accept(self, committed_ids: Sequence[int]) -> None:
        self.log.append(list(committed_ids))
        self.length += len(committed_ids)

    def end(self) -> None:
        self.log.append("end")


def test_tree_attention_rows_and_depths():
    rows, depth = tree_attention([-1, 0, 1, 0, -1], 9)
    assert rows == [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 1, 4], [0, 5]]
    assert depth == [0, 1, 2, 3, 2, 1]


def test_lossless_with_a_tree_whose_second_branch_is_right(model) -> None:
    flips = 0
    accepted = 0
    for i, prompt in enumerate(random_prompts()):
        reference = greedy(model, prompt)
        drafter = ScriptedTreeDrafter(prompt + reference, seed=i)
        got, stats = generate_with_tree_drafter(
            model, torch.tensor([prompt]), drafter, max_new_tokens=MAX_NEW_TOKENS, max_nodes=16
        )
        flips += compare(model, prompt, reference, got)
        accepted += sum(stats.accepted_tokens)
        assert drafter.log[-1] == "end"
        assert sum(len(c) for c in drafter.log[:-1]) == len(got)
    # The right branch was the second one: its tokens were accepted (3 per step of 4).
    assert accepted >= len(random_prompts()) * MAX_NEW_TOKENS // 2
    assert flips <= 2


def test_lossless_with_agspec_trees(model) -> None:
    from chartok import CharTokenizer

    from agspec.drafter import VARIANTS, AgSpecServer

    class Flat:
        def step_cost(self, n_tokens: int, batch_size: int) -> float:
            return 1.0

    cfg = replace(VARIANTS["agspec"], use_global=False, tree_max_nodes=16)
    server = AgSpecServer(tokenizer=CharTokenizer(), config=cfg, cost_model=Flat())
    flips = nodes = 0
    for i, prompt in enumerate(random_prompts()[:10]):
        reference = greedy(model, prompt)
        call = server.session(f"s{i % 3}").call("coder", "code", i)
        got, stats = generate_with_tree_drafter(
            model, torch.tensor([prompt]), call, max_new_tokens=MAX_NEW_TOKENS, max_nodes=16
        )
        flips += compare(model, prompt, reference, got)
        nodes += sum(stats.drafted_tokens)
    assert nodes > 0  # the drafter drafted
    assert flips <= 1


def test_a_malformed_tree_is_refused_before_the_forward(model) -> None:
    class Bad(ScriptedTreeDrafter):
        def propose_tree(self, max_nodes: int) -> DraftTree:
            return DraftTree([5, 6], [-1, 1], check=False)

    with pytest.raises(ValueError, match=r"the drafter's tree.parents\[1\] = 1"):
        generate_with_tree_drafter(model, torch.tensor([[1, 2, 3]]), Bad([], 0), max_new_tokens=4)
    with pytest.raises(ValueError, match="max_nodes"):
        generate_with_tree_drafter(
            model, torch.tensor([[1, 2, 3]]), Bad([], 0), max_new_tokens=4, max_nodes=-1
        )
