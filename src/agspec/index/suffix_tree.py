"""SuffixDecoding's suffix tree (arctic-inference 0.3.0) as an AgSpec retrieval engine.

`SuffixTreeIndex` wraps `arctic_inference.suffix_decoding._C.SuffixTree(max_depth)` behind
the `TokenIndex` interface of docs/design.md ("Retrieval engines"), so the corpora, the
source preference and the length policy of AgSpec run unchanged on an engine they did not
come from (`AgSpecConfig(engine="suffix-tree")`, variant "agspec-paper-on-suffix-tree").

What the tree answers, and how its answers map onto the interface:

- `match_length`: the longest suffix of the fed tokens that occurs in the tree **with a
  continuation** (a next token), as the native index defines it. The tree's own
  `speculate(...).match_len` is something else: the match length of its best-scoring draft,
  and it also counts occurrences with no next token (the end of a document, e.g. the
  request's own text in the session corpus, whose last token has no continuation yet).
  So the cursor probes the tree: `speculate` with a context of `L + 1` tokens (a sentinel
  -1 in front when fewer were fed; the engine only tries match lengths below
  `len(context)`) and a length rule that allows a draft at match length `L` only; the draft
  is non-empty exactly when the `L`-suffix has a continuation. "Has a continuation" shrinks
  with `L`, so a probe at the previous match plus the tokens fed since (and one more),
  then a binary search, finds the longest.
  Remaining difference: the tree keeps suffixes only `max_depth` deep, so a match is at most
  `max_depth - 1` tokens (one more is needed for a continuation) and the draft after a
  match of `m` tokens at most `max_depth - m` tokens. AgSpec drafts after the *longest*
  match (up to `max_match_tokens`, 64), so at the engine's default depth of 64 its drafts
  shrink as a copy runs on; a depth of `max_match_tokens` + the longest draft (96) removes
  that cut (figures in docs/baselines-suffix.md, "AgSpec on the SuffixDecoding engine").
- `continuation(max_tokens, rule)`: the tree's own best path draft at that match length:
  from the matched node it follows the most frequent child while the path's estimated
  probability (product of child count / parent count) stays >= `min_token_prob` (0.1, as in
  SuffixDecoding). This is the analogue of the "frequent" rule, over *all* occurrences
  (`max_occurrences` is ignored) and one token at a time rather than by the next three.
  The tree keeps counts, not positions, so it cannot tell occurrences apart: rules "first"
  and "recent" get the same frequency path. An occurrence with no continuation (the end of
  a document) still counts in the denominators, so probabilities are lower than the native
  index's shares when the request's own text is in the tree; ties between equally frequent
  children go to whichever the tree's hash map yields first.
- `engine_max_tokens`: SuffixDecoding's length rule for the current match,
  `min(max_spec_tokens, floor(match_length * max_spec_factor))` (32 and 1.0 by default);
  AgSpec drafts no more than that.

One probe result per (tokens fed, index version) is cached, so a step's `match_length`,
`engine_max_tokens` and `continuation` cost the engine one search, not three.

Example (depth 8):

    >>> idx = SuffixTreeIndex(8)
    >>> idx.extend(0, [1, 2, 3, 4, 1, 2, 3, 5])
    >>> cur = idx.match([9, 1, 2, 3])
    >>> cur.match_length                  # "1 2 3" occurs, followed by 4 and by 5
    3
    >>> cur.continuation(8)               # the tree's path: 4 1 2 3 5 (depth 8 = 3 + 5)
    [4, 1, 2, 3, 5]
    >>> cur.engine_max_tokens             # min(32, floor(3 * 1.0))
    3
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from agspec.index.token_index import INT32_MAX, ContinuationRule, as_tokens, check_doc_id

_SENTINEL = -1  # never a token id: pads a probe context shorter than L + 1 tokens
_RULES = ("frequent", "first", "recent")
_MAX_DEPTH_LIMIT = 4096  # keeps the probe's length-rule arithmetic exact in float32


def _suffix_tree_class() -> Any:
    try:
        from arctic_inference.suffix_decoding._C import SuffixTree
    except ImportError as exc:
        raise ImportError(
            "the suffix-tree engine runs on arctic-inference 0.3.0, which is not installed: "
            "pip install 'agspec[suffix]' (on a CPU-only machine see docs/baselines-suffix.md, "
            "'Install without a GPU', for the build steps)"
        ) from exc
    return SuffixTree


def _check_list(tokens: list[int], what: str) -> list[int]:
    """The fast path's check: a list of Python ints in [0, 2^31)."""
    if not isinstance(tokens, list):
        raise TypeError(f"{what} must be a list of int token ids, got {type(tokens).__name__}")
    for i, t in enumerate(tokens):
        if type(t) is not int:
            raise TypeError(f"{what}[{i}] must be an int token id, got {type(t).__name__}")
        if not 0 <= t <= INT32_MAX:
            raise ValueError(f"{what}[{i}] = {t} is outside [0, 2^31)")
    return tokens


