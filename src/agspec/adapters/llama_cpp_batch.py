"""Many sequences in one llama.cpp context (`SlotDecoder`), for continuous batching.

`agspec serve --parallel N` decodes N requests at once: every step is one `llama_decode`
whose batch holds, for each running request, its pending token and its draft, plus chunks
of new prompts' prefill. Each request lives in a *slot*, a llama.cpp sequence id with its
own KV cells (one unified KV buffer of `num_slots * slot_ctx_tokens` cells), and a slot
keeps its tokens' KV after its request ends, so the next request that shares the prefix
(the same agent session, one call later) evaluates only what is new.

This module knows llama.cpp's low-level API (`llama_batch`, `llama_decode`,
`llama_get_logits`, `llama_memory_seq_rm`) and nothing of requests, drafting or HTTP.

Example with concrete tokens: slot 0 holds `[5, 6, 7]` (KV), slot 1 holds `[]`;
`decode([(0, [8, 9], 0, 2), (1, [1, 2, 3], 0, 0)])` evaluates 8, 9 at positions 3, 4 of
sequence 0 and 1, 2, 3 at positions 0, 1, 2 of sequence 1 in one pass, and returns the
logits of the two rows asked for (8's and 9's) as a `[2, n_vocab]` array; `keep(0, 4)`
then drops 9's KV again (a rejected draft token).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from agspec.adapters.llama_cpp import import_llama_cpp

__all__ = ["SlotDecoder", "common_prefix_length"]


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share.

    >>> common_prefix_length([1, 2, 3], [1, 2, 4, 5])
    2
    """
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


class SlotDecoder:
    """`num_slots` sequences of up to `slot_ctx_tokens` tokens each, decoded together.

    Built on a loaded `llama_cpp.Llama` (its model and tokenizer; its own context is not
    used): a second llama.cpp context with `n_seq_max = num_slots` and a unified KV buffer,
    and one `llama_batch` of `n_batch` tokens.

    Invariant: `cached[s]` are the tokens whose KV sequence `s` holds, at positions
    0..len-1; `decode` appends to it and `keep` cuts it, both in step with llama.cpp.
    """

    def __init__(
        self,
        llm: Any,
        *,
        num_slots: int,
        slot_ctx_tokens: int,
        n_batch: int,
        threads: int,
    ) -> None:
        llama_cpp = import_llama_cpp()
        if not 1 <= num_slots <= int(llama_cpp.llama_max_parallel_sequences()):
            raise ValueError(
                f"num_slots must be in [1, {llama_cpp.llama_max_parallel_sequences()}], "
                f"got {num_slots}"
            )
        if slot_ctx_tokens < 8 or n_batch < 1:
            raise ValueError(
                f"slot_ctx_tokens must be >= 8 and n_batch >= 1, got {slot_ctx_tokens}, {n_batch}"
            )
        self._lib = llama_cpp
        self.llm = llm
        self.num_slots = num_slots
        self.slot_ctx_tokens = slot_ctx_tokens
        self.n_batch = n_batch
        self.n_vocab = int(llm.n_vocab())
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = num_slots * slot_ctx_tokens
        params.n_batch = n_batch
        params.n_ubatch = n_batch  # one compute pass per step (no split of the batch)
        params.n_seq_max = num_slots
        # One KV buffer for every sequence: a batch of uneven sequences (one prefill chunk
        # and a few decoding slots) stays one pass; per-sequence streams would split it.
        params.kv_unified = True
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        ctx = llama_cpp.llama_init_from_model(llm._model.model, params)
        if ctx is None:
            raise RuntimeError(
                f"llama.cpp could not make a context of {num_slots} x {slot_ctx_tokens} tokens"
            )
        self._ctx = ctx
        self._memory = llama_cpp.llama_get_memory(ctx)
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        b = self._batch
        self._token = np.ctypeslib.as_array(b.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(n_batch,))
        self._logits_flag = np.ctypeslib.as_array(
            ctypes.cast(b.logits, ctypes.POINTER(ctypes.c_int8)), shape=(n_batch,)
        )
        np.ctypeslib.as_array(b.n_seq_id, shape=(n_batch,))[:] = 1
        # The per-token sequence-id arrays (one id each): pointers kept for the fill loop.
        self._seq_ptrs = [b.seq_id[i] for i in range(n_batch)]
        self._slot_of_row = [-1] * n_batch  # which slot each row's seq id was set to
        self.cached: list[list[int]] = [[] for _ in range(num_slots)]
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._lib.llama_batch_free(self._batch)
            self._lib.llama_free(self._ctx)

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown
        try:
            self.close()
        except Exception:
            pass

    def keep(self, slot: int, num_tokens: int) -> None:
        """Keep the first `num_tokens` tokens of slot `slot`'s KV (drop the rest)."""
        cached = self.cached[slot]
        if num_tokens < len(cached):
            self._lib.llama_memory_seq_rm(self._memory, slot, num_tokens, -1)
            del cached[num_tokens:]

    def clear(self) -> None:
        """Forget every slot's KV (after a failed decode)."""
        self._lib.llama_memory_clear(self._memory, True)
        for c in self.cached:
            c.clear()

    def decode(self, parts: Sequence[tuple[int, Sequence[int], int, int]]) -> np.ndarray:
        """Evaluate every `(slot, tokens, out_start, out_stop)` of `parts` in one
        `llama_decode`.

        `tokens` are appended to the slot's sequence; the logits of `tokens[out_start:
        out_stop]` are returned, the rows of every part in order, as a `[rows, n_vocab]`
        float32 view that stays valid until the next `decode` (copy what must outlive it).
        """
        total = sum(len(p[1]) for p in parts)
        if total == 0:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        if total > self.n_batch:
            raise ValueError(f"a step of {total} tokens does not fit n_batch {self.n_batch}")
        row = 0
        num_rows = 0
        for slot, tokens, out_start, out_stop in parts:
            if not 0 <= slot < self.num_slots:
                raise ValueError(f"slot {slot} is outside [0, {self.num_slots})")
            n = len(tokens)
            if not 0 <= out_start <= out_stop <= n:
                raise ValueError(f"rows [{out_start}, {out_stop}) are outside [0, {n}]")
            start = len(self.cached[slot])
            if start + n > self.slot_ctx_tokens:
                raise ValueError(
                    f"slot {slot} would hold {start + n} tokens; a slot holds "
                    f"{self.slot_ctx_tokens}"
                )
            self._token[row : row + n] = tokens
            self._pos[row : row + n] = np.arange(start, start + n, dtype=np.int32)
            self._logits_flag[row : row + n] = 0
            self._logits_flag[row + out_start : row + out_stop] = 1
            for i in range(row, row + n):
                if self._slot_of_row[i] != slot:
                    self._seq_ptrs[i][0] = slot
                    self._slot_of_row[i] = slot
            row += n
            num_rows += out_stop - out_start
        self._batch.n_tokens = total
        rc = self._lib.llama_decode(self._ctx, self._batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} for a batch of {total} tokens")
        for slot, tokens, _, _ in parts:
            self.cached[slot].extend(int(t) for t in tokens)
        if num_rows == 0:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        ptr = self._lib.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(num_rows * self.n_vocab,)).reshape(
            num_rows, self.n_vocab
        )
