"""The oracle bound: the best any retrieval drafter could do with the same text and cap.

At each step the oracle drafts the longest prefix of the rest of the recorded output
that occurs, as a contiguous token sequence, anywhere in the text available at that
moment, capped at `cap_tokens`. The available text is the current call's prompt and the
output generated so far, plus (by `scope`) the session's earlier calls or every earlier
call of the run, plus the workspace artifacts the session opened and the global corpus.
Each call's text is its own document: a match never spans two documents.

Example: prompt `[1, 2, 3, 4]`, output `[2, 3, 9, 2, 3, 9]`, cap 8. Step 1: `[2, 3]`
occurs in the prompt, `[2, 3, 9]` does not: draft `[2, 3]`, commit `[2, 3, 9]`. Step 2:
the rest `[2, 3, 9]` now occurs in the text (`... 2, 3, 9` just generated): draft all
three tokens, which cover the output; no bonus token. Two steps for six tokens.

The tree bound (`anchored=True`, the lab's `oracle-tree`): a retrieval drafter copies
what follows a match of at least the context's last token, so the widest tree it could
draft holds every continuation of every occurrence of that token; its best root path is
the longest prefix P of the rest of the output such that `[last token] + P` occurs in the
available text (capped as above). No retrieval drafter, chain or tree of any width, with
the same text beats it; the plain oracle (no anchor) bounds it in turn. Example: text
`[1, 2, 3, 4]`, context ending in `9`, output `[2, 3]`: the oracle drafts `[2, 3]`, the
tree bound nothing (9 never occurs).

Exactness comes from a generalized suffix automaton (`SuffixAutomaton`): every
substring of every inserted document is a path from the root, so the longest occurring
prefix is found by walking from the root, at most `cap_tokens` transitions per step.
A document that starts with an earlier document's prefix (the next call's prompt
repeats the history) resumes from that prefix's state instead of re-reading it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ORACLE_SCOPES = ("call", "session", "run")


class SuffixAutomaton:
    """Generalized suffix automaton over int token documents (append-only).

    Invariants: state 0 is the root; `length[s]` is the length of the longest string of
    state `s`; `link[s]` is its suffix link (-1 for the root); `trans[s]` maps a token to
    the next state. A string occurs in some document iff it is a path from the root.

    >>> sam = SuffixAutomaton()
    >>> doc = sam.add_document([1, 2, 3])
    >>> sam.longest_prefix([2, 3, 4], 10), sam.longest_prefix([3], 10)
    (2, 1)
    """

    def __init__(self) -> None:
        self.trans: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]

    @property
    def num_states(self) -> int:
        return len(self.length)

    def extend(self, last: int, token: int) -> int:
        """Append `token` to the document whose prefix ends in state `last`; new end state."""
        trans, link, length = self.trans, self.link, self.length
        q = trans[last].get(token)
        if q is not None:
            # The extended string already occurs (generalized automaton).
            if length[q] == length[last] + 1:
                return q
            clone = len(length)
            trans.append(dict(trans[q]))
            link.append(link[q])
            length.append(length[last] + 1)
            p = last
            while p != -1 and trans[p].get(token) == q:
                trans[p][token] = clone
                p = link[p]
            link[q] = clone
            return clone
        cur = len(length)
        trans.append({})
        link.append(0)
        length.append(length[last] + 1)
        p = last
        while p != -1 and token not in trans[p]:
            trans[p][token] = cur
            p = link[p]
        if p != -1:
            q = trans[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(length)
                trans.append(dict(trans[q]))
                link.append(link[q])
                length.append(length[p] + 1)
                while p != -1 and trans[p].get(token) == q:
                    trans[p][token] = clone
                    p = link[p]
                link[q] = clone
                link[cur] = clone
        return cur

    def add_document(self, tokens: Sequence[int], start_state: int = 0) -> list[int]:
        """Insert a document (or continue one from `start_state`); states after each token."""
        states = []
        last = start_state
        extend = self.extend
        for token in tokens:
            last = extend(last, token)
            states.append(last)
        return states

    def longest_prefix_after(
        self, first: int, tokens: Sequence[int], max_tokens: int, start: int = 0
    ) -> int:
        """Length of the longest prefix P of `tokens[start:]` (at most `max_tokens`) such
        that `[first] + P` occurs; 0 also when `first` never occurs.

        >>> sam = SuffixAutomaton(); _ = sam.add_document([1, 2, 3, 1, 5])
        >>> sam.longest_prefix_after(1, [2, 3, 9], 10), sam.longest_prefix_after(3, [2], 10)
        (2, 0)
        """
        trans = self.trans
        state = trans[0].get(first)
        if state is None:
            return 0
        n = 0
        end = min(len(tokens), start + max_tokens)
        for i in range(start, end):
            state_next = trans[state].get(tokens[i])
            if state_next is None:
                break
            state = state_next
            n += 1
        return n

    def longest_prefix(self, tokens: Sequence[int], max_tokens: int, start: int = 0) -> int:
        """Length of the longest prefix of `tokens[start:]` that occurs, at most `max_tokens`."""
        trans = self.trans
        state = 0
        n = 0
        end = min(len(tokens), start + max_tokens)
        for i in range(start, end):
            state_next = trans[state].get(tokens[i])
            if state_next is None:
                break
            state = state_next
            n += 1
        return n


class _Document:
    """A document being written into an automaton, with its end state after each token."""

    def __init__(self, sam: SuffixAutomaton) -> None:
        self.sam = sam
        self.tokens: list[int] = []
        self.states: list[int] = []

    def restart(self, tokens: Sequence[int], previous: _Document | None) -> None:
        """Start a new document; reuse the states of `previous`'s common prefix."""
        shared = 0
        if previous is not None and previous.tokens:
            limit = min(len(tokens), len(previous.tokens))
            prev = previous.tokens
            while shared < limit and prev[shared] == tokens[shared]:
                shared += 1
        if previous is not None and shared:
            self.tokens = list(previous.tokens[:shared])
            self.states = list(previous.states[:shared])
        else:
            self.tokens, self.states = [], []
        self.extend(tokens[shared:])

    def extend(self, tokens: Sequence[int]) -> None:
        last = self.states[-1] if self.states else 0
        extend = self.sam.extend
        for token in tokens:
            last = extend(last, token)
            self.states.append(last)
        self.tokens.extend(tokens)


