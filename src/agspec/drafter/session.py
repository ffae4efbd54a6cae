"""One session of an `AgSpecServer`: its session and workspace corpora; makes calls."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import numpy as np

from agspec.corpora import SessionCorpus, WorkspaceCorpus
from agspec.drafter.call import AgSpecCall
from agspec.index.engines import ENGINES

if TYPE_CHECKING:
    from agspec.drafter.server import AgSpecServer


class AgSpecSession:
    """Session and workspace corpora of one session; `call(...)` makes a drafter."""

    def __init__(self, server: AgSpecServer, session_id: str, emission_format: str) -> None:
        cfg = server.config
        self.server = server
        self.session_id = session_id
        factory = ENGINES.get(cfg.engine)
        self.session_corpus = SessionCorpus(separator_id=server.separator_id, index_factory=factory)
        self.workspace = WorkspaceCorpus(
            server.tokenizer.encode,
            emission_format,
            with_emission_forms=cfg.use_emission_forms,
            index_factory=factory,
        )
        self.last_used = 0.0
        self.closed = False
        # Over the live token budget on its own: indexes nothing more (AgSpecServer).
        self.frozen = False
        self._counted = 0  # tokens of this session in the server's live total
        self._calls: weakref.WeakSet[AgSpecCall] = weakref.WeakSet()
        self._num_calls = 0

    def _check_open(self) -> None:
        if self.closed:
            raise KeyError(f"session {self.session_id!r} was ended or evicted")

    def open_artifact(self, path: str, text: str) -> int:
        self._check_open()
        if not self.server.config.use_workspace or self.frozen:
            return 0
        before = self.workspace.num_tokens
        self.workspace.open_artifact(path, text)
        added = self.workspace.num_tokens - before
        self.server._grew(self, added)
        return added

    def call(self, agent: str, role: str = "other", turn: int = 0) -> AgSpecCall:
        self._check_open()
        if not isinstance(agent, str) or not agent:
            got = repr(agent) if isinstance(agent, str) else type(agent).__name__
            raise ValueError(f"agent must be a non-empty str, got {got}")
        if not isinstance(role, str):
            raise TypeError(f"role must be a str, got {type(role).__name__}")
        if isinstance(turn, bool) or not isinstance(turn, (int, np.integer)) or turn < 0:
            got = str(turn) if isinstance(turn, (int, np.integer)) else type(turn).__name__
            raise ValueError(f"turn must be an int >= 0, got {got}")
        self._num_calls += 1
        call = AgSpecCall(self, agent, role, turn, doc_id=self._num_calls)
        self._calls.add(call)
        return call

    def end(self) -> None:
        """Ends the session: its calls stop and its corpora are freed. Idempotent."""
        if self.server._sessions.get(self.session_id) is self:
            self.server.end_session(self.session_id)
        elif not self.closed:
            self.server._close(self)

    @property
    def counted_tokens(self) -> int:
        """This session's share of the server's live token count
        (`AgSpecServer.live_tokens`)."""
        return self._counted

    @property
    def num_tokens(self) -> int:
        return self.session_corpus.num_tokens + self.workspace.num_tokens
