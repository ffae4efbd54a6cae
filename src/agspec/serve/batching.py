"""Continuous batching for `agspec serve --parallel N`: the decode worker's loop.

One thread owns the llama.cpp context (`SlotDecoder`, N slots). Every step:

1. Finished, cancelled (client gone) and timed-out requests leave their slots; queued
   requests that waited past `--queue-timeout` get 503 with Retry-After.
2. Queued requests take free slots, each the free slot whose cached tokens share the
   longest prefix with its prompt (an agent session's next call finds its history there:
   only the new messages are prefilled).
3. The drafter drafts for every decoding request in one batched step (`step_batch`, the
   cost rule priced at the live batch size: token trees for greedy requests, chains for
   sampled ones); other drafters draft call by call.
4. One `llama_decode` evaluates each decoding request's pending token and draft, plus
   prefill chunks of admitted prompts in the room left (at most `--prefill-chunk` tokens
   while others decode, so a long prompt delays them by one chunk per step, not by its
   whole prefill).
5. Each decoding request keeps its draft's longest prefix equal to the argmax (or the
   sampled token: exact sampling, as `agspec.adapters.llama_cpp.Sampling`), rolls the
   rejected draft's KV back in its own slot, and streams what it committed.

The per-request time bound (`--request-timeout`) is checked between prefill chunks and
decode steps: a request past it ends with 504. Greedy output equals plain decoding
token for token, up to llama.cpp's batched kernels flipping a near-tie.
"""

from __future__ import annotations

import logging
import math
import random
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from agspec.adapters.llama_cpp_batch import SlotDecoder, common_prefix_length
from agspec.adapters.llama_cpp_tree import fit_branches
from agspec.drafter.tree import DraftTree, check_tree, greedy_tree_path
from agspec.serve.kv_store import KVStore
from agspec.serve.metrics import speculative_decoding_metrics
from agspec.serve.schema import APIError
from agspec.serve.text import TextStream

if TYPE_CHECKING:
    from agspec.adapters.llama_cpp import Sampling
    from agspec.serve.engine import Engine, Job

log = logging.getLogger("agspec.serve")

__all__ = ["BatchLoop", "PROBE_EVERY_STEPS"]

# At most one probe step (`BatchLoop._probe`) in this many steps.
PROBE_EVERY_STEPS = 4
# With the live cost profile, one step in this many decodes every decoding request, however
# few the cheapest width holds (`BatchLoop._decode_width`).
FULL_WIDTH_EVERY = 16
# A request starts from another slot's cells or a saved entry when that spares it at least
# this many prompt tokens of prefill; a slot cache is saved when cutting it would lose at
# least this many of another session's tokens.
MIN_SHARED_TOKENS = 32
MIN_SAVED_TOKENS = 64


@dataclass
class _Running:
    """A request in a slot. Prefill until `prefilled == len(prompt) - 1`, then decode:
    `pending` is the last committed (or the last prompt) token, not yet in the KV."""

    job: Job
    slot: int
    sid: str
    turn: int
    agent_label: str
    max_new: int
    text: TextStream
    call: Any = None  # the drafter call (None: --drafter none)
    sampling: Sampling | None = None
    rng: random.Random | None = None
    reused: int = 0
    prefilled: int = 0
    decoding: bool = False
    pending: int = -1
    evaluated: int = 0  # tokens of this request in the last step (pending, draft, probe)
    draft: list[int] = field(default_factory=list)  # the chain, or the tree's nodes
    tree: DraftTree | None = None  # a draft with more than one branch (its nodes: draft)
    committed: list[int] | None = None  # for the drafter's next accept (step_batch)
    tokens: list[int] = field(default_factory=list)
    steps: list[tuple[int, int, int]] = field(default_factory=list)  # drafted, accepted, committed
    by_source: dict[str, list[int]] = field(default_factory=dict)
    source: str = "other"
    started: float = 0.0  # admitted to the slot (monotonic)
    prefill_done: float = 0.0
    stopped_by: str = "length"
    # Another request still prefilling a longer prefix of this prompt: this one prefills
    # nothing until that one holds `wait_tokens` of it (or leaves, or decodes), then
    # starts from its cells (`BatchLoop._wait_done`).
    waits_for: _Running | None = None
    wait_tokens: int = 0
    last_step: int = -1  # the last step that decoded this request (`_decode_width`)

    @property
    def prompt(self) -> list[int]:
        return self.job.prompt_ids