class OracleServer:
    """The oracle as a drafter server; it reads the recorded outputs it must reproduce.

    `outputs[session_id][i]` is the recorded output of the session's i-th call, in the
    order the simulator calls `session.call`. `tokenize` turns artifact text into ids
    (artifacts are ignored when it is None).
    """

    def __init__(
        self,
        outputs: Mapping[str, Sequence[Sequence[int]]],
        *,
        global_docs: Sequence[Sequence[int]] = (),
        cap_tokens: int = 64,
        scope: str = "session",
        tokenize: Any = None,
        name: str = "oracle",
        anchored: bool = False,
    ) -> None:
        if scope not in ORACLE_SCOPES:
            raise ValueError(f"oracle scope must be one of {ORACLE_SCOPES}, got {scope!r}")
        if cap_tokens < 1:
            raise ValueError(f"cap_tokens must be >= 1, got {cap_tokens}")
        self.name = name
        self.anchored = bool(anchored)  # the tree bound (module docstring)
        self.outputs = outputs
        self.cap_tokens = cap_tokens
        self.scope = scope
        self.tokenize = tokenize
        self.global_sam: SuffixAutomaton | None = None
        if global_docs:
            self.global_sam = SuffixAutomaton()
            for doc in global_docs:
                self.global_sam.add_document(doc)
        self._run_sam = SuffixAutomaton()  # scope "run": shared by every session
        self._run_last_doc: _Document | None = None

    def session(self, session_id: str, *, emission_format: str = "none") -> _OracleSession:
        if session_id not in self.outputs:
            raise KeyError(f"oracle has no recorded outputs for session {session_id!r}")
        return _OracleSession(self, list(self.outputs[session_id]))


class _OracleSession:
    def __init__(self, server: OracleServer, outputs: list[Sequence[int]]) -> None:
        self.server = server
        self.outputs = outputs
        self.num_calls = 0
        if server.scope == "run":
            self.sam = server._run_sam
        else:
            self.sam = SuffixAutomaton()
        self.last_doc: _Document | None = server._run_last_doc if server.scope == "run" else None

    def open_artifact(self, path: str, text: str) -> None:
        if self.server.tokenize is not None:
            self.sam.add_document(self.server.tokenize(text))

    def call(self, agent: str, role: str, turn: int) -> _OracleCall:
        if self.num_calls >= len(self.outputs):
            raise ValueError("oracle session asked for more calls than were recorded")
        output = self.outputs[self.num_calls]
        self.num_calls += 1
        if self.server.scope == "call":
            self.sam = SuffixAutomaton()
            self.last_doc = None
        return _OracleCall(self, output)

    def end(self) -> None:
        if self.server.scope == "run":
            self.server._run_last_doc = self.last_doc


class _OracleCall:
    def __init__(self, session: _OracleSession, output: Sequence[int]) -> None:
        self.session = session
        self.output = list(output)
        self.pos = 0
        self.doc = _Document(session.sam)
        self.last_match_length: int | None = None
        self.last_source: str | None = None

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.doc.restart(list(prompt_ids), self.session.last_doc)

    def propose(self, max_tokens: int) -> list[int]:
        server = self.session.server
        cap = min(max_tokens, server.cap_tokens)
        gsam = server.global_sam
        n_global = 0
        if server.anchored:
            tokens = self.doc.tokens
            if not tokens:
                return []
            last = tokens[-1]
            n_local = self.doc.sam.longest_prefix_after(last, self.output, cap, self.pos)
            if gsam is not None and n_local < cap:
                n_global = gsam.longest_prefix_after(last, self.output, cap, self.pos)
        else:
            n_local = self.doc.sam.longest_prefix(self.output, cap, self.pos)
            if gsam is not None and n_local < cap:
                n_global = gsam.longest_prefix(self.output, cap, self.pos)
        n = max(n_local, n_global)
        self.last_match_length = n
        self.last_source = "global" if n_global > n_local else "session"
        return self.output[self.pos : self.pos + n]

    def accept(self, committed_ids: Sequence[int]) -> None:
        self.doc.extend(list(committed_ids))
        self.pos += len(committed_ids)

    def end(self) -> None:
        self.session.last_doc = self.doc
