"""One verification step for many requests at once (`step_batch`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agspec.corpora.corpus_set import advance_batch, match_lengths_batch
from agspec.drafter.call import AgSpecCall


def step_batch(
    calls: Sequence[AgSpecCall],
    committed: Sequence[Sequence[int] | np.ndarray | None],
    max_tokens: Sequence[int] | int,
) -> list[list[int]]:
    """One verification step for many requests at once: accept, then propose.

    `committed[i]` is what the engine committed for `calls[i]` since its last step (its
    accepted draft prefix plus one token; None or empty right after `begin`), and
    `max_tokens[i]` bounds its next draft. Returns the drafts, in order. Equivalent to
    `accept` on every call, then `propose` on every call (so requests of one session see
    each other's tokens of this step), with every corpus of every request moved in one
    native call and every match read in another (one per call with a non-native engine).
    The calls may belong to different sessions of one server, or of several.

    >>> # drafts = step_batch([c1, c2], [[5], [7, 8]], 16)
    """
    n = len(calls)
    if len(committed) != n:
        raise ValueError(f"committed has {len(committed)} entries for {n} calls")
    raw = [max_tokens] * n if isinstance(max_tokens, (int, np.integer)) else list(max_tokens)
    if len(raw) != n:
        raise ValueError(f"max_tokens has {len(raw)} entries for {n} calls")
    for k in raw:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= 1 << 16:
            raise ValueError(f"max_tokens must be ints in [0, 65536], got {k!r}")
    caps = [int(k) for k in raw]
    applied: list[AgSpecCall] = []
    moved: list[list[int]] = []
    try:
        for call, c in zip(calls, committed):
            if c is not None and len(c):
                toks = call._check_committed(c)
                applied.append(call)
                moved.append(toks)
            elif not call._begun or call._ended:
                raise call._not_live("step_batch()")
    finally:
        # Every call whose tokens were checked (its policy already saw them) gets them into
        # its corpora, even when a later call's tokens were refused: no call is left half
        # accepted.
        if applied:
            advance_batch([call._corpora for call in applied], moved)  # type: ignore[misc]
        for call, toks in zip(applied, moved):
            call._count(len(toks))
    # Propose: read every match in one call, plan each draft, copy the continuations.
    live: list[AgSpecCall] = []
    for call in calls:
        if not call._begun or call._ended:
            raise call._not_live("step_batch()")
        call._draft = []
        call.last_source, call.last_match_length = None, 0
        live.append(call)
    all_sets = [call._corpora for call in live]
    lengths = match_lengths_batch(all_sets)  # type: ignore[arg-type]
    plans = [call._plan(ls, k) if k > 0 else (-1, 0, 0) for call, ls, k in zip(live, lengths, caps)]
    drafts: list[list[int]] = []
    for call, (slot, want, m) in zip(live, plans):
        if want == 0:
            drafts.append([])
            continue
        corpora = call._corpora
        assert corpora is not None
        draft = corpora.continuation(
            slot, want, max_occurrences=call.session.server.config.max_occurrences
        )
        drafts.append(call._take(draft, slot, want, m))
    return drafts
