"""What the index-backed baselines share: argument checks, `DocStore` (document tokens for
vectorized continuation lookups), `most_frequent_path` (REST's draft rule), `CallLifecycle`
(the begin/propose/accept/end checks), `StaticSession` and `IndexedCorpus`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from agspec.drafter.protocol import CallDrafter
from agspec.index.token_index import as_tokens, is_token_list


def token_array(tokens: Iterable[int] | np.ndarray, *, what: str = "tokens") -> np.ndarray:
    """Token ids as a 1-D int32 array, checked once at the boundary (`as_tokens`, any
    integer array accepted once its range is checked).

    >>> token_array([5, 6, 7]).tolist()
    [5, 6, 7]
    """
    return as_tokens(tokens, what=what, narrow=True)


def check_global_docs(global_docs: Iterable[Sequence[int]] | None) -> list[np.ndarray]:
    """The global corpus as int32 arrays: a list of token-id lists, validated."""
    if global_docs is None:
        return []
    if isinstance(global_docs, (str, bytes, np.ndarray)):
        raise TypeError("global_docs must be a list of token-id lists (one per document)")
    return [token_array(d, what=f"global_docs[{i}]") for i, d in enumerate(global_docs)]


def import_token_index() -> Any:
    """The native index class, or an ImportError that says how to build it."""
    try:
        from agspec.index.token_index import TokenIndex
    except ImportError as exc:  # the compiled module is missing
        raise ImportError(
            "this baseline runs on the native index agspec.index.token_index, which is not built: "
            "run `pip install --no-build-isolation -e .` in the repository root"
        ) from exc
    return TokenIndex


class DocStore:
    """The tokens of an index's documents in one growing flat buffer.

    Lets a drafter read the continuations of thousands of occurrences at once (numpy
    fancy indexing) instead of one Python slice per occurrence. Invariant: document
    `d` occupies `buf[start[d] : start[d] + length[d]]`; only the newest document may
    grow, so documents stay contiguous. Ids are dense: 0, 1, 2, ...

    >>> s = DocStore(); s.extend(0, [4, 5, 6]); s.extend(1, [7, 8])
    >>> s.continuations([(0, 0), (1, 0), (0, 2)], 2).tolist()
    [[5, 6], [8, -1], [-1, -1]]
    """

    def __init__(self) -> None:
        self._buf = np.zeros(1024, dtype=np.int32)
        self._num_tokens = 0
        self._start = np.zeros(16, dtype=np.int64)
        self._length = np.zeros(16, dtype=np.int64)
        self._num_docs = 0

    @property
    def num_documents(self) -> int:
        return self._num_docs

    def extend(self, doc_id: int, tokens: np.ndarray | Sequence[int]) -> None:
        """Appends to the newest document (`doc_id == num_documents - 1`) or starts one."""
        arr = np.asarray(tokens, dtype=np.int32)
        if doc_id == self._num_docs:
            if self._num_docs == len(self._start):
                self._start = np.concatenate([self._start, np.zeros_like(self._start)])
                self._length = np.concatenate([self._length, np.zeros_like(self._length)])
            self._start[doc_id] = self._num_tokens
            self._num_docs += 1
        elif doc_id != self._num_docs - 1:
            raise ValueError(
                f"DocStore appends only to its newest document ({self._num_docs - 1}) "
                f"or starts document {self._num_docs}; got doc_id {doc_id}"
            )
        need = self._num_tokens + arr.size
        if need > self._buf.size:
            grown = np.zeros(max(need, 2 * self._buf.size), dtype=np.int32)
            grown[: self._num_tokens] = self._buf[: self._num_tokens]
            self._buf = grown
        self._buf[self._num_tokens : need] = arr
        self._num_tokens = need
        self._length[doc_id] += arr.size

    def continuations(self, occurrences: Sequence[tuple[int, int]], num_tokens: int) -> np.ndarray:
        """`[len(occurrences), num_tokens]` int32: the tokens after each occurrence's end
        offset, padded with -1 past the end of its document."""
        if not occurrences or num_tokens <= 0:
            return np.full((len(occurrences), max(num_tokens, 0)), -1, dtype=np.int32)
        occ = np.asarray(occurrences, dtype=np.int64)  # [n, 2]: doc_id, end_offset
        doc, end = occ[:, 0], occ[:, 1]
        offs = end[:, None] + 1 + np.arange(num_tokens)[None, :]  # [n, num_tokens]
        valid = offs < self._length[doc][:, None]
        pos = np.where(valid, self._start[doc][:, None] + offs, 0)
        return np.where(valid, self._buf[pos], -1).astype(np.int32)


def most_frequent_path(continuations: np.ndarray) -> list[int]:
    """The most frequent root-to-leaf path of the trie of `continuations` (rows most
    recent first, padded with -1): at each depth the token most rows still on the path
    agree on; ties go to the token whose first row is most recent.

    >>> most_frequent_path(np.array([[5, 9], [4, 1], [4, 2], [5, 9], [4, 2]]))
    [4, 2]
    """
    path: list[int] = []
    alive = np.arange(continuations.shape[0])
    for depth in range(continuations.shape[1]):
        if alive.size == 1:  # one row left: the rest of the path is that row
            rest = continuations[alive[0], depth:]
            stop = np.flatnonzero(rest < 0)
            path.extend(rest[: stop[0] if stop.size else rest.size].tolist())
            break
        col = continuations[alive, depth]
        keep = col >= 0
        if not keep.any():
            break
        alive, col = alive[keep], col[keep]
        if (col == col[0]).all():  # every row agrees (the common case): no counting
            path.append(int(col[0]))
            continue
        tokens, first_row, counts = np.unique(col, return_index=True, return_counts=True)
        best = counts == counts.max()
        token = int(tokens[best][np.argmin(first_row[best])])
        path.append(token)
        alive = alive[col == token]
    return path


class CallLifecycle:
    """Checks the `begin / propose / accept / end` order and the arguments of a call.

    Subclasses implement `_begin(prompt: int32 array)`, `_propose(max_tokens >= 1)`,
    `_accept(committed: int32 array, or a checked list of ints when the subclass sets
    `accepts_lists`)` and `_end()`; this class turns misuse into clear
    exceptions. `last_match_length` / `last_source` describe the latest proposal (the
    replay lab records them; `None` when nothing matched).
    """

    # True: `_accept` also takes the caller's list of ints as it is (checked, not copied),
    # as an engine that is handed a list per step (vLLM's sampled ids) takes it.
    accepts_lists = False

    def __init__(self) -> None:
        self._state = "new"
        self.last_match_length: int | None = None
        self.last_source: str | None = None

    def begin(self, prompt_ids: Sequence[int]) -> None:
        if self._state != "new":
            raise RuntimeError(f"begin() called on a drafter that is already {self._state}")
        prompt = token_array(prompt_ids, what="prompt_ids")
        self._state = "begun"
        self._begin(prompt)

    def propose(self, max_tokens: int) -> list[int]:
        self._require_begun("propose")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)):
            raise TypeError(f"max_tokens must be an int, got {type(max_tokens).__name__}")
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.last_match_length, self.last_source = None, None
        if max_tokens == 0:
            return []
        return self._propose(int(max_tokens))

    def accept(self, committed_ids: Sequence[int]) -> None:
        self._require_begun("accept")
        if self.accepts_lists and type(committed_ids) is list and is_token_list(committed_ids):
            if committed_ids:
                self._accept(committed_ids)
            return
        committed = token_array(committed_ids, what="committed_ids")
        if committed.size:
            self._accept(committed)

    def end(self) -> None:
        self._require_begun("end")
        self._state = "ended"
        self._end()

    def _require_begun(self, what: str) -> None:
        if self._state != "begun":
            hint = "call begin(prompt_ids) first" if self._state == "new" else "the call ended"
            raise RuntimeError(f"{what}() on a drafter that is {self._state}: {hint}")

    def _begin(self, prompt: np.ndarray) -> None:
        raise NotImplementedError

    def _propose(self, max_tokens: int) -> list[int]:
        raise NotImplementedError

    def _accept(self, committed: Any) -> None:  # np.ndarray, or list[int] (accepts_lists)
        raise NotImplementedError

    def _end(self) -> None:
        pass


def check_call_args(agent: str, role: str, turn: int) -> None:
    """Validates `DrafterSession.call` arguments."""
    if not isinstance(agent, str) or not isinstance(role, str):
        raise TypeError("agent and role must be str")
    if isinstance(turn, bool) or not isinstance(turn, (int, np.integer)) or turn < 0:
        raise ValueError(f"turn must be an int >= 0, got {turn!r}")


def check_artifact_args(path: str, text: str) -> None:
    """Validates `DrafterSession.open_artifact` arguments."""
    if not isinstance(path, str) or not isinstance(text, str):
        raise TypeError("open_artifact(path, text) takes two str")


class StaticSession:
    """A session of a family whose corpora do not depend on the session (REST, SAM):
    artifacts are ignored (the original systems never see them); calls come from
    `make_call`."""

    def __init__(self, server: Any, session_id: str) -> None:
        self._server = server
        self.session_id = session_id
        self._ended = False

    def open_artifact(self, path: str, text: str) -> None:
        check_artifact_args(path, text)
        if self._ended:
            raise RuntimeError(f"open_artifact() on session {self.session_id!r}, which ended")

    def call(self, agent: str, role: str, turn: int) -> CallDrafter:
        check_call_args(agent, role, turn)
        if self._ended:
            raise RuntimeError(f"call() on session {self.session_id!r}, which ended")
        drafter: CallDrafter = self._server.make_call()
        return drafter

    def end(self) -> None:
        if self._ended:
            raise RuntimeError(f"session {self.session_id!r} already ended")
        self._ended = True


def check_session_args(session_id: str, emission_format: str) -> None:
    if not isinstance(session_id, str) or not session_id:
        raise ValueError(f"session_id must be a non-empty str, got {session_id!r}")
    if not isinstance(emission_format, str):
        raise TypeError(f"emission_format must be a str, got {type(emission_format).__name__}")


class IndexedCorpus:
    """A native `TokenIndex` plus the `DocStore` copy of its tokens (dense doc ids)."""

    def __init__(self) -> None:
        self.index = import_token_index()()
        self.store = DocStore()

    @property
    def num_documents(self) -> int:
        return self.store.num_documents

    def add_document(self, tokens: np.ndarray) -> int:
        """Adds a new document; returns its id. Empty documents are kept (no positions)."""
        doc_id = self.store.num_documents
        self.store.extend(doc_id, tokens)
        if tokens.size:
            self.index.extend(doc_id, tokens)
        return doc_id

    def extend_last(self, tokens: np.ndarray) -> None:
        """Appends to the newest document."""
        doc_id = self.store.num_documents - 1
        self.store.extend(doc_id, tokens)
        self.index.extend(doc_id, tokens)

    def frequent_path(self, cursor: Any, max_tokens: int, max_occurrences: int) -> list[int]:
        """REST's linearized draft for the cursor's current match (see module docstring)."""
        occ = cursor.occurrences(max_count=max_occurrences)
        return most_frequent_path(self.store.continuations(occ, max_tokens))
