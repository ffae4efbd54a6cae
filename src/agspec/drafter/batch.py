"""One verification step for many requests at once (`step_batch`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agspec.corpora.corpus_set import advance_batch, continuation_batch, match_lengths_batch
from agspec.drafter.call import AgSpecCall


def step_batch(
    calls: Sequence[AgSpecCall],
    committed: Sequence[Sequence[int] | np.ndarray | None],
    max_tokens: Sequence[int] | int,
    *,
    batch_size: int | None = None,
) -> list[list[int]]:
    """One verification step for many requests at once: accept, then propose.

    `committed[i]` is what the engine committed for `calls[i]` since its last step (its
    accepted draft prefix plus one token; None or empty right after `begin`), and
    `max_tokens[i]` bounds its next draft. `batch_size` (an engine whose batch changes
    every step: vLLM) prices the cost rule at that many requests from this step on
    (`AgSpecServer.set_batch_size`); None keeps the server's. Returns the drafts, in
    order. Equivalent to `accept` on every call, then `propose` on every call (so
    requests of one session see each other's tokens of this step), with every corpus of
    every request moved in one native call, every match read in another and every
    continuation copied in a third (one per call with a non-native engine).
    The calls may belong to different sessions of one server, or of several.

    >>> # drafts = step_batch([c1, c2], [[5], [7, 8]], 16)
    """
    n = len(calls)
    if batch_size is not None:
        # The cost rule prices this step's drafts at the engine's live batch size.
        for server in {id(call.session.server): call.session.server for call in calls}.values():
            server.set_batch_size(batch_size)
    if len(committed) != n:
        raise ValueError(f"committed has {len(committed)} entries for {n} calls")
    if type(max_tokens) is int:
        if not 0 <= max_tokens <= 1 << 16:
            raise ValueError(f"max_tokens must be ints in [0, 65536], got {max_tokens!r}")
        caps = [max_tokens] * n
    else:
        raw = [max_tokens] * n if isinstance(max_tokens, (int, np.integer)) else list(max_tokens)
        if len(raw) != n:
            raise ValueError(f"max_tokens has {len(raw)} entries for {n} calls")
        for k in raw:
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= 1 << 16:
                raise ValueError(f"max_tokens must be ints in [0, 65536], got {k!r}")
        caps = [int(k) for k in raw]
    if n == 1:
        # One request: the per-call path is the same step with fewer crossings.
        call, c = calls[0], committed[0]
        if c is not None and len(c):
            call.accept(c)
        elif not call._begun or call._ended:
            raise call._not_live("step_batch()")
        return [call.propose(caps[0])]
    applied: list[AgSpecCall] = []
    moved: list[list[int]] = []
    try:
        for call, c in zip(calls, committed):
            if c is not None and len(c):
                moved.append(call._check_committed(c))
                applied.append(call)
            elif not call._begun or call._ended:
                raise call._not_live("step_batch()")
    finally:
        # Every call whose tokens were checked (its policy already saw them) gets them into
        # its corpora, even when a later call's tokens were refused: no call is left half
        # accepted.
        if applied:
            advance_batch([call._corpora for call in applied], moved)  # type: ignore[misc]
        for call, toks in zip(applied, moved):
            if call._index_output:
                call._count(len(toks))
    # Propose: read every match in one call, plan each draft, copy the continuations in one
    # more (per call with a non-native engine).
    for call in calls:
        if not call._begun or call._ended:
            raise call._not_live("step_batch()")
        call._draft = []
        call._decision = None
        call.last_source, call.last_match_length = None, 0
    sets = [call._corpora for call in calls]
    lengths = match_lengths_batch(sets)  # type: ignore[arg-type]
    plans = [
        call._plan(ls, k) if k > 0 else (-1, 0, 0) for call, ls, k in zip(calls, lengths, caps)
    ]
    drafts: list[list[int]] = [[] for _ in range(n)]
    wanted = [i for i, plan in enumerate(plans) if plan[1] > 0]
    if not wanted:
        return drafts
    occurrences = calls[wanted[0]]._max_occurrences
    if all(sets[i].is_native and calls[i]._max_occurrences == occurrences for i in wanted):  # type: ignore[union-attr]
        conts = continuation_batch(
            [sets[i] for i in wanted],  # type: ignore[misc]
            [plans[i][0] for i in wanted],
            [plans[i][1] for i in wanted],
            max_occurrences=occurrences,
        )
    else:
        conts = [
            sets[i].continuation(  # type: ignore[union-attr]
                plans[i][0], plans[i][1], max_occurrences=calls[i]._max_occurrences
            )
            for i in wanted
        ]
    for i, draft in zip(wanted, conts):
        slot, want, m = plans[i]
        drafts[i] = calls[i]._take(draft, slot, want, m)
    return drafts