class SuffixTreeIndex:
    """Append-only documents in one SuffixDecoding suffix tree; see the module docstring.

    Documents map to the tree's sequence ids (0, 1, ... in order of first use). Not
    thread-safe. Keyword knobs: `max_spec_tokens` and `max_spec_factor` are SuffixDecoding's
    length rule (`engine_max_tokens`), `min_token_prob` its path cut-off.
    """

    def __init__(
        self,
        max_depth: int = 64,
        *,
        max_spec_tokens: int = 32,
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
    ) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int):
            raise TypeError(f"max_depth must be an int, got {type(max_depth).__name__}")
        if not 2 <= max_depth <= _MAX_DEPTH_LIMIT:
            raise ValueError(f"max_depth must be in [2, {_MAX_DEPTH_LIMIT}], got {max_depth}")
        if max_spec_tokens < 0:
            raise ValueError(f"max_spec_tokens must be >= 0, got {max_spec_tokens}")
        if not (math.isfinite(max_spec_factor) and max_spec_factor >= 0):
            raise ValueError(f"max_spec_factor must be finite and >= 0, got {max_spec_factor}")
        if not 0.0 <= min_token_prob <= 1.0:
            raise ValueError(f"min_token_prob must be in [0, 1], got {min_token_prob}")
        self._tree = _suffix_tree_class()(max_depth)
        self.max_depth = max_depth
        self.max_spec_tokens = int(max_spec_tokens)
        self.max_spec_factor = float(max_spec_factor)
        self.min_token_prob = float(min_token_prob)
        self._seq_ids: dict[int, int] = {}  # doc_id -> the tree's seq id (dense, from 0)
        self._num_tokens = 0
        # Bumped on every non-empty extend: a cursor's cached probe is valid for one version.
        self.version = 0

    # -- building ------------------------------------------------------------------
    def _seq(self, doc_id: int) -> int:
        seq = self._seq_ids.get(doc_id)
        if seq is None:
            if len(self._seq_ids) > INT32_MAX:
                raise ValueError("the suffix tree holds at most 2^31 documents")
            seq = self._seq_ids[doc_id] = len(self._seq_ids)
        return seq

    def extend(self, doc_id: int, tokens: Iterable[int] | np.ndarray) -> None:
        """Appends tokens to document `doc_id`, creating it on first use."""
        doc = check_doc_id(doc_id)
        arr = as_tokens(tokens)
        seq = self._seq(doc)
        if arr.size:
            self._tree.extend_ndarray(seq, arr)
            self._num_tokens += int(arr.size)
            self.version += 1

    def extend_list(self, doc_id: int, tokens: list[int]) -> None:
        """Fast path for a short list of int ids (checked, without a numpy round trip)."""
        doc = check_doc_id(doc_id)
        _check_list(tokens, "tokens")
        seq = self._seq(doc)
        if tokens:
            self._tree.extend(seq, tokens)
            self._num_tokens += len(tokens)
            self.version += 1

    # -- matching ------------------------------------------------------------------
    def match(
        self, tokens: Iterable[int] | np.ndarray = (), *, max_match_tokens: int = 64
    ) -> SuffixTreeCursor:
        """A cursor fed with `tokens`; feed it more with `SuffixTreeCursor.extend`."""
        if isinstance(max_match_tokens, bool) or not isinstance(max_match_tokens, int):
            raise TypeError(
                f"max_match_tokens must be an int, got {type(max_match_tokens).__name__}"
            )
        if not 1 <= max_match_tokens <= 1 << 20:
            raise ValueError(f"max_match_tokens must be in [1, 2^20], got {max_match_tokens}")
        cur = SuffixTreeCursor(self, max_match_tokens)
        cur.extend(tokens)
        return cur

    def save(self, path: Any) -> None:
        raise NotImplementedError(
            "the suffix-tree engine has no saved form; build global corpora with the "
            "native engine (agspec corpus build)"
        )

    # -- inspection ----------------------------------------------------------------
    @property
    def num_documents(self) -> int:
        return len(self._seq_ids)

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    def num_bytes(self) -> int:
        """The tree's own estimate of its memory (`SuffixTree.estimate_memory`)."""
        return int(self._tree.estimate_memory())

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._seq_ids

    def __len__(self) -> int:
        return self.num_documents

    def __repr__(self) -> str:
        return (
            f"SuffixTreeIndex(max_depth={self.max_depth}, documents={self.num_documents}, "
            f"tokens={self.num_tokens})"
        )

    # -- probing (used by the cursor) ----------------------------------------------
    def _probe(self, window: list[int], length: int) -> tuple[list[int], list[float]]:
        """The tree's path draft at match length `length` exactly (no probability cut).

        The context is the last `length + 1` tokens (sentinel-padded), so the engine tries
        match lengths 1..length; the length rule min(max_spec, floor(n * F + offset)) with
        F = 4096, offset = -4096 (length - 1) - 0.5 is >= 1 only for n = length (exact in
        float32 for depths <= 4096). Empty: the `length`-suffix has no continuation.
        """
        ctx = window[-(length + 1) :]
        if len(ctx) < length + 1:
            ctx = [_SENTINEL] * (length + 1 - len(ctx)) + ctx
        f = float(_MAX_DEPTH_LIMIT)
        draft = self._tree.speculate(ctx, self.max_depth, f, -f * (length - 1) - 0.5, 0.0, False)
        return list(draft.token_ids), list(draft.probs)


