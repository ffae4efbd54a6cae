"""The native token index: documents of int32 token ids, and incremental match cursors.

A thin Python layer over the C++ core (`cpp/index/token_index.h`): it checks arguments and
holds the native objects as handles.

Example:
    >>> idx = TokenIndex()
    >>> idx.extend(0, [1, 2, 3, 4, 1, 2, 3, 5])
    >>> cur = idx.match([9, 1, 2, 3])
    >>> cur.match_length                      # "1 2 3" occurs, followed by 4 and by 5
    3
    >>> cur.occurrences()                     # (doc_id, offset of the match's last token)
    [(0, 6), (0, 2)]
    >>> cur.continuation(2, rule="first")     # copy after the earliest occurrence
    [4, 1]
    >>> cur.continuation(2)                   # two groups of one: the most recent wins
    [5]
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Literal, get_args

import numpy as np

from agspec import _native

IndexFormatError = _native.IndexFormatError
IndexStateError = _native.IndexStateError

ContinuationRule = Literal[
    "frequent",
    "first",
    "recent",
    "vote",
    "recent2",
    "recent3",
    "recent4",
    "recent5",
    "recent6",
    "recent7",
    "recent8",
]
# The native rule enum by name (the binding's `ContinuationRule`; docs/index.md).
_RULES: dict[str, _native.ContinuationRule] = {
    name: getattr(_native.ContinuationRule, name) for name in get_args(ContinuationRule)
}
INT32_MAX = 2**31 - 1


_SHORT_LIST = 64  # lists up to this long are checked in Python (cheaper than numpy's reductions)


def is_token_list(tokens: list[object]) -> bool:
    """Whether every element is an int token id in [0, 2^31) (no bools, no floats): a
    list that can go to the native side as it is.

    >>> is_token_list([0, 5]), is_token_list([True]), is_token_list([2**31])
    (True, False, False)
    """
    for t in tokens:
        if type(t) is not int or t < 0 or t > INT32_MAX:
            return False
    return True


def as_tokens(
    tokens: Iterable[int] | np.ndarray, *, what: str = "tokens", narrow: bool = False
) -> np.ndarray:
    """Checks and converts token ids to a 1-D contiguous int32 array: the one validator of
    token ids at the package's boundaries.

    Lists and tuples of Python ints are converted. Ids must be in [0, 2^31). numpy arrays
    must already be int32 (no silent narrowing), unless `narrow`: then any integer array
    is taken, its range checked first (the baselines' boundary).

    >>> as_tokens([5, 6, 7]).tolist()
    [5, 6, 7]
    >>> as_tokens(np.array([1, 2]), narrow=True).dtype
    dtype('int32')
    """
    if type(tokens) is list and len(tokens) <= _SHORT_LIST and is_token_list(tokens):
        # A step's commit: checked in Python (the replay lab hands a list per step).
        return np.array(tokens, dtype=np.int32)
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1:
            raise ValueError(f"{what} must be flat (1-D), got an array of shape {tokens.shape}")
        if tokens.dtype != np.int32:
            if not narrow:
                raise TypeError(
                    f"{what} must be an int32 array, got dtype {tokens.dtype}; "
                    "convert with .astype(np.int32) after checking the range"
                )
            if tokens.dtype == np.bool_ or not np.issubdtype(tokens.dtype, np.integer):
                raise TypeError(f"{what} must hold int token ids, got dtype {tokens.dtype}")
            _check_range(tokens, what)
            return np.ascontiguousarray(tokens, dtype=np.int32)
        arr = np.ascontiguousarray(tokens)
    else:
        if isinstance(tokens, (str, bytes)):
            raise TypeError(
                f"{what} must be a sequence of int token ids, got {type(tokens).__name__}"
            )
        try:
            items = tokens if isinstance(tokens, (list, tuple)) else list(tokens)
        except TypeError:
            raise TypeError(
                f"{what} must be a sequence of int token ids, got {type(tokens).__name__}"
            ) from None
        try:
            raw = np.asarray(items)
        except (ValueError, TypeError, OverflowError) as exc:
            raise TypeError(f"{what} must be a flat sequence of int token ids ({exc})") from None
        if raw.size == 0:
            return np.zeros(0, dtype=np.int32)
        if raw.ndim != 1:
            raise ValueError(
                f"{what} must be flat (1-D), got nested sequences of shape {raw.shape}"
            )
        if raw.dtype.kind not in "iu":
            bad = next(
                (i for i, t in enumerate(items) if isinstance(t, bool) or not isinstance(t, int)), 0
            )
            raise TypeError(
                f"{what}[{bad}] must be an int token id, got {type(items[bad]).__name__}"
            )
        _check_range(raw, what)
        arr = raw.astype(np.int32, copy=False)
    if arr.size and int(arr.min()) < 0:
        raise ValueError(f"token ids must be >= 0, got {int(arr.min())} in {what}")
    return arr


def _check_range(raw: np.ndarray, what: str) -> None:
    """ValueError naming the first id outside [0, 2^31) (the array is integer and flat)."""
    if raw.size == 0:
        return
    lo, hi = int(raw.min()), int(raw.max())
    if lo < 0 or hi > INT32_MAX:
        i = int(np.argmin(raw)) if lo < 0 else int(np.argmax(raw))
        raise ValueError(f"{what}[{i}] = {int(raw[i])} is outside [0, 2^31) (token ids)")


def check_count(name: str, value: object, *, lo: int = 0, hi: int = INT32_MAX) -> int:
    """A count argument: an int (not a bool, not a float) in [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not lo <= value <= hi:
        upper = "2^31)" if hi == INT32_MAX else f"{hi}]"
        raise ValueError(f"{name} must be in [{lo}, {upper}, got {value}")
    return int(value)


def check_doc_id(doc_id: int) -> int:
    """A document id: an int in [0, 2^63) (shared by every index engine)."""
    if isinstance(doc_id, bool) or not isinstance(doc_id, (int, np.integer)):
        raise TypeError(f"doc_id must be an int, got {type(doc_id).__name__}")
    if doc_id < 0 or doc_id >= 2**63:
        raise ValueError(f"doc_id must be in [0, 2^63), got {doc_id}")
    return int(doc_id)


class TokenIndex:
    """Many append-only documents of token ids, searchable by `MatchCursor`s.

    Safe to share between threads: queries, `save`, `document` and the counters run
    concurrently with each other, `extend` and `remove` alone. A call that meets one of
    the other kind in another thread waits at most 10 ms for it, then raises
    `IndexStateError` and changes nothing (retry it); after `close` every call, and every
    cursor's, raises `IndexStateError`. A `MatchCursor` belongs to one thread at a time.
    """

    def __init__(self, _handle: _native.TokenIndex | None = None) -> None:
        self._native = _handle if _handle is not None else _native.TokenIndex()

    # -- building ------------------------------------------------------------------
    def extend(self, doc_id: int, tokens: Iterable[int] | np.ndarray) -> None:
        """Appends tokens to document `doc_id`, creating it on first use."""
        self._native.extend(check_doc_id(doc_id), as_tokens(tokens))

    def extend_list(self, doc_id: int, tokens: list[int]) -> None:
        """Fast path for a short list of already-checked ids (no numpy round trip)."""
        self._native.extend_list(doc_id, tokens)

    def remove(self, doc_id: int) -> None:
        """Drops a document (rebuilds the index: O(total tokens))."""
        self._native.remove(check_doc_id(doc_id))

    # -- matching ------------------------------------------------------------------
    def match(
        self, tokens: Iterable[int] | np.ndarray = (), *, max_match_tokens: int = 64
    ) -> MatchCursor:
        """A cursor fed with `tokens`; feed it more with `MatchCursor.extend`."""
        if not 1 <= max_match_tokens <= 1 << 20:
            raise ValueError(f"max_match_tokens must be in [1, 2^20], got {max_match_tokens}")
        cur = MatchCursor(self._native.cursor(max_match_tokens))
        cur.extend(tokens)
        return cur

    # -- files ---------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the frozen form (versioned header, checksum); atomic via rename."""
        self._native.save(os.fspath(path))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TokenIndex:
        """Loads a saved index, read-only. Raises IndexFormatError for a bad file.

        Besides the checksum, every structural invariant is verified (`verify`), so a
        file edited on purpose and given a valid checksum is refused too.
        """
        p = os.fspath(path)
        if not os.path.isfile(p):
            raise FileNotFoundError(f"no index file at {p}")
        return cls(_native.TokenIndex.load(p))

    def verify(self) -> None:
        """Checks every structural invariant `load` checks; raises IndexFormatError.

        O(size); what it costs on a 10M-token index is in docs/index.md.
        """
        self._native.verify()

    def close(self) -> None:
        """Frees the index; it and its cursors raise IndexStateError from now on.

        A call running in another thread finishes first; the memory is freed when it does.
        """
        self._native.close()

    # -- inspection ----------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return bool(self._native.closed)

    @property
    def frozen(self) -> bool:
        return bool(self._native.frozen())

    def freeze(self) -> None:
        """Makes the index read-only for good, as a loaded one is (`extend` and `remove`
        then raise ValueError); queries may then keep answers a change would spoil."""
        self._native.freeze()

    @property
    def num_documents(self) -> int:
        return int(self._native.num_documents())

    @property
    def num_tokens(self) -> int:
        return int(self._native.num_tokens())

    @property
    def num_positions(self) -> int:
        """Tokens that have a successor in their document (the matchable positions)."""
        return int(self._native.num_positions())

    def num_bytes(self) -> int:
        """Bytes held by the native index (capacity, not just size)."""
        return int(self._native.num_bytes())

    def document(self, doc_id: int) -> list[int]:
        return list(self._native.document(check_doc_id(doc_id)))

    def document_ids(self) -> list[int]:
        return list(self._native.document_ids())

    def __contains__(self, doc_id: object) -> bool:
        if isinstance(doc_id, bool) or not isinstance(doc_id, (int, np.integer)):
            return False
        # Document ids are in [0, 2^63): anything else is simply not in the index.
        return bool(0 <= doc_id < 2**63) and bool(self._native.contains(int(doc_id)))

    def __len__(self) -> int:
        return self.num_documents

    def __repr__(self) -> str:
        if self.closed:
            return "TokenIndex(closed)"
        try:
            return f"TokenIndex(documents={self.num_documents}, tokens={self.num_tokens})"
        except IndexStateError:
            return "TokenIndex(busy)"


class MatchCursor:
    """The longest suffix of the fed tokens that occurs in the index with a successor.

    Amortized O(1) per fed token; stays exact while the index grows (it re-checks the
    new positions on its next call).
    """

    def __init__(self, native: _native.MatchCursor) -> None:
        self._native = native

    def extend(self, tokens: Iterable[int] | np.ndarray) -> None:
        arr = as_tokens(tokens)
        if arr.size:
            self._native.extend(arr)

    def extend_one(self, token: int) -> None:
        """One token id (an int in [0, 2^31); the native side checks it)."""
        self._native.extend_one(token)

    def extend_list(self, tokens: list[int]) -> None:
        """Fast path for a short list of already-checked ids (raises TypeError otherwise)."""
        self._native.extend_list(tokens)

    @property
    def match_length(self) -> int:
        return int(self._native.match_length())

    @property
    def num_fed(self) -> int:
        return int(self._native.num_fed)

    def occurrences(self, max_count: int = 32) -> list[tuple[int, int]]:
        """`(doc_id, end_offset)` of the current match, most recent first."""
        n = check_count("max_count", max_count)
        return [tuple(o) for o in self._native.occurrences(n)]  # type: ignore[misc]

    def continuation(
        self, max_tokens: int, rule: ContinuationRule = "frequent", *, max_occurrences: int = 32
    ) -> list[int]:
        """Up to `max_tokens` tokens that follow the chosen occurrence of the match.

        rule="frequent": among the `max_occurrences` most recent occurrences, group by
        the next 3 tokens, take the most frequent group (ties: most recent), copy from its
        most recent occurrence. rule="first": copy from the earliest occurrence.
        rule="recent": copy from the most recent occurrence. rule="vote": token by token,
        the most frequent next token among the occurrences that agree with the draft so
        far (ties: most recent), while at least a tenth of the occurrences back it.
        rule="recent2" .. "recent8": copy from the k-th most recent occurrence (nothing
        when the match has fewer than k; `max_occurrences` does not apply).
        """
        # The hot path: plain ints in range go straight through; anything else (or a
        # TypeError from comparing it) takes the checks below, which say what is wrong.
        try:
            if (
                type(max_tokens) is int
                and type(max_occurrences) is int
                and 0 <= max_tokens <= INT32_MAX
                and 1 <= max_occurrences <= 64
            ):
                code = _RULES[rule]
                return list(self._native.continuation(max_tokens, code, max_occurrences))
        except (TypeError, KeyError):
            pass
        n = check_count("max_tokens", max_tokens)
        if not isinstance(rule, str) or rule not in _RULES:
            raise ValueError(f"rule must be one of {sorted(_RULES)}, got {rule!r}")
        k = check_count("max_occurrences", max_occurrences, lo=1, hi=64)
        return list(self._native.continuation(n, _RULES[rule], k))
