"""`ar`: autoregressive decoding as a drafter server, one that never proposes, so every
step commits one token (the lab's baseline of speedup 1, and `agspec serve --drafter ar`).

>>> ARServer().session("s").call("coder", "code", 0).propose(8)
[]
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ARServer"]


class _NoDraft:
    """AR decoding: never proposes, so every step commits one token."""

    def begin(self, prompt_ids: Sequence[int]) -> None:
        pass

    def propose(self, max_tokens: int) -> list[int]:
        return []

    def accept(self, committed_ids: Sequence[int]) -> None:
        pass

    def end(self) -> None:
        pass


class _NoDraftSession:
    def open_artifact(self, path: str, text: str) -> None:
        pass

    def call(self, agent: str, role: str, turn: int) -> _NoDraft:
        return _NoDraft()

    def end(self) -> None:
        pass


class ARServer:
    """The AR baseline as a drafter server (proposes nothing)."""

    name = "ar"

    def session(self, session_id: str, *, emission_format: str = "none") -> _NoDraftSession:
        return _NoDraftSession()
