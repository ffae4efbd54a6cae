"""All corpora of one request behind one object, matched and extended together.

A request drafts from several corpora (its session, the workspace, the history of
finished calls, the global corpus, or only its own text). Each has a match cursor; every
verification step feeds the committed tokens to all of them and appends them to the
documents the request writes (its session document). `CorpusSet` does that in one
native call per step, and reads every match length in one more; the continuation of
the chosen corpus is a third. With a retrieval engine other than the native index (the
suffix tree of `agspec.index.suffix_tree`) it falls back to one call per cursor, with the
same results.

The source preference is data, not code: an ordered list of `SourceRule(corpus,
margin_tokens)`, most preferred first. A corpus wins when its match is longer than
every match of the corpora after it by more than its margin; the first winner is the
source. The paper's rule (global only when it beats the live matches by more than δ,
then workspace over session) is `[("global", δ), ("workspace", 0), ("session", 0)]`.

>>> from agspec.index.token_index import TokenIndex
>>> session, workspace = TokenIndex(), TokenIndex()
>>> session.extend(0, [5, 6, 7, 8])
>>> workspace.extend(0, [1, 5, 6, 7, 9])
>>> cs = CorpusSet([("session", session, "frequent"), ("workspace", workspace, "first")],
...                [5, 6], order=[SourceRule("workspace"), SourceRule("session")])
>>> cs.match_lengths()
[2, 2]
>>> cs.pick(cs.match_lengths())    # equal matches: workspace does not beat session
0
>>> cs.advance([7]); cs.match_lengths(), cs.continuation(0, 4)
([3, 3], [8])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agspec import _native
from agspec.index.token_index import _RULES as _RULE_CODES
from agspec.index.token_index import ContinuationRule, TokenIndex, as_tokens

__all__ = [
    "CorpusSet",
    "SourceRule",
    "advance_batch",
    "continuation_batch",
    "continuations_batch",
    "continuation_tries",
    "continuation_tries_flat",
    "match_lengths_batch",
    "match_lengths_flat",
    "prepare_batch",
]


@dataclass(frozen=True)
class SourceRule:
    """A corpus in the source preference, and by how much it must beat the ones after it."""

    corpus: str
    margin_tokens: int = 0


class CorpusSet:
    """The cursors of one request over its corpora (see the module docstring).

    `entries` are (name, index, continuation rule); `tail` is the request's last tokens
    (at most `max_match_tokens` matter); `appends` are (index, doc_id) documents that
    every `advance` extends after the cursors have moved. Belongs to one thread at a time.

    With the native index a step never fails because another thread holds an index for
    writing past the 10 ms patience (a long prompt entering the session): that corpus
    matches nothing and copies nothing until it is free, its cursor catching up then,
    and a busy document takes the step's tokens at the next `advance` (or `close`), in
    order. Only a closed index raises (`IndexStateError`).
    """

    __slots__ = ("names", "_native", "_cursors", "_appends", "_rules", "_codes", "_order")

    def __init__(
        self,
        entries: Sequence[tuple[str, Any, ContinuationRule]],
        tail: Sequence[int],
        *,
        max_match_tokens: int = 64,
        appends: Sequence[tuple[Any, int]] = (),
        order: Sequence[SourceRule] = (),
    ) -> None:
        self.names = [name for name, _, _ in entries]
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"corpus names must be unique, got {self.names}")
        for _, _, rule in entries:
            if rule not in _RULE_CODES:
                raise ValueError(f"unknown continuation rule {rule!r}; one of {list(_RULE_CODES)}")
        slot = {name: i for i, name in enumerate(self.names)}
        # Preference over the corpora present, least preferred first (the order `pick`
        # scans in); the others match nothing.
        self._order = [
            (slot[r.corpus], int(r.margin_tokens)) for r in reversed(order) if r.corpus in slot
        ]
        self._rules: list[ContinuationRule] = [rule for _, _, rule in entries]
        self._codes = [_RULE_CODES[r] for r in self._rules]
        tail_list = (
            list(tail[-max_match_tokens:])
            if isinstance(tail, (list, tuple))
            else as_tokens(tail, what="tail")[-max_match_tokens:].tolist()
        )
        native = all(isinstance(ix, TokenIndex) for _, ix, _ in entries) and all(
            isinstance(ix, TokenIndex) for ix, _ in appends
        )
        self._native: Any = None
        self._cursors: list[Any] = []
        self._appends: list[tuple[Any, int]] = []
        if native:
            cursors = _native.CursorSet()
            try:
                # The binding converts and checks the ids (a list of ints: no numpy trip).
                for _, ix, _ in entries:
                    cursors.add_cursor(ix._native, max_match_tokens, tail_list)
            except (TypeError, ValueError, OverflowError):
                as_tokens(tail_list, what="tail")  # raises, saying which id is bad
                raise
            for ix, doc_id in appends:
                cursors.add_append(ix._native, doc_id)
            # The preference, for the batched pick (`match_picks_flat`; `pick_at` here is
            # its reference and the path of other engines).
            cursors.set_order(self._order)
            self._native = cursors
        else:
            arr = as_tokens(tail_list, what="tail")
            self._cursors = [
                ix.match(arr, max_match_tokens=max_match_tokens) for _, ix, _ in entries
            ]
            self._appends = list(appends)

    @property
    def is_native(self) -> bool:
        return self._native is not None

    def __len__(self) -> int:
        return len(self.names)

    def rule(self, slot: int) -> ContinuationRule:
        """The continuation rule corpus `slot` copies by (its entry's)."""
        return self._rules[slot]

    def rule_code(self, slot: int) -> _native.ContinuationRule:
        """The native code of that rule (`rule_codes`)."""
        return self._codes[slot]

    def match_lengths(self) -> list[int]:
        """Every corpus's current match length, in entry order."""
        if self._native is not None:
            return self._native.match_lengths()  # type: ignore[no-any-return]
        return [c.match_length for c in self._cursors]

    def match_pick(self, min_match: int) -> tuple[int, int]:
        """(`pick` of the current match lengths, that match's length), or (-1, 0) when none
        is picked or that match is shorter than `min_match`: one native call (the
        preference applied in C++, as in `match_picks_flat`)."""
        if self._native is not None:
            return self._native.match_pick(min_match)  # type: ignore[no-any-return]
        return self.pick_at_least(self.match_lengths(), min_match)

    def pick_at_least(self, lengths: Sequence[int], min_match: int) -> tuple[int, int]:
        """(`pick` of these lengths, that length), or (-1, 0) when none is picked or that
        match is shorter than `min_match` (the native `CursorSet::pick_at_least`'s
        reference)."""
        slot = self.pick_at(lengths, 0)
        if slot < 0 or lengths[slot] < min_match:
            return -1, 0
        return slot, lengths[slot]

    def advance(self, committed: list[int]) -> None:
        """Feeds one step's committed tokens (checked ids) to every cursor, then appends
        them to every append document."""
        if self._native is not None:
            self._native.advance(committed)
            return
        for c in self._cursors:
            c.extend_list(committed)
        for ix, doc_id in self._appends:
            ix.extend_list(doc_id, committed)

    def pick(self, lengths: Sequence[int]) -> int:
        """The slot the source preference picks for these match lengths, or -1.

        >>> cs = CorpusSet([("a", TokenIndex(), "first"), ("b", TokenIndex(), "first")], [],
        ...                order=[SourceRule("a", 2), SourceRule("b")])
        >>> cs.pick([5, 3]), cs.pick([6, 3]), cs.pick([0, 0])
        (1, 0, -1)
        """
        return self.pick_at(lengths, 0)

    def pick_at(self, lengths: Sequence[int], at: int) -> int:
        """`pick` of this set's match lengths at lengths[at:], without the slice (a batch's
        flat list of every set's lengths, `match_lengths_flat`)."""
        best_after = 0
        winner = -1
        # From the least preferred up: a corpus wins over everything after it.
        for slot, margin in self._order:
            m = lengths[at + slot]
            if m > best_after + margin:
                winner = slot
            if m > best_after:
                best_after = m
        # Scanning upward, the last corpus to win is the most preferred winner.
        return winner

    def continuation(self, slot: int, max_tokens: int, *, max_occurrences: int = 32) -> list[int]:
        """Up to `max_tokens` tokens after the chosen occurrence of slot's match."""
        if not 0 <= slot < len(self._codes):
            raise ValueError(f"slot {slot} out of range ({len(self._codes)} corpora)")
        if self._native is not None:
            return self._native.continuation(  # type: ignore[no-any-return]
                slot, max_tokens, self._codes[slot], max_occurrences
            )
        return list(
            self._cursors[slot].continuation(
                max_tokens, self._rules[slot], max_occurrences=max_occurrences
            )
        )

    def continuations(
        self,
        slots: Sequence[int],
        max_tokens: Sequence[int],
        rules: Sequence[ContinuationRule],
        *,
        max_occurrences: int = 32,
    ) -> list[list[int]]:
        """`continuation` of several (slot, length, rule) at once, each rule its own (the
        candidate branches of a token tree: other occurrences, other corpora), in one
        native call. A slot < 0 or a length of 0 copies nothing.

        >>> ix = TokenIndex(); ix.extend(0, [1, 2, 3, 1, 2, 4])
        >>> cs = CorpusSet([("s", ix, "recent")], [1, 2])
        >>> cs.continuations([0, 0], [2, 2], ["recent", "first"])
        [[4], [3, 1]]
        """
        codes = [_RULE_CODES[r] for r in rules]
        if self._native is not None:
            n = len(slots)
            return _native.continuation_batch(  # type: ignore[no-any-return]
                [self._native] * n, list(slots), list(max_tokens), codes, max_occurrences
            )
        return [
            list(self._cursors[s].continuation(k, r, max_occurrences=max_occurrences))
            if s >= 0 and k > 0
            else []
            for s, k, r in zip(slots, max_tokens, rules)
        ]

    def engine_max_tokens(self, slot: int) -> int | None:
        """The engine's own bound on the draft for slot's match (SuffixDecoding's), if any."""
        if self._native is not None:
            return None
        return getattr(self._cursors[slot], "engine_max_tokens", None)

    def stop_appending(self, index: Any) -> None:
        """Stops extending `index`'s document (a session that stopped indexing)."""
        if self._native is not None:
            self._native.remove_append(index._native)
        else:
            self._appends = [(ix, d) for ix, d in self._appends if ix is not index]

    def close(self) -> None:
        """Drops every cursor and append target (the request's corpora can then go), after
        one more try at the tokens a busy document still waits for."""
        if self._native is not None:
            self._native.flush()
        self._native = None
        self._cursors = []
        self._appends = []


def prepare_batch(num_sets: int) -> None:
    """Says that `num_sets` requests are about to step in batches (first thing in a step,
    before the work on their committed tokens): a batch large enough for the native
    helper threads gets them up, so that the step's first call need not wait for them."""
    _native.prepare_batch(num_sets)


def advance_batch(sets: Sequence[CorpusSet], committed: Sequence[list[int]]) -> None:
    """`advance` for many requests: one native call when every set is native."""
    advance_batch_begin(sets, committed)()


def advance_batch_begin(
    sets: Sequence[CorpusSet], committed: Sequence[list[int]]
) -> Callable[[], None]:
    """`advance_batch` begun: with native sets, the helper threads start moving the
    cursors while the caller does other work, and the returned function finishes it (the
    rest of the cursors, then the appends) and raises what `advance_batch` raises. Until
    then nothing may touch these sets (an engine step updates its length policy
    meanwhile) and their indexes are held for reading. Call the function once, in a
    `finally`; a job dropped unfinished finishes when it is freed (dropping its error).

    >>> cs = CorpusSet([("a", TokenIndex(), "first")], [1, 2])
    >>> finish = advance_batch_begin([cs], [[3]])
    >>> finish()
    >>> cs.match_lengths()
    [0]
    """
    handles = [s._native for s in sets]
    if None not in handles:
        job = _native.advance_batch_begin(
            handles, committed if type(committed) is list else list(committed)
        )
        return job.finish  # type: ignore[no-any-return]
    pairs = list(zip(sets, committed))

    def finish() -> None:
        for s, c in pairs:
            s.advance(c)

    return finish


def match_lengths_batch(sets: Sequence[CorpusSet]) -> list[list[int]]:
    """`match_lengths` for many requests: one native call when every set is native."""
    flat = match_lengths_flat(sets)
    out, at = [], 0
    for s in sets:
        n = len(s.names)
        out.append(flat[at : at + n])
        at += n
    return out


def native_handles(sets: Sequence[CorpusSet]) -> list[_native.CursorSet] | None:
    """The native cursor sets behind `sets`, for a native call that reads them whole
    (`agspec.policy.tree_size.begin_tree_candidates`); None when one set is not native."""
    handles = [s._native for s in sets]
    return None if None in handles else handles  # type: ignore[return-value]


def rule_codes(rules: Sequence[ContinuationRule]) -> list[_native.ContinuationRule]:
    """The native codes of continuation rules ("recent", "frequent", "first", "vote")."""
    return [_RULE_CODES[r] for r in rules]


def match_lengths_flat(sets: Sequence[CorpusSet]) -> list[int]:
    """Every set's match lengths in one list, set after set (`match_lengths_batch`
    without splitting it; set i's start at the sum of the earlier sets' sizes)."""
    handles = [s._native for s in sets]
    if handles and None not in handles:
        return _native.match_lengths_batch(handles)  # type: ignore[no-any-return]
    return [m for s in sets for m in s.match_lengths()]


def match_picks_flat(sets: Sequence[CorpusSet], min_match: int) -> list[int]:
    """Each set's source pick of its current matches, two entries per set: the slot
    (`pick`; -1 when none, or when that match is shorter than `min_match`) and that match's
    length (0 with -1). One native call when every set is native (the matches read as in
    `match_lengths_flat`, the preference applied in C++: docs/index.md).

    >>> a, b = TokenIndex(), TokenIndex()
    >>> a.extend(0, [1, 2, 3]); b.extend(0, [7, 1, 2, 3])
    >>> cs = CorpusSet([("a", a, "first"), ("b", b, "first")], [9, 1, 2],
    ...                order=[SourceRule("a", 2), SourceRule("b")])
    >>> match_picks_flat([cs], 1), match_picks_flat([cs], 3)   # a needs more than b + 2
    ([1, 2], [-1, 0])
    """
    handles = [s._native for s in sets]
    if handles and None not in handles:
        return _native.match_picks_batch(handles, min_match)  # type: ignore[no-any-return]
    out: list[int] = []
    for s in sets:
        out += s.match_pick(min_match)
    return out


def continuation_batch(
    sets: Sequence[CorpusSet],
    slots: Sequence[int],
    max_tokens: Sequence[int],
    *,
    max_occurrences: int = 32,
) -> list[list[int]]:
    """`continuation` for many requests (set i copies from slots[i], at most max_tokens[i]
    tokens; a slot < 0 or a length of 0 copies nothing): one native call when every set
    is native."""
    handles = [s._native for s in sets]
    if handles and None not in handles:
        return _native.continuation_batch(  # type: ignore[no-any-return]
            handles,
            slots if type(slots) is list else list(slots),
            max_tokens if type(max_tokens) is list else list(max_tokens),
            [s._codes[slot] for s, slot in zip(sets, slots)],
            max_occurrences,
        )
    return [
        s.continuation(slot, k, max_occurrences=max_occurrences) if slot >= 0 and k > 0 else []
        for s, slot, k in zip(sets, slots, max_tokens)
    ]


def continuations_batch(
    sets: Sequence[CorpusSet],
    slots: Sequence[int],
    max_tokens: Sequence[int],
    rules: Sequence[ContinuationRule],
    *,
    max_occurrences: int = 32,
) -> list[list[int]]:
    """`CorpusSet.continuations` of many requests at once: entry k copies from set
    sets[k] (a set may come several times: a token tree's candidate branches), slot
    slots[k], at most max_tokens[k] tokens, by its own rules[k]. One native call when
    every set is native.

    >>> ix = TokenIndex(); ix.extend(0, [1, 2, 3, 1, 2, 4])
    >>> a, b = CorpusSet([("s", ix, "recent")], [1, 2]), CorpusSet([("s", ix, "first")], [3])
    >>> continuations_batch([a, a, b], [0, 0, 0], [2, 2, 2], ["recent", "first", "first"])
    [[4], [3, 1], [1, 2]]
    """
    handles = [s._native for s in sets]
    codes = [_RULE_CODES[r] for r in rules]
    if handles and None not in handles:
        return _native.continuation_batch(  # type: ignore[no-any-return]
            handles,
            slots if type(slots) is list else list(slots),
            max_tokens if type(max_tokens) is list else list(max_tokens),
            codes,
            max_occurrences,
        )
    return [
        s.continuations([slot], [k], [r], max_occurrences=max_occurrences)[0]
        for s, slot, k, r in zip(sets, slots, max_tokens, rules)
    ]


def continuation_tries(
    sets: Sequence[CorpusSet],
    slots: Sequence[int],
    max_tokens: Sequence[int],
    rules: Sequence[ContinuationRule],
    ranks: Sequence[int],
    counts: Sequence[int],
    firsts: Sequence[list[int]],
    *,
    max_occurrences: int = 32,
) -> list[tuple[list[int], list[int], list[int], list[int], list[int]]]:
    """`continuations_batch` of a batch step's token-tree candidates, merged natively
    into one trie per tree: tree t's candidates are the next counts[t] (slot, length,
    rule) entries, all of sets[t] (one set per tree: its request's), merged after its
    first branch firsts[t] in the order of their ranks (smallest first; the reference is
    `agspec.policy.tree_size.merge_candidates`). Every set must be native (`is_native`);
    each trie is (tokens, parents, support, branch_of, origin). Distinct sets copy and
    merge their trees on the native helper threads. `continuation_tries_flat` is the
    same tries in seven lists for the whole batch.

    >>> ix = TokenIndex(); ix.extend(0, [1, 2, 3, 1, 2, 4])
    >>> cs = CorpusSet([("s", ix, "recent")], [1, 2])
    >>> continuation_tries([cs], [0, 0], [2, 2], ["recent", "first"], [0, 0], [2], [[4]])
    [([4, 3, 1], [-1, -1, 1], [1, 1, 1], [0, 1, 1], [-1, 1])]
    """
    tokens, parents, support, branch_of, origin, node_at, origin_at = continuation_tries_flat(
        sets, slots, max_tokens, rules, ranks, counts, firsts, max_occurrences=max_occurrences
    )
    out = []
    for t in range(len(node_at) - 1):
        a, b = node_at[t], node_at[t + 1]
        out.append(
            (
                tokens[a:b],
                parents[a:b],
                support[a:b],
                branch_of[a:b],
                origin[origin_at[t] : origin_at[t + 1]],
            )
        )
    return out


def continuation_tries_flat(
    sets: Sequence[CorpusSet],
    slots: Sequence[int],
    max_tokens: Sequence[int],
    rules: Sequence[ContinuationRule],
    ranks: Sequence[int],
    counts: Sequence[int],
    firsts: Sequence[list[int]],
    *,
    max_occurrences: int = 32,
) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int], list[int]]:
    """`continuation_tries` in seven lists for the whole batch, tree after tree: (tokens,
    parents, support, branch_of, origin, node_starts, origin_starts). Tree t's nodes are
    node_starts[t] .. node_starts[t + 1] - 1 of the first four lists (its parents and
    branch_of count within the tree, as in its own trie), its origin origin_starts[t] ..
    origin_starts[t + 1] - 1 of the fifth. A batch step reads its tries this way: seven
    lists, not five per tree (fewer objects to make, and for the garbage collector to
    track).

    >>> ix = TokenIndex(); ix.extend(0, [1, 2, 3, 1, 2, 4])
    >>> cs = CorpusSet([("s", ix, "recent")], [1, 2])
    >>> continuation_tries_flat([cs, cs], [0, 0, 0], [2, 2, 2], ["recent", "first", "first"],
    ...                         [0, 0, 0], [2, 1], [[4], [3]])   # doctest: +NORMALIZE_WHITESPACE
    ([4, 3, 1, 3, 1], [-1, -1, 1, -1, 0], [1, 1, 1, 2, 1], [0, 1, 1, 0, 1], [-1, 1, -1, 0],
     [0, 3, 5], [0, 2, 4])
    """
    handles = [s._native for s in sets]
    if None in handles:
        raise ValueError("continuation_tries needs native corpora (every set is_native)")
    return _native.continuation_tries(
        handles,
        slots if type(slots) is list else list(slots),
        max_tokens if type(max_tokens) is list else list(max_tokens),
        [_RULE_CODES[r] for r in rules],
        max_occurrences,
        ranks if type(ranks) is list else list(ranks),
        counts if type(counts) is list else list(counts),
        firsts if type(firsts) is list else list(firsts),
    )
