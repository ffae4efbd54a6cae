"""The cost rule priced at a batch size that changes between steps (vLLM's batch does):
a server moved to batch size b with `set_batch_size` / `step_batch(batch_size=b)` drafts
exactly as one built at b."""

from __future__ import annotations

import random

import pytest
from chartok import CharTokenizer

from agspec.drafter import VARIANTS, AgSpecServer, step_batch
from agspec.policy.costmodel import get_cost_model


def replay(server: AgSpecServer, batch_size: int | None, seed: int) -> list[list[int]]:
    """Four requests of two sessions over repetitive text, stepped together greedily."""
    rng = random.Random(seed)
    words = [[rng.randrange(1, 40) for _ in range(rng.randrange(2, 6))] for _ in range(12)]
    texts = [[t for _ in range(60) for t in rng.choice(words)] for _ in range(4)]
    calls, outs = [], []
    for i, text in enumerate(texts):
        call = server.session(f"s{i % 2}").call("coder")
        call.begin([0, *text[:40]])
        calls.append(call)
        outs.append(text[40:])
    pos = [0] * 4
    committed: list[list[int] | None] = [None] * 4
    trace = []
    for _ in range(40):
        drafts = step_batch(calls, committed, 16, batch_size=batch_size)
        trace.extend(drafts)
        for i, d in enumerate(drafts):
            rest = outs[i][pos[i] :]
            a = 0
            while a < len(d) and a < len(rest) - 1 and d[a] == rest[a]:
                a += 1
            committed[i] = rest[: a + 1]
            pos[i] += a + 1
    return trace


@pytest.mark.parametrize("seed", [0, 1])
def test_set_batch_size_drafts_as_a_server_built_at_that_size(seed):
    cm = get_cost_model("h200-qwen2.5-32b", context_tokens=16384)
    cfg = VARIANTS["agspec"]
    built = AgSpecServer(tokenizer=CharTokenizer(), config=cfg, cost_model=cm, batch_size=16)
    moved = AgSpecServer(tokenizer=CharTokenizer(), config=cfg, cost_model=cm, batch_size=1)
    expected = replay(built, None, seed)
    assert replay(moved, 16, seed) == expected
    assert moved.lengths.step_costs == built.lengths.step_costs
    assert moved.batch_cost_mode and moved.lengths.batch_size == 16
    assert any(expected)  # the sessions do draft
    # Back to 1: the one-request rule and step costs again.
    moved.set_batch_size(1)
    single = AgSpecServer(tokenizer=CharTokenizer(), config=cfg, cost_model=cm, batch_size=1)
    assert moved.lengths.step_costs == single.lengths.step_costs
    assert not moved.batch_cost_mode


def test_batch_size_is_checked():
    cm = get_cost_model("h200-qwen2.5-32b", context_tokens=16384)
    server = AgSpecServer(tokenizer=CharTokenizer(), config=VARIANTS["agspec"], cost_model=cm)
    for bad in (0, -3, True, 2.0):
        with pytest.raises(ValueError, match="batch_size"):
            server.set_batch_size(bad)  # type: ignore[arg-type]
