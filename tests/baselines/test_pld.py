"""Prompt-lookup drafter against a brute-force oracle and against HF's own generator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agspec.baselines.pld import (
    PLD_HF,
    PLD_VLLM,
    PLDServer,
    PromptLookupConfig,
    PromptLookupDrafter,
    prompt_lookup,
)
from agspec.drafter.protocol import CallDrafter


def oracle(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Enumerate every (n, start) pair; longest n wins, then the earliest start."""
    best: tuple[int, int] | None = None  # (-n, start)
    length = len(tokens)
    for n in range(min_n, max_n + 1):
        for start in range(length):
            end = start + n  # exclusive
            if end >= length:  # needs a token after the occurrence
                continue
            if tokens[start:end] == tokens[length - n :]:
                key = (-n, start)
                if best is None or key < best:
                    best = key
    if best is None:
        return []
    n, start = -best[0], best[1]
    return tokens[start + n : start + n + k]


def test_hand_made_cases() -> None:
    # 2-gram "2 3" occurs at 1; draft what follows, up to the end of the sequence.
    assert prompt_lookup(np.array([1, 2, 3, 4, 2, 3]), PLD_HF) == [4, 2, 3]
    # No 2-gram match: "9 3" is new, but "3" alone occurred at 2.
    assert prompt_lookup(np.array([1, 2, 3, 4, 9, 3]), PLD_HF) == [4, 9, 3]
    # Leftmost occurrence wins over the more recent one.
    assert prompt_lookup(np.array([7, 1, 7, 2, 7]), PLD_HF) == [1, 7, 2, 7]
    # The trailing n-gram alone never matches itself.
    assert prompt_lookup(np.array([1, 2, 3]), PLD_HF) == []
    # vLLM needs a 5-gram.
    seq = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5]
    assert prompt_lookup(np.array(seq), PLD_VLLM) == [6, 7, 8, 1, 2]
    assert prompt_lookup(np.array(seq[:-1] + [9]), PLD_VLLM) == []
    # max_tokens caps the draft; EOS cuts it.
    assert prompt_lookup(np.array([1, 2, 3, 4, 2, 3]), PLD_HF, max_tokens=2) == [4, 2]
    eos_cfg = PromptLookupConfig("eos", 1, 2, 10, eos_token_ids=(4,))
    assert prompt_lookup(np.array([1, 2, 3, 4, 2, 3]), eos_cfg) == []


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 4), min_size=0, max_size=40),
    min_n=st.integers(1, 4),
    extra_n=st.integers(0, 3),
    k=st.integers(1, 12),
)
def test_matches_brute_force(tokens: list[int], min_n: int, extra_n: int, k: int) -> None:
    config = PromptLookupConfig("t", min_n, min_n + extra_n, k)
    got = prompt_lookup(np.array(tokens, dtype=np.int64), config)
    assert got == oracle(tokens, min_n, min_n + extra_n, k)


def test_drafter_lifecycle_tracks_committed_tokens() -> None:
    drafter = PromptLookupDrafter(PLD_HF)
    assert isinstance(drafter, CallDrafter)
    drafter.begin([5, 6, 7, 8, 9, 5, 6])
    assert drafter.propose(4) == [7, 8, 9, 5]
    drafter.accept([7, 8, 1])
    assert drafter.propose(4) == []
    # Many small accepts exercise buffer growth; the drafter sees every committed token.
    seq = [5, 6, 7, 8, 9, 5, 6, 7, 8, 1]
    for token in [3, 1, 4, 1, 5, 9, 2, 6] * 20:
        drafter.accept([token])
        seq.append(token)
        assert drafter.propose(10) == oracle(seq, 1, 2, 10)
    with pytest.raises(ValueError, match="max_tokens"):
        drafter.propose(-1)
    drafter.end()


def test_server_shape() -> None:
    server = PLDServer(PLD_VLLM)
    assert server.name == "pld-vllm"
    call = server.session("s1").call("Programmer", "Programmer", 0)
    call.begin([1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5])
    assert call.propose(8) == [9, 1, 2, 3, 4]


def test_bad_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="min_ngram_tokens"):
        PromptLookupConfig("bad", 3, 2, 5)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        PromptLookupConfig("bad", 1, 2, 0)


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(0, 3), min_size=2, max_size=30))
def test_same_as_transformers_prompt_lookup(tokens: list[int]) -> None:
    """HF's own PromptLookupCandidateGenerator is the reference for PLD_HF."""
    torch = pytest.importorskip("torch")
    candidate_generator = pytest.importorskip("transformers.generation.candidate_generator")
    generator = candidate_generator.PromptLookupCandidateGenerator(
        num_output_tokens=10, max_matching_ngram_size=2, max_length=1000
    )
    ids = torch.tensor([tokens], dtype=torch.long)
    candidates, _ = generator.get_candidates(ids)
    expected = candidates[0, len(tokens) :].tolist()
    assert prompt_lookup(np.array(tokens, dtype=np.int64), PLD_HF) == expected
