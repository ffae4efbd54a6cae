"""The drafter lifecycle every adapter and the replay lab drive.

One object per model call (request). The engine calls, in order:

    drafter.begin(prompt_ids)            # once, with the token ids the model receives
    loop:
        draft = drafter.propose(k)       # up to k draft token ids (may be empty)
        ... engine verifies draft ...
        drafter.accept(committed_ids)    # tokens appended to the output this step
    drafter.end()                        # once; the drafter may keep what it learned

`committed_ids` are the tokens the target model committed in this step: the accepted
prefix of the draft followed by the one token the model produced itself (the bonus token).
Accept length is `len(committed_ids) - 1` when the step verified a draft: it excludes the
bonus token, as in the paper, everywhere in AgSpec.

Example with concrete tokens: after `begin([5, 6, 7])`, `propose(4)` returns
`[8, 9, 10, 11]`; the model agrees with 8 and 9 and then writes 12, so the engine calls
`accept([8, 9, 12])`: accept length 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


def greedy_commit(
    draft: Sequence[int], reference: Sequence[int], start: int
) -> tuple[int, Sequence[int]]:
    """What a greedy verifier commits when the model's output from `start` on is
    `reference[start:]`: (accept length, committed tokens). The committed tokens are the
    accepted draft prefix plus the model's own next token (the bonus), unless the draft
    already covered the rest of the reference. The one greedy accept rule of the lab, the
    cap profiler and the pipeline's scripted model.

    >>> greedy_commit([8, 9, 10], [7, 8, 9, 12, 13], 1)
    (2, [8, 9, 12])
    >>> greedy_commit([12, 13, 14], [7, 8, 9, 12, 13], 3)
    (2, [12, 13])
    """
    end = len(reference)
    limit = min(len(draft), end - start)
    accepted = 0
    while accepted < limit and draft[accepted] == reference[start + accepted]:
        accepted += 1
    return accepted, reference[start : start + accepted + 1]


@runtime_checkable
class CallDrafter(Protocol):
    """A per-call drafter: `begin / propose / accept / end`."""

    def begin(self, prompt_ids: Sequence[int]) -> None: ...

    def propose(self, max_tokens: int) -> list[int]: ...

    def accept(self, committed_ids: Sequence[int]) -> None: ...

    def end(self) -> None: ...


def accept_length(draft: Sequence[int], committed_ids: Sequence[int]) -> int:
    """Number of draft tokens the model kept: the bonus token is not counted.

    >>> accept_length([8, 9, 10, 11], [8, 9, 12])
    2
    """
    n = 0
    for d, c in zip(draft, committed_ids[:-1] if committed_ids else ()):
        if d != c:
            break
        n += 1
    return n


@runtime_checkable
class DrafterSession(Protocol):
    """Per-session state of a drafter family: corpora that live as long as the session.

    `emission_format` is the scaffold's declared format (see `agspec.traces`), known before
    the session runs.
    """

    def open_artifact(self, path: str, text: str) -> None: ...

    def call(self, agent: str, role: str, turn: int) -> CallDrafter: ...

    def end(self) -> None: ...


@runtime_checkable
class DrafterServer(Protocol):
    """Process-level state of a drafter family (global corpus, caps, scales, caches).

    `server.session(id, emission_format=...)` → `session.call(agent, role, turn)` →
    `begin / propose / accept / end`. Every drafter the replay lab compares, AgSpec and
    each baseline, has this shape.
    """

    name: str

    def session(self, session_id: str, *, emission_format: str = "none") -> DrafterSession: ...
