"""llama.cpp: a slot that starts from another slot's cells (`copy_prefix`) or from KV saved
in host memory (`save` / `restore`), SmolLM2-135M.

Oracle: plain prefill. After either, the logits of new tokens in the slot equal those of a
fresh decoder that prefilled the same prefix in the same steps, within `SAME_STEPS` (the
cells hold the same KV, only elsewhere in the buffer: 0.000 measured here), and within
`KV_TOLERANCE` when two slots decode in one step (another batch size takes other matmul
kernels: tests/adapters/test_llama_cpp_tree.py measured up to 0.86); a prefix missing
its first five tokens moves them by 6.2 (checked: `WRONG_AT_LEAST`). The greedy choice
of every row is the same.
"""

from __future__ import annotations

import numpy as np
import pytest
from guards import smollm2_llm

from agspec.adapters.llama_cpp_batch import SlotDecoder

SAME_STEPS = 0.05
KV_TOLERANCE = 1.5
WRONG_AT_LEAST = 3.0

PREFIX = (
    "def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n"
    "class Box:\n    def __init__(self, w, h):\n        self.w = w\n        self.h = h\n"
)
OTHER = "The cat sat on the mat. The dog sat on the log. The bird sat on a branch."
TAIL = "\n    def area(self):\n        return"


@pytest.fixture(scope="module")
def llm():
    return smollm2_llm(1024, 256)


@pytest.fixture(scope="module")
def tokens(llm) -> dict[str, list[int]]:
    return {k: llm.tokenize(v.encode(), add_bos=False) for k, v in
            {"prefix": PREFIX, "other": OTHER, "tail": TAIL}.items()}  # fmt: skip


def decoder(llm, slots: int = 3) -> SlotDecoder:
    return SlotDecoder(llm, num_slots=slots, slot_ctx_tokens=256, n_batch=256, threads=1)


def prefill(dec: SlotDecoder, slot: int, toks: list[int]) -> None:
    dec.decode([(slot, toks, 0, 0)])


def tail_logits(dec: SlotDecoder, slot: int, tail: list[int]) -> np.ndarray:
    return dec.decode([(slot, tail, 0, len(tail))]).copy()


@pytest.fixture(scope="module")
def reference(llm, tokens) -> np.ndarray:
    """The tail's logits after the prefix, prefilled plainly in a fresh decoder."""
    dec = decoder(llm, 1)
    try:
        prefill(dec, 0, tokens["prefix"])
        return tail_logits(dec, 0, tokens["tail"])
    finally:
        dec.close()


def assert_same(got: np.ndarray, want: np.ndarray, tolerance: float = SAME_STEPS) -> None:
    diff = float(np.abs(got - want).max())
    assert diff < tolerance, f"logits {diff:.3f} apart"
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


def test_the_oracle_tells_a_missing_prefix(llm, tokens, reference) -> None:
    dec = decoder(llm, 1)
    try:
        prefill(dec, 0, tokens["prefix"][5:])  # the first 5 tokens missing
        got = tail_logits(dec, 0, tokens["tail"])
    finally:
        dec.close()
    assert float(np.abs(got - reference).max()) > WRONG_AT_LEAST


def test_a_copied_prefix_decodes_as_if_prefilled(llm, tokens, reference) -> None:
    dec = decoder(llm)
    try:
        p = tokens["prefix"]
        prefill(dec, 0, p)  # slot 0: the prefix (as the reference prefilled it), then more
        prefill(dec, 0, tokens["other"])
        prefill(dec, 1, tokens["other"])  # slot 1 held another prompt: dropped by the copy
        dec.copy_prefix(0, 1, len(p))
        assert dec.cached[1] == p
        assert_same(tail_logits(dec, 1, tokens["tail"]), reference)
        # The source keeps its own cells: cut back to the prefix, it continues as well.
        dec.keep(0, len(p))
        assert_same(tail_logits(dec, 0, tokens["tail"]), reference)
        # Both continued from the shared cells in one step, each in its own sequence.
        dec.keep(0, len(p))
        dec.keep(1, len(p))
        both = dec.decode([(0, tokens["tail"], 0, len(tokens["tail"])),
                           (1, tokens["tail"], 0, len(tokens["tail"]))])  # fmt: skip
        n = len(tokens["tail"])
        assert_same(both[:n], reference, KV_TOLERANCE)
        assert_same(both[n:], reference, KV_TOLERANCE)
    finally:
        dec.close()


def test_saved_kv_restores_into_any_slot(llm, tokens, reference) -> None:
    dec = decoder(llm)
    try:
        p = tokens["prefix"]
        prefill(dec, 0, p)
        saved = dec.save(0)
        assert saved.tokens == tuple(p) and saved.nbytes > 0
        dec.keep(0, 0)
        prefill(dec, 0, tokens["other"])  # its cells now hold other KV
        prefill(dec, 2, tokens["other"] + tokens["other"])
        assert dec.restore(1, saved)
        assert dec.cached[1] == p
        assert_same(tail_logits(dec, 1, tokens["tail"]), reference)
        # Again into the slot that held other tokens: they are gone, the prefix is back.
        assert dec.restore(0, saved)
        assert dec.cached[0] == p
        assert_same(tail_logits(dec, 0, tokens["tail"]), reference)
    finally:
        dec.close()


def test_bad_calls_are_refused(llm, tokens) -> None:
    dec, other = decoder(llm), decoder(llm, 1)
    try:
        prefill(dec, 0, tokens["prefix"])
        with pytest.raises(ValueError, match="two slots"):
            dec.copy_prefix(0, 0, 3)
        with pytest.raises(ValueError, match="cannot copy"):
            dec.copy_prefix(0, 1, len(tokens["prefix"]) + 1)
        prefill(other, 0, tokens["prefix"])
        with pytest.raises(ValueError, match="another SlotDecoder"):
            dec.restore(1, other.save(0))
        assert dec.cached[1] == []
    finally:
        dec.close()
        other.close()