class SuffixTreeCursor:
    """The longest suffix of the fed tokens with a continuation in a `SuffixTreeIndex`.

    Keeps the last `max_match_tokens + 1` fed tokens; stays exact while the index grows
    (a new index version invalidates the cached probe).
    """

    def __init__(self, index: SuffixTreeIndex, max_match_tokens: int) -> None:
        self._index = index
        self._max_match_tokens = max_match_tokens
        self._cap = min(max_match_tokens, index.max_depth - 1)
        self._window: list[int] = []  # the last max_match_tokens + 1 fed tokens
        self._num_fed = 0
        self._key: tuple[int, int] | None = None  # (num_fed, index version) of the cache
        self._m = 0
        self._draft: tuple[list[int], list[float]] = ([], [])
        self._fed_since = 0  # tokens fed since the cached probe

    # -- feeding -------------------------------------------------------------------
    def extend(self, tokens: Iterable[int] | np.ndarray) -> None:
        arr = as_tokens(tokens)
        if arr.size:
            self._push(arr[-(self._max_match_tokens + 1) :].tolist(), int(arr.size))

    def extend_one(self, token: int) -> None:
        self.extend_list([token])

    def extend_list(self, tokens: list[int]) -> None:
        """Fast path for a short list of int ids (checked)."""
        _check_list(tokens, "tokens")
        if tokens:
            self._push(tokens, len(tokens))

    def _push(self, tail: list[int], n: int) -> None:
        self._window.extend(tail)
        keep = self._max_match_tokens + 1
        if len(self._window) > 2 * keep:  # trim in batches: amortized O(1) per token
            del self._window[:-keep]
        self._num_fed += n
        self._fed_since += n

    # -- answers -------------------------------------------------------------------
    @property
    def num_fed(self) -> int:
        return self._num_fed

    @property
    def match_length(self) -> int:
        self._search()
        return self._m

    @property
    def engine_max_tokens(self) -> int:
        """SuffixDecoding's rule: min(max_spec_tokens, floor(match_length * factor))."""
        self._search()
        idx = self._index
        return min(idx.max_spec_tokens, int(self._m * idx.max_spec_factor + 1e-6))

    def continuation(
        self, max_tokens: int, rule: ContinuationRule = "frequent", *, max_occurrences: int = 32
    ) -> list[int]:
        """Up to `max_tokens` tokens of the tree's most frequent path after the match.

        `rule` and `max_occurrences` are checked but do not change the answer: the tree
        keeps counts, not occurrences, so "first" and "recent" get the frequency path too.
        """
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        if rule not in _RULES:
            raise ValueError(f"rule must be one of {sorted(_RULES)}, got {rule!r}")
        if max_occurrences < 1:
            raise ValueError(f"max_occurrences must be >= 1, got {max_occurrences}")
        self._search()
        tokens, probs = self._draft
        p_min = self._index.min_token_prob
        n = 0  # probabilities never rise along a path: cut at the first one below p_min
        while n < len(tokens) and n < max_tokens and probs[n] >= p_min:
            n += 1
        return tokens[:n]

    # -- the search ----------------------------------------------------------------
    def _search(self) -> None:
        key = (self._num_fed, self._index.version)
        if key == self._key:
            return
        window, probe = self._window, self._index._probe
        hi = min(self._cap, self._num_fed)
        found: dict[int, tuple[list[int], list[float]]] = {0: ([], [])}

        def has(length: int) -> bool:
            found[length] = probe(window, length)
            return bool(found[length][0])

        # "Has a continuation" only shrinks as the suffix grows, so a binary search works.
        # Invariant: has(lo) holds, has(top) fails (top = hi + 1 counts as failing).
        lo, top = 0, hi + 1
        # The guess: the last match plus the tokens fed since (exact when the index did not
        # change). Usually has(guess) and not has(guess + 1): two probes.
        guess = min(hi, self._m + self._fed_since)
        if guess > 0:
            if has(guess):
                lo = guess
                if guess < hi:
                    if has(guess + 1):
                        lo = guess + 1
                    else:
                        top = guess + 1
            else:
                top = guess
        while top - lo > 1:
            mid = (lo + top) // 2
            if has(mid):
                lo = mid
            else:
                top = mid
        self._m, self._draft = lo, found[lo]
        self._key, self._fed_since = key, 0