def _timeout_error(job: Job, what: str) -> APIError:
    bound = job.deadline - job.submitted
    return APIError(
        504,
        f"the request timed out: it ran past its time bound of {bound:g} s "
        f"(--request-timeout) {what}",
        type="timeout",
        code="timeout",
    )


class BatchLoop:
    """The scheduler of the decode worker (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        cfg = engine.config
        self.engine = engine
        self.decoder = SlotDecoder(
            engine.llm,
            num_slots=cfg.parallel,
            slot_ctx_tokens=cfg.n_ctx,
            n_batch=cfg.n_batch,
            threads=cfg.threads,
            branches_per_slot=tree_branches_per_slot(engine.drafter_server, cfg),
        )
        # Greedy AgSpec requests draft token trees when the slots have room for branches.
        self.trees = self.decoder.branches_per_slot > 1
        self.slots: list[_Running | None] = [None] * cfg.parallel
        self._last_used = [0.0] * cfg.parallel
        # The session whose request last used each slot (whose cache it holds).
        self._owner: list[str | None] = [None] * cfg.parallel
        self.kv_store = KVStore(cfg.kv_store_bytes) if cfg.kv_store_bytes > 0 else None
        self.num_steps = 0

    # --- the loop ---------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return sum(r is not None for r in self.slots)

    def run(self) -> None:
        eng = self.engine
        while True:
            try:
                eng._drain_expired()
                self._admit()
            except Exception:  # bookkeeping between steps never stops the worker either
                log.exception("ending sessions or admitting requests failed")
            if self.num_running == 0:
                if eng._should_exit():
                    return
                eng._wait_for_work(0.5)
                continue
            try:
                self._step()
            except Exception as exc:  # never let one batch take the worker down
                log.exception("generation failed")
                self.decoder.clear()
                for r in list(self.slots):
                    if r is not None:
                        self._fail(
                            r, APIError(500, f"generation failed: {exc}", type="server_error")
                        )
                        eng.fail_session(r.sid)

    def _admit(self) -> None:
        eng = self.engine
        now = time.monotonic()
        for job in eng._take_expired_waiting(now):
            if job.cancel.is_set():
                eng.metrics.cancelled.labels("disconnected").inc()
                job.emit(eng._finished_empty(job))
            elif now > job.deadline:
                eng.metrics.cancelled.labels("timeout").inc()
                job.emit(eng._failed(_timeout_error(job, "while waiting for a slot")))
            else:
                eng.metrics.rejected.labels("no_free_slot").inc()
                job.emit(eng._failed(eng._no_slot_error()))
        while True:
            free = [i for i, r in enumerate(self.slots) if r is None]
            if not free:
                return
            nxt = eng._pop_waiting()
            if nxt is None:
                return
            slot = self._pick_slot(free, nxt.prompt_ids)
            try:
                self._start(nxt, slot)
            except Exception as exc:  # one request's admission never takes the worker down
                log.exception("admitting a request failed")
                self._fail_admission(nxt, slot, exc)

    def _fail_admission(self, job: Job, slot: int, exc: Exception) -> None:
        """`_start` raised: the request gets a 500, its session is forgotten, and the slot
        is freed with its cache dropped (a restore or copy may have stopped half way)."""
        try:
            self.decoder.keep(slot, 0)
        except Exception:
            log.exception("dropping the slot's cache failed")
        self._owner[slot] = None
        self.engine.fail_session(job.resolution.session_id)
        err = APIError(500, f"admitting the request failed: {type(exc).__name__}: {exc}",
                       type="server_error")  # fmt: skip
        r = self.slots[slot]
        if r is not None and r.job is job:
            self._fail(r, err)
        else:
            job.emit(self.engine._failed(err))

    def _pick_slot(self, free: list[int], prompt: list[int]) -> int:
        """The free slot whose cache this prompt continues most: the longest common
        prefix among slots that would keep at least half their cached tokens (a
        session's next call keeps all of them); else the slot unused longest (an empty
        one first). So a new session that only shares a system prompt with another's
        cache does not take it over while an empty or stale slot is free.

        >>> # cached: slot 0 = A's call 1 (300 tokens), slot 1 = [] ; A's call 2 -> 0;
        >>> # B's call 1 (same 40-token system prompt) -> 1
        """
        best, best_len = -1, 0
        for i in free:
            cached = self.decoder.cached[i]
            n = common_prefix_length(cached, prompt)
            if n > best_len and 2 * n >= len(cached):
                best, best_len = i, n
        if best >= 0:
            return best
        return min(free, key=lambda i: (len(self.decoder.cached[i]) > 0, self._last_used[i]))

    def _start(self, job: Job, slot: int) -> None:
        eng = self.engine
        m = eng.metrics
        sid = job.resolution.session_id
        turn = eng._turns.get(sid, 0)
        eng._turns[sid] = turn + 1
        sp = job.sampling
        room = eng.n_ctx - len(job.prompt_ids)
        max_new = room if sp.max_tokens is None else min(sp.max_tokens, room)
        r = _Running(
            job=job, slot=slot, sid=sid, turn=turn, agent_label=m.agent_label(job.agent),
            max_new=max_new,
            text=TextStream(eng.piece, stops=sp.stop, eog=eng.eog, hold_all=job.hold_all),
            started=time.monotonic(),
        )  # fmt: skip
        if not sp.greedy:
            from agspec.adapters.llama_cpp import Sampling

            seed = sp.seed if sp.seed is not None else secrets.randbits(32)
            r.sampling = Sampling(
                temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p, seed=seed
            )
            r.rng = random.Random(seed)
        prompt = job.prompt_ids
        # Start from the longest prefix of the prompt held anywhere (this slot, another
        # one, the KV store), then keep the slot's cached prefix of the prompt (all but its
        # last token, which stays pending for the first verification batch).
        self._seed_slot(slot, prompt[:-1], sid)
        self._owner[slot] = sid
        r.reused = common_prefix_length(self.decoder.cached[slot], prompt[:-1])
        self.decoder.keep(slot, r.reused)
        r.prefilled = r.reused
        self._wait_for_prefill(r)
        r.call = eng._drafter_call(sid, job.agent, turn)
        self.slots[slot] = r
        m.running.set(self.num_running)
        eng.running = self.num_running
        if r.prefilled >= len(prompt) - 1:
            self._begin_decoding(r)

    def _seed_slot(self, slot: int, want: list[int], sid: str) -> None:
        """Make `slot` hold the longest prefix of `want` the server has: its own cache,
        another slot's cells (`copy_prefix`) or a saved entry (`restore`), when that
        saves at least `MIN_SHARED_TOKENS` more. A cache of another session that this
        cuts is saved to the KV store first."""
        dec, m = self.decoder, self.engine.metrics
        own = common_prefix_length(dec.cached[slot], want)
        src, most = self._longest_elsewhere(slot, want, own)
        store = self.kv_store
        key, stored = store.best(want) if store is not None else (-1, 0)
        if stored > most and stored >= own + MIN_SHARED_TOKENS:
            assert store is not None
            # Taken before this slot's cache is saved: that save may drop it to fit.
            entry = store.take(key)
            self._save_before_cut(slot, 0, sid)
            ok = dec.restore(slot, entry)
            m.kv_restores.labels("ok" if ok else "failed").inc()
        elif src >= 0 and most >= own + MIN_SHARED_TOKENS:
            self._save_before_cut(slot, 0, sid)
            dec.copy_prefix(src, slot, most)
            m.kv_copies.inc()
        else:
            self._save_before_cut(slot, own, sid)
        if store is not None:
            m.kv_store_bytes.set(store.nbytes)
            m.kv_store_entries.set(len(store))

    def _longest_elsewhere(self, slot: int, want: list[int], held: int) -> tuple[int, int]:
        """(the other slot whose cache holds the longest prefix of `want`, its length), when
        longer than `held`; else (-1, held)."""
        src, most = -1, held
        for i, cached in enumerate(self.decoder.cached):
            if i != slot and (n := common_prefix_length(cached, want)) > most:
                src, most = i, n
        return src, most

    def _wait_for_prefill(self, r: _Running) -> None:
        """Make `r` wait for the request still prefilling the longest prefix of its prompt
        that no slot or entry holds yet, when that spares at least `MIN_SHARED_TOKENS` of
        prefill: calls that arrive together and share a history (an agent's parallel
        workers, or a client that does not wait for one call before the next) prefill it
        once. A wait only points at a request admitted before, so waits never form a
        cycle.

        >>> # A (prompt 800 tokens) admitted, prefilled 0 so far; B shares its first 500:
        >>> # B waits for A until A holds 500, then copies them (`_wait_done`)
        """
        want = r.prompt[:-1]
        best, most = None, r.prefilled + MIN_SHARED_TOKENS - 1
        for o in self.slots:
            if o is None or o is r or o.decoding:
                continue
            n = common_prefix_length(o.prompt[:-1], want)
            if n > most and n > o.prefilled:
                best, most = o, n
        if best is not None:
            r.waits_for, r.wait_tokens = best, most

    def _wait_done(self, r: _Running) -> bool:
        """True, once `r`'s wait is over: it then starts from the longest prefix of its
        prompt another slot holds (usually the cells the request it waited for just
        prefilled) and decodes at once if that was all of it."""
        o = r.waits_for
        if o is None:
            return True
        if self.slots[o.slot] is o and not o.decoding and o.prefilled < r.wait_tokens:
            return False
        r.waits_for = None
        src, most = self._longest_elsewhere(r.slot, r.prompt[:-1], r.prefilled)
        if src >= 0 and most >= r.prefilled + MIN_SHARED_TOKENS:
            self.decoder.copy_prefix(src, r.slot, most)
            r.reused += most - r.prefilled
            r.prefilled = most
            self.engine.metrics.kv_copies.inc()
        if r.prefilled >= len(r.prompt) - 1:
            self._begin_decoding(r)
        return True

    def _save_before_cut(self, slot: int, keep: int, sid: str) -> None:
        """Save `slot`'s cache to the KV store when cutting it to `keep` tokens would lose
        at least `MIN_SAVED_TOKENS` of another session's tokens that no other slot or
        entry holds."""
        store, dec = self.kv_store, self.decoder
        cached = dec.cached[slot]
        owner = self._owner[slot]
        if store is None or owner is None or owner == sid or len(cached) - keep < MIN_SAVED_TOKENS:
            return
        n = len(cached)
        if store.covers(cached) or any(
            i != slot and len(c) >= n and common_prefix_length(c, cached) == n
            for i, c in enumerate(dec.cached)
        ):
            return
        if store.put(dec.save(slot)):
            self.engine.metrics.kv_saves.inc()

    def _begin_decoding(self, r: _Running) -> None:
        r.decoding = True
        r.pending = r.prompt[-1]
        r.prefill_done = time.monotonic()
        if r.call is not None:
            r.call.begin(r.prompt)

    # --- one step -----------------------------------------------------------------------

    def _stop_reason(self, r: _Running) -> str | None:
        if r.job.cancel.is_set():
            return "cancelled"
        if self.engine._abort.is_set():
            return "abort"
        if time.monotonic() > r.job.deadline:
            return "timeout"
        return None

    def _step(self) -> None:
        eng = self.engine
        cfg = eng.config
        # Requests that must leave before this step: the client went away, the time bound.
        for r in list(self.slots):
            if r is not None and (why := self._stop_reason(r)) is not None:
                self._end_early(r, why)
        # Requests that waited for another's prefill (`_wait_for_prefill`) and may go on.
        for r in self.slots:
            if r is not None and r.waits_for is not None:
                self._wait_done(r)
        decoding = self._decode_width([r for r in self.slots if r is not None and r.decoding])
        t_draft = time.perf_counter()
        if decoding:
            self._draft(decoding)
        t_decode = time.perf_counter()
        parts: list[tuple[int, list[int], int, int]] = []
        trees: dict[int, list[int]] = {}
        probe = self._probe(decoding)
        for r in decoding:
            toks = [r.pending, *r.draft]
            if r is probe[0]:
                toks += probe[1]
            r.evaluated = len(toks)
            parts.append((r.slot, toks, 0, 1 + len(r.draft)))
            if r.tree is not None:
                trees[r.slot] = r.tree.parents
        used = sum(len(p[1]) for p in parts)
        room = cfg.n_batch - used
        chunk_cap = min(room, cfg.prefill_chunk) if decoding else room
        prefilling: list[tuple[_Running, int]] = []
        for r in self.slots:
            if r is None or r.decoding or r.waits_for is not None or chunk_cap <= 0:
                continue
            n = min(len(r.prompt) - 1 - r.prefilled, chunk_cap)
            parts.append((r.slot, r.prompt[r.prefilled : r.prefilled + n], 0, 0))
            prefilling.append((r, n))
            chunk_cap -= n
        if not parts:
            return
        logits = self.decoder.decode(parts, trees)
        t_verify = time.perf_counter()
        row = 0
        step_tokens = sum(len(p[1]) for p in parts)
        self.num_steps += 1
        if decoding and not prefilling:
            # A pure decoding step: its time is a sample of the live cost profile.
            ms = (t_verify - t_decode) * 1000.0
            self.engine._observe_step(len(decoding), step_tokens, ms, filler=len(probe[1]))
        share_s = (t_verify - t_draft) / max(1, len(decoding) + len(prefilling))
        for r in decoding:
            k = 1 + len(r.draft)
            r.last_step = self.num_steps
            self._verify(r, logits[row : row + k])
            row += k
        for r, n in prefilling:
            r.prefilled += n
            eng.metrics.prefill_seconds.labels(r.agent_label).inc(share_s)
            if r.prefilled >= len(r.prompt) - 1:
                self._begin_decoding(r)
        if decoding:
            per = (t_decode - t_draft) / len(decoding)
            ver = (t_verify - t_decode) / (len(decoding) + len(prefilling))
            for r in decoding:
                eng.metrics.draft_seconds.labels(r.agent_label).inc(per)
                eng.metrics.verify_seconds.labels(r.agent_label).inc(ver)
                eng.metrics.verify_steps.labels(r.agent_label).inc()

    def _decode_width(self, decoding: list[_Running]) -> list[_Running]:
        """The decoding requests this step evaluates: the k of them that waited longest
        since their last step, k the count whose one-token step decodes the most tokens
        per millisecond at the measured step costs (ties: the larger k). On a GPU that is
        all of them; on a CPU, where llama.cpp's second row costs more than a whole
        one-row step (2 requests: 2.3 steps), two requests take turns instead. With the
        live profile, one step in `FULL_WIDTH_EVERY` takes them all, so the wider steps'
        prices stay measured.

        >>> # costs of 1..4 requests: 19, 44, 56, 58 ms; 2 decoding -> 1 (1/19 > 2/44),
        >>> # 3 -> 3 (3/56 > 1/19), 4 -> 4 (4/58 > 3/56)
        """
        n = len(decoding)
        costs = self.engine.step_costs
        if n <= 1 or costs is None:
            return decoding
        if costs is self.engine.live_cost and self.num_steps % FULL_WIDTH_EVERY == 0:
            return decoding
        best, best_rate = n, n / costs.step_time_ms(1, n)
        for k in range(n - 1, 0, -1):
            rate = k / costs.step_time_ms(1, k)
            if rate > best_rate:
                best, best_rate = k, rate
        if best == n:
            return decoding
        chosen = {id(r) for r in sorted(decoding, key=lambda r: r.last_step)[:best]}
        return [r for r in decoding if id(r) in chosen]

    def _probe(self, decoding: list[_Running]) -> tuple[_Running | None, list[int]]:
        """Filler tokens for one request of this step, when the live cost profile wants a
        sample of a step size it lacks (`LiveCostProfile.wanted_probe`: the whole step
        then holds that many tokens, the others' drafts counted): the request's own
        recent tokens, after its pending token. Only the rows before them
        are read and their KV is dropped with the rejected draft, so the output is what it
        would have been without them."""
        live = self.engine.live_cost
        if live is None or self.num_steps % PROBE_EVERY_STEPS:
            return None, []
        if any(not r.decoding for r in self.slots if r is not None):
            return None, []  # a prefill chunk joins this step: its time is no sample
        used = sum(1 + len(r.draft) for r in decoding)
        k = live.wanted_probe(len(decoding), self.num_steps, used)
        if k <= 0 or used + k > self.engine.config.n_batch:
            return None, []
        for r in decoding:
            room = self.decoder.slot_ctx_tokens - len(self.decoder.cached[r.slot]) - 1
            if not r.draft and room >= k:
                recent = (r.prompt + r.tokens)[-k:]
                return r, (recent * (k // len(recent) + 1))[:k]
        return None, []

    def _draft(self, decoding: list[_Running]) -> None:
        """Every decoding request's next draft, the AgSpec calls in `step_batch`: one
        batched tree step for the greedy requests when the slots have room for branches,
        one batched chain step for the others, both priced at the live batch size."""
        cfg = self.engine.config
        chains: list[_Running] = []
        chain_caps: list[int] = []
        trees: list[_Running] = []
        tree_caps: list[int] = []
        for r in decoding:
            room = self.decoder.slot_ctx_tokens - len(self.decoder.cached[r.slot]) - 1
            want = max(0, min(cfg.num_draft_tokens, r.max_new - len(r.tokens) - 1, room))
            r.draft = []
            r.tree = None
            if r.call is None:
                continue
            if _is_agspec_call(r.call):
                if self.trees and r.sampling is None:
                    trees.append(r)
                    tree_caps.append(want)
                else:
                    chains.append(r)
                    chain_caps.append(want)
                continue
            if r.committed:
                r.call.accept(r.committed)
            r.committed = None
            if want > 0:
                r.draft = [int(t) for t in r.call.propose(want)][:want]
                r.source = str(getattr(r.call, "last_source", None) or "other")
        if not (trees or chains):
            return
        from agspec.drafter.batch import step_batch

        if trees:
            drafted = step_batch(
                [r.call for r in trees],
                [r.committed for r in trees],
                tree_caps,
                batch_size=len(decoding),
                trees=True,
            )
            for r, tree, k in zip(trees, drafted, tree_caps):
                r.committed = None
                if k > 0:
                    self._take_tree(r, tree, k)
        if chains:
            drafts = step_batch(
                [r.call for r in chains],
                [r.committed for r in chains],
                chain_caps,
                batch_size=len(decoding),
            )
            for r, d, k in zip(chains, drafts, chain_caps):
                r.committed = None
                r.draft = [int(t) for t in d][:k]
                r.source = str(r.call.last_source or "other") if r.draft else "other"

    def _take_tree(self, r: _Running, tree: Any, want: int) -> None:
        """The drafter's tree as this step's draft: checked (refused before decoding),
        cut to the slot's branch sequences; a one-branch tree is a chain."""
        if not isinstance(tree, DraftTree):
            raise TypeError(f"propose_tree must return a DraftTree, got {type(tree).__name__}")
        check_tree(tree.token_ids, tree.parents, what="the drafter's tree")
        if len(tree) > want:
            raise ValueError(f"the drafter proposed {len(tree)} nodes, more than {want}")
        tree = fit_branches(tree, self.decoder.branches_per_slot)
        r.draft = [int(t) for t in tree.token_ids]
        r.tree = None if tree.is_chain else tree
        r.source = str(r.call.last_source or "other") if r.draft else "other"

    def _verify(self, r: _Running, rows: np.ndarray) -> None:
        draft = r.draft
        if r.tree is not None:
            # Greedy over the tree: the accepted root path stays in the slot's KV.
            argmax = rows.argmax(axis=1).tolist()
            path = greedy_tree_path(r.tree, argmax)
            committed = [draft[i] for i in path] + [argmax[path[-1] + 1 if path else 0]]
            accepted = len(path)
            self.decoder.keep_path(r.slot, path)
            self.engine.metrics.tree_steps.labels(r.agent_label).inc()
        elif r.sampling is None:
            chosen = rows.argmax(axis=1)
            accepted = 0
            while accepted < len(draft) and int(chosen[accepted]) == draft[accepted]:
                accepted += 1
            committed = [*draft[:accepted], int(chosen[accepted])]
        else:
            assert r.rng is not None
            committed = []
            for i in range(len(rows)):
                token = r.sampling.sample(rows[i], r.rng)
                committed.append(token)
                if i >= len(draft) or token != draft[i]:
                    break
            accepted = len(committed) - 1
        if r.tree is None:
            base = len(self.decoder.cached[r.slot]) - r.evaluated
            # KV keeps the pending token and the accepted draft; the bonus is pending now.
            self.decoder.keep(r.slot, base + 1 + accepted)
        stop = None
        eos = self.engine.eog
        for i, token in enumerate(committed):
            if token in eos:
                committed, stop = committed[: i + 1], "eos"
                break
        if len(r.tokens) + len(committed) > r.max_new:
            committed = committed[: r.max_new - len(r.tokens)]
        r.tokens.extend(committed)
        r.pending = committed[-1]
        acc = min(accepted, len(committed))
        r.steps.append((len(draft), acc, len(committed)))
        if draft:
            m = self.engine.metrics
            row = r.by_source.setdefault(r.source, [0, 0])
            row[0] += len(draft)
            row[1] += acc
            m.drafted.labels(r.agent_label, r.source).inc(len(draft))
            m.accepted.labels(r.agent_label, r.source).inc(acc)
        r.committed = committed
        r.text.add(committed)
        if r.job.stream:
            delta = r.text.pending()
            if delta:
                from agspec.serve.engine import Delta

                r.job.emit(Delta(delta))
        room = self.decoder.slot_ctx_tokens - len(self.decoder.cached[r.slot]) - 1
        if stop is not None:
            r.stopped_by = stop
        elif r.text.done:
            r.stopped_by = "stop_string"
        elif len(r.tokens) >= r.max_new:
            r.stopped_by = "length"
        elif room < 0:
            r.stopped_by = "context"
        else:
            return
        self._finish(r)

    # --- leaving a slot -------------------------------------------------------------------

    def _release(self, r: _Running) -> None:
        """Free the slot at once (its KV stays: the next call of the session reuses it);
        end the drafter call, handing it the last committed tokens first."""
        if r.call is not None and r.decoding:
            if r.committed:
                r.call.accept(r.committed)
            r.call.end()
        elif r.call is not None:
            # Never begun (still prefilling): nothing to hand over.
            end = getattr(r.call, "end", None)
            if end is not None and _is_agspec_call(r.call) and r.call._begun:
                end()
        r.committed = None
        # The slot's KV stays: every cached token was evaluated by this request (the
        # prompt, or the part prefilled so far, and the committed tokens but the last).
        self.slots[r.slot] = None
        self._last_used[r.slot] = time.monotonic()
        eng = self.engine
        eng.metrics.running.set(self.num_running)
        eng.running = self.num_running
        eng._recent_s.append(time.monotonic() - r.started)

    def _end_early(self, r: _Running, why: str) -> None:
        eng = self.engine
        from agspec.serve.engine import Finished

        self._release(r)
        self._count(r)
        if why == "cancelled":
            eng.metrics.cancelled.labels("disconnected").inc()
            r.job.emit(Finished(r.text.text, "cancelled", len(r.prompt), r.text.num_tokens, {}))
        elif why == "timeout":
            eng.metrics.cancelled.labels("timeout").inc()
            what = (
                f"after {len(r.tokens)} generated tokens"
                if r.decoding
                else f"during prefill ({r.prefilled} of {len(r.prompt)} prompt tokens done)"
            )
            r.job.emit(eng._failed(_timeout_error(r.job, what)))
        else:
            r.job.emit(
                eng._failed(
                    APIError(
                        503,
                        "the server shut down during generation",
                        type="server_error",
                        code="shutting_down",
                    )
                )  # fmt: skip
            )

    def _fail(self, r: _Running, err: APIError) -> None:
        self.slots[r.slot] = None
        self.engine.metrics.running.set(self.num_running)
        self.engine.running = self.num_running
        r.job.emit(self.engine._failed(err))

    def _count(self, r: _Running) -> None:
        m = self.engine.metrics
        m.prompt_tokens.labels(r.agent_label).inc(len(r.prompt))
        m.completion_tokens.labels(r.agent_label).inc(r.text.num_tokens)

    def _finish(self, r: _Running) -> None:
        eng = self.engine
        self._release(r)
        self._count(r)
        end = time.monotonic()
        prefill_ms = (r.prefill_done - r.started) * 1000.0
        total_ms = (end - r.started) * 1000.0
        finish = "stop" if r.text.done else "length"
        spec = speculative_decoding_metrics(
            [(d, a) for d, a, _ in r.steps], num_draft_tokens=eng.config.num_draft_tokens
        )
        eng._complete(
            r.job,
            text=r.text,
            finish=finish,
            sid=r.sid,
            turn=r.turn,
            max_new=r.max_new,
            steps=r.steps,
            by_source=r.by_source,
            reused=r.reused,
            tokens=r.tokens,
            stopped_by=r.stopped_by,
            prefill_ms=prefill_ms,
            total_ms=total_ms,
            queued_ms=(r.started - r.job.submitted) * 1000.0,
            speculative_decoding=spec,
        )


def tree_branches_per_slot(drafter_server: Any, cfg: Any) -> int:
    """Sequence ids per slot for token trees: one per possible branch (a tree of
    `--num-draft-tokens` nodes has at most that many leaves), within llama.cpp's 256
    sequences over all slots; 1 (chains only) when the drafter drafts no trees."""
    if int(getattr(drafter_server, "tree_max_nodes", 1)) <= 1 or cfg.num_draft_tokens <= 1:
        return 1
    return max(1, min(cfg.num_draft_tokens, 256 // cfg.parallel))


def _is_agspec_call(call: Any) -> bool:
    from agspec.drafter.call import AgSpecCall

    return isinstance(call, AgSpecCall)


def retry_after_s(recent_s: Sequence[float], waiting: int, slots: int) -> int:
    """Seconds a refused client should wait: the recent mean request time times the
    queue's length in rounds of `slots` requests (at least 1)."""
    mean = sum(recent_s) / len(recent_s) if recent_s else 1.0
    return max(1, math.ceil(mean * (waiting // max(1, slots) + 1)))
