"""The llama.cpp draft-model hook fed incrementally (issue 11 item 3): each step copies and
converts only its new tokens, and tells continuations from new calls exactly as a
whole-sequence comparison does (the oracle below, the hook's former rule). No llama.cpp
needed: the hook is driven the way `Llama.generate` drives it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from agspec.adapters.llama_cpp import AgSpecLlamaDraftModel


class ScriptDrafter:
    """Drafts the next tokens of a script from where the sequence is; logs its lifecycle."""

    def __init__(self, script: Sequence[int], log: list) -> None:
        self.script, self.log, self.pos = list(script), log, 0

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.log.append(("begin", list(prompt_ids)))
        self.pos = len(prompt_ids)

    def propose(self, max_tokens: int) -> list[int]:
        return self.script[self.pos : self.pos + max_tokens]

    def accept(self, committed_ids: Sequence[int]) -> None:
        self.log.append(("accept", list(committed_ids)))
        self.pos += len(committed_ids)

    def end(self) -> None:
        self.log.append(("end",))


class WholeSequenceHook:
    """The oracle: every step compares the whole sequence as Python lists."""

    def __init__(self, factory, k: int) -> None:
        self.factory, self.k, self.drafter, self.seq, self.draft = factory, k, None, [], []

    def __call__(self, input_ids: np.ndarray) -> list[int]:
        ids = [int(t) for t in input_ids]
        n = len(self.seq)
        new = ids[n:]
        cont = (
            self.drafter is not None
            and len(ids) > n
            and ids[:n] == self.seq
            and len(new) - 1 <= len(self.draft)
            and new[:-1] == self.draft[: len(new) - 1]
        )
        if cont:
            self.drafter.accept(new)
        else:
            if self.drafter is not None:
                self.drafter.end()
            self.drafter = self.factory()
            self.drafter.begin(ids[:-1])
            self.drafter.accept(ids[-1:])
        self.seq = ids
        self.draft = self.drafter.propose(self.k)[: self.k]
        return self.draft


@st.composite
def engine_calls(draw):
    """Sequences as the engine passes them: continuations (an accepted prefix of the last
    draft plus a token) and new requests (some sharing a prefix, some changed mid-way)."""
    script = draw(st.lists(st.integers(0, 3), min_size=40, max_size=40))
    return script, draw(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), max_size=25))


@settings(max_examples=200, deadline=None)
@given(engine_calls())
def test_incremental_hook_matches_the_whole_sequence_rule(case):
    script, moves = case
    log_new: list = []
    log_old: list = []
    hook = AgSpecLlamaDraftModel(lambda: ScriptDrafter(script, log_new), num_draft_tokens=4)
    oracle = WholeSequenceHook(lambda: ScriptDrafter(script, log_old), 4)
    seq = script[:6]
    draft: list[int] = []
    for kind, arg in moves:
        if kind <= 2 and seq:  # continue: accept `arg` draft tokens, then a token
            a = min(arg, len(draft))
            seq = [*seq, *draft[:a], (draft[a] + 1) % 4 if a < len(draft) else arg]
        elif kind == 3:  # a new request that extends the text
            seq = [*seq, arg, arg]
        elif kind == 4 and len(seq) > 2:  # a new request changed in the middle
            seq = [*seq[:1], (seq[1] + 1) % 4, *seq[2:], arg]
        else:  # a new request from scratch
            seq = script[: 3 + arg]
        ids = np.array(seq, dtype=np.intc)
        draft = hook(ids).tolist()
        assert draft == oracle(ids)
    assert log_new == log_old


def test_int64_ids_and_bad_dtypes():
    log: list = []
    hook = AgSpecLlamaDraftModel(lambda: ScriptDrafter(list(range(20)), log), num_draft_tokens=2)
    assert hook(np.arange(5, dtype=np.int64)).tolist() == [5, 6]
    assert hook(np.arange(8, dtype=np.int64)).tolist() == [8, 9]
    assert log[-1] == ("accept", [5, 6, 7])
    import pytest

    with pytest.raises(TypeError, match="integer token ids"):
        hook(np.array([1.0, 2.0]))
