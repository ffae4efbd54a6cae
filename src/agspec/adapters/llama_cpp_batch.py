"""Many sequences in one llama.cpp context (`SlotDecoder`), for continuous batching.

`agspec serve --parallel N` decodes N requests at once: every step is one `llama_decode`
whose batch holds, for each running request, its pending token and its draft, plus chunks
of new prompts' prefill. Each request lives in a *slot*, a llama.cpp sequence id with its
own KV cells (one unified KV buffer of `num_slots * slot_ctx_tokens` cells), and a slot
keeps its tokens' KV after its request ends, so the next request that shares the prefix
(the same agent session, one call later) evaluates only what is new.

A slot can also start from another's cells (`copy_prefix`: the shared prefix's cells gain
the slot's sequence id, no KV is copied) or from KV saved in host memory (`save`,
`restore`: llama.cpp's per-sequence state), so a prompt is prefilled only past the
longest prefix whose KV the server holds anywhere.

This module knows llama.cpp's low-level API (`llama_batch`, `llama_decode`,
`llama_get_logits`, `llama_memory_seq_rm`, `llama_state_seq_*`) and nothing of requests,
drafting or HTTP.

Example with concrete tokens: slot 0 holds `[5, 6, 7]` (KV), slot 1 holds `[]`;
`decode([(0, [8, 9], 0, 2), (1, [1, 2, 3], 0, 0)])` evaluates 8, 9 at positions 3, 4 of
sequence 0 and 1, 2, 3 at positions 0, 1, 2 of sequence 1 in one pass, and returns the
logits of the two rows asked for (8's and 9's) as a `[2, n_vocab]` array; `keep(0, 4)`
then drops 9's KV again (a rejected draft token).
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from agspec.adapters.llama_cpp import import_llama_cpp
from agspec.drafter.tree import tree_branches

__all__ = ["SavedKV", "SlotDecoder", "common_prefix_length"]


class SavedKV:
    """One slot's KV in host memory (`SlotDecoder.save`): the tokens whose KV it holds, at
    positions 0..len-1, and llama.cpp's serialized sequence state. Opaque to callers but
    for `tokens` and `nbytes`; `SlotDecoder.restore` puts it back into any slot of the
    decoder that saved it."""

    __slots__ = ("_buf", "_owner", "tokens")

    def __init__(self, tokens: Sequence[int], buf: Any, owner: int) -> None:
        self.tokens: tuple[int, ...] = tuple(int(t) for t in tokens)
        self._buf = buf
        self._owner = owner

    @property
    def nbytes(self) -> int:
        return len(self._buf)

    def __repr__(self) -> str:
        return f"SavedKV({len(self.tokens)} tokens, {self.nbytes} bytes)"


def common_prefix_length(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
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
        branches_per_slot: int = 1,
        flash_attn_type: int | None = None,
    ) -> None:
        llama_cpp = import_llama_cpp()
        if not 1 <= num_slots <= int(llama_cpp.llama_max_parallel_sequences()):
            raise ValueError(
                f"num_slots must be in [1, {llama_cpp.llama_max_parallel_sequences()}], "
                f"got {num_slots}"
            )
        max_seqs = int(llama_cpp.llama_max_parallel_sequences())
        if not 1 <= branches_per_slot or num_slots * branches_per_slot > max_seqs:
            raise ValueError(
                f"num_slots x branches_per_slot must be in [1, {max_seqs}] (llama.cpp's "
                f"sequence ids), got {num_slots} x {branches_per_slot}"
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
        # A token tree's branches: each its own sequence id. Slot s's main sequence is s;
        # its other branches take the ids in [num_slots + s (W - 1), num_slots + (s + 1)
        # (W - 1)), W = branches_per_slot, so no two slots' trees share an id.
        self.branches_per_slot = branches_per_slot
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = num_slots * slot_ctx_tokens
        params.n_batch = n_batch
        params.n_ubatch = n_batch  # one compute pass per step (no split of the batch)
        params.n_seq_max = num_slots * branches_per_slot
        # One KV buffer for every sequence: a batch of uneven sequences (one prefill chunk
        # and a few decoding slots) stays one pass; per-sequence streams would split it.
        # It also makes a tree branch's copy of its slot's prefix (`llama_memory_seq_cp`
        # within one stream) a change of the cells' sequence sets, not a copy of KV data;
        # and a token of several branches (`n_seq_id` > 1) needs one stream.
        params.kv_unified = True
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        if flash_attn_type is not None:  # else llama.cpp's default (auto)
            params.flash_attn_type = flash_attn_type
        ctx = llama_cpp.llama_init_from_model(llm._model.model, params)
        if ctx is None:
            raise RuntimeError(
                f"llama.cpp could not make a context of {num_slots} x {slot_ctx_tokens} tokens"
            )
        self._ctx = ctx
        self._memory = llama_cpp.llama_get_memory(ctx)
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, branches_per_slot)
        b = self._batch
        self._token = np.ctypeslib.as_array(b.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(n_batch,))
        self._logits_flag = np.ctypeslib.as_array(
            ctypes.cast(b.logits, ctypes.POINTER(ctypes.c_int8)), shape=(n_batch,)
        )
        self._n_seq_id = np.ctypeslib.as_array(b.n_seq_id, shape=(n_batch,))
        self._n_seq_id[:] = 1
        # The per-token sequence-id arrays: pointers kept for the fill loop.
        self._seq_ptrs = [b.seq_id[i] for i in range(n_batch)]
        self._slot_of_row = [-1] * n_batch  # which slot each row's one seq id was set to
        self.cached: list[list[int]] = [[] for _ in range(num_slots)]
        # A slot whose last decode was a tree: (prefix length, tree tokens, the branch
        # sequence ids, each node's branches) until `keep_path`. Between steps every
        # branch sequence but the main one is empty.
        self._trees: dict[int, tuple[int, list[int], list[int], list[list[int]]]] = {}
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

    def branch_seq_ids(self, slot: int) -> list[int]:
        """The sequence ids a tree of slot `slot` may use: its main one first.

        >>> # 4 slots of 8 branches: slot 1 uses [1, 11, 12, ..., 17]
        """
        w = self.branches_per_slot - 1
        first = self.num_slots + slot * w
        return [slot, *range(first, first + w)]

    def keep(self, slot: int, num_tokens: int) -> None:
        """Keep the first `num_tokens` tokens of slot `slot`'s KV (drop the rest)."""
        if slot in self._trees:
            raise RuntimeError(f"slot {slot} decoded a tree: keep_path() first")
        cached = self.cached[slot]
        if num_tokens < len(cached):
            self._lib.llama_memory_seq_rm(self._memory, slot, num_tokens, -1)
            del cached[num_tokens:]

    def copy_prefix(self, src: int, dst: int, num_tokens: int) -> None:
        """Make slot `dst` hold the first `num_tokens` tokens of slot `src` (its own KV
        dropped first): the cells gain `dst`'s sequence id (`llama_memory_seq_cp` in the
        unified buffer), so no KV is computed or copied and `src` keeps its own.

        Example: slot 0 holds `[5, 6, 7, 8]`; `copy_prefix(0, 1, 3)` makes slot 1 hold
        `[5, 6, 7]` in the same cells; decoding `[9]` in slot 1 then puts 9 at position 3
        of sequence 1 alone."""
        if src == dst:
            raise ValueError(f"copy_prefix needs two slots, got {src} twice")
        for s in (src, dst):
            if s in self._trees:
                raise RuntimeError(f"slot {s} decoded a tree: keep_path() first")
        if not 0 <= num_tokens <= len(self.cached[src]):
            raise ValueError(
                f"slot {src} holds {len(self.cached[src])} tokens, cannot copy {num_tokens}"
            )
        lib, mem = self._lib, self._memory
        lib.llama_memory_seq_rm(mem, dst, -1, -1)
        if num_tokens:
            lib.llama_memory_seq_cp(mem, src, dst, 0, num_tokens)
        self.cached[dst] = self.cached[src][:num_tokens]

    def save(self, slot: int) -> SavedKV:
        """Slot `slot`'s KV, serialized into host memory (the slot keeps it too)."""
        if slot in self._trees:
            raise RuntimeError(f"slot {slot} decoded a tree: keep_path() first")
        lib = self._lib
        size = int(lib.llama_state_seq_get_size(self._ctx, slot))
        buf = (ctypes.c_ubyte * size)()
        n = int(lib.llama_state_seq_get_data(self._ctx, buf, size, slot))
        if n != size:
            raise RuntimeError(f"llama.cpp saved {n} of the {size} bytes of slot {slot}'s KV")
        return SavedKV(self.cached[slot], buf, id(self))

    def restore(self, slot: int, saved: SavedKV) -> bool:
        """Replace slot `slot`'s KV by `saved` (from this decoder's `save`). False when
        llama.cpp finds no room for its cells: the slot is then empty, as after
        `keep(slot, 0)`."""
        if saved._owner != id(self):
            raise ValueError("this SavedKV was saved by another SlotDecoder")
        if slot in self._trees:
            raise RuntimeError(f"slot {slot} decoded a tree: keep_path() first")
        if len(saved.tokens) > self.slot_ctx_tokens:
            raise ValueError(
                f"{len(saved.tokens)} saved tokens do not fit a slot of {self.slot_ctx_tokens}"
            )
        lib = self._lib
        lib.llama_memory_seq_rm(self._memory, slot, -1, -1)
        self.cached[slot] = []
        n = int(lib.llama_state_seq_set_data(self._ctx, saved._buf, saved.nbytes, slot))
        if n != saved.nbytes:
            lib.llama_memory_seq_rm(self._memory, slot, -1, -1)
            return False
        self.cached[slot] = list(saved.tokens)
        return True

    def clear(self) -> None:
        """Forget every slot's KV (after a failed decode)."""
        self._lib.llama_memory_clear(self._memory, True)
        for c in self.cached:
            c.clear()
        self._trees.clear()

    def keep_path(self, slot: int, path: Sequence[int]) -> None:
        """After a tree decode of slot `slot`: keep the pending token and the tree nodes
        `path` (a root path, node indices root first) as the slot's own KV, and drop every
        other node's cells and every branch sequence but the main one.

        The nodes of `path` are the cells, at positions prefix + 1 .. prefix + len(path),
        of any branch through its last node; they become the main sequence's
        (`llama_memory_seq_cp`, metadata only in one stream) after the main sequence's
        tree cells are removed, and the other branches' sequences are removed whole. A
        cell no sequence holds any more is free.

        Example: prefix 10 cells, pending 7 at position 10, tree `[8, 9, 4]` parents
        `[-1, 0, 0]` (branches 0: 8 -> 9, 1: 8 -> 4); `keep_path(s, [0, 2])` keeps 7, 8, 4
        (branch 1's cells at 11, 12) in sequence s: `cached[s]` ends in 7, 8, 4.
        """
        state = self._trees.pop(slot, None)
        if state is None:
            raise RuntimeError(f"slot {slot} did not decode a tree")
        prefix, tokens, seq_ids, through = state
        lib, mem = self._lib, self._memory
        main = seq_ids[0]
        end = prefix + 1 + len(path)
        if path:
            owner = seq_ids[through[path[-1]][0]]
            if owner == main:
                lib.llama_memory_seq_rm(mem, main, end, -1)
            else:
                lib.llama_memory_seq_rm(mem, main, prefix + 1, -1)
                lib.llama_memory_seq_cp(mem, owner, main, prefix + 1, end)
        else:
            lib.llama_memory_seq_rm(mem, main, prefix + 1, -1)
        for seq in seq_ids[1:]:
            lib.llama_memory_seq_rm(mem, seq, -1, -1)
        self.cached[slot].extend(tokens[i] for i in path)

    def decode(
        self,
        parts: Sequence[tuple[int, Sequence[int], int, int]],
        trees: Mapping[int, Sequence[int]] | None = None,
    ) -> np.ndarray:
        """Evaluate every `(slot, tokens, out_start, out_stop)` of `parts` in one
        `llama_decode`.

        `tokens` are appended to the slot's sequence; the logits of `tokens[out_start:
        out_stop]` are returned, the rows of every part in order, as a `[rows, n_vocab]`
        float32 view that stays valid until the next `decode` (copy what must outlive it).

        `trees[slot]`, for a part whose tokens are a pending token and a token tree's
        nodes: the nodes' parents (`agspec.drafter.tree`, -1: the pending token). Each
        branch (leaf) gets one of the slot's sequence ids (`branch_seq_ids`), holding the
        slot's prefix (copied by reference) and its own path: a node is tagged with the
        ids of every branch through it, at position prefix + its depth, so it attends to
        the prefix, its ancestors and itself only (llama.cpp masks a cell unless it holds
        the token's first sequence id at a position not after the token's). The slot's
        `cached` does not grow until `keep_path` says which root path was accepted.
        Example: pending 7 and tree `[8, 9, 4]`, parents `[-1, 0, 0]`, after a prefix of
        10: 7 at position 10 in branches {0, 1}, 8 at 11 in {0, 1}, 9 at 12 in {0}, 4 at
        12 in {1}.
        """
        trees = trees or {}
        total = sum(len(p[1]) for p in parts)
        if total == 0:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        if total > self.n_batch:
            raise ValueError(f"a step of {total} tokens does not fit n_batch {self.n_batch}")
        try:
            num_rows = self._fill(parts, trees)
        except BaseException:
            for slot in trees:
                self._drop_tree(slot)
            raise
        self._batch.n_tokens = total
        rc = self._lib.llama_decode(self._ctx, self._batch)
        if rc != 0:
            for slot in trees:
                self._drop_tree(slot)
            raise RuntimeError(f"llama_decode returned {rc} for a batch of {total} tokens")
        for slot, tokens, _, _ in parts:
            if slot not in trees:
                self.cached[slot].extend(int(t) for t in tokens)
            else:
                self.cached[slot].append(int(tokens[0]))  # the pending token: every branch's
        if num_rows == 0:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        ptr = self._lib.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(num_rows * self.n_vocab,)).reshape(
            num_rows, self.n_vocab
        )

    def _fill(
        self,
        parts: Sequence[tuple[int, Sequence[int], int, int]],
        trees: Mapping[int, Sequence[int]],
    ) -> int:
        """Writes every part into the batch (see `decode`); returns the number of
        logits rows asked for."""
        row = 0
        num_rows = 0
        for slot, tokens, out_start, out_stop in parts:
            if not 0 <= slot < self.num_slots:
                raise ValueError(f"slot {slot} is outside [0, {self.num_slots})")
            n = len(tokens)
            if not 0 <= out_start <= out_stop <= n:
                raise ValueError(f"rows [{out_start}, {out_stop}) are outside [0, {n}]")
            if slot in self._trees:
                raise RuntimeError(f"slot {slot} decoded a tree: keep_path() first")
            start = len(self.cached[slot])
            if start + n > self.slot_ctx_tokens:
                raise ValueError(
                    f"slot {slot} would hold {start + n} tokens; a slot holds "
                    f"{self.slot_ctx_tokens}"
                )
            self._token[row : row + n] = tokens
            self._logits_flag[row : row + n] = 0
            self._logits_flag[row + out_start : row + out_stop] = 1
            parents = trees.get(slot)
            if parents is None:
                self._pos[row : row + n] = np.arange(start, start + n, dtype=np.int32)
                for i in range(row, row + n):
                    if self._slot_of_row[i] != slot:
                        self._seq_ptrs[i][0] = slot
                        self._n_seq_id[i] = 1
                        self._slot_of_row[i] = slot
            else:
                self._fill_tree(row, slot, start, [int(t) for t in tokens], parents)
            row += n
            num_rows += out_stop - out_start
        return num_rows

    def _fill_tree(
        self, row: int, slot: int, start: int, tokens: list[int], parents: Sequence[int]
    ) -> None:
        """The batch rows of one tree part (see `decode`): the pending token `tokens[0]`
        at `start` in every branch, node i at `start` + its depth in the branches through
        it; each branch other than the first holds a reference copy of the prefix."""
        if len(parents) != len(tokens) - 1:
            raise ValueError(
                f"slot {slot}: a tree part has {len(tokens) - 1} nodes and {len(parents)} parents"
            )
        leaves, through, depth = tree_branches(parents)
        ids = self.branch_seq_ids(slot)
        if len(leaves) > len(ids):
            raise ValueError(
                f"slot {slot}: a tree of {len(leaves)} branches; a slot has "
                f"{len(ids)} sequence ids (branches_per_slot)"
            )
        seq_ids = ids[: len(leaves)]
        lib, mem = self._lib, self._memory
        for seq in seq_ids[1:]:
            lib.llama_memory_seq_cp(mem, slot, seq, -1, -1)
        self._trees[slot] = (start, tokens[1:], seq_ids, through)
        n_seq, ptrs = self._n_seq_id, self._seq_ptrs
        self._pos[row] = start
        n_seq[row] = len(seq_ids)
        for j, seq in enumerate(seq_ids):
            ptrs[row][j] = seq
        self._slot_of_row[row] = -1
        for i, branches in enumerate(through):
            r = row + 1 + i
            self._pos[r] = start + depth[i]
            n_seq[r] = len(branches)
            for j, b in enumerate(branches):
                ptrs[r][j] = seq_ids[b]
            self._slot_of_row[r] = -1

    def _drop_tree(self, slot: int) -> None:
        """Forget a tree part whose decode failed: its branch sequences' copies go."""
        state = self._trees.pop(slot, None)
        if state is not None:
            for seq in state[2][1:]:
                self._lib.llama_memory_seq_rm(self._memory, seq, -1, -1)
