"""Generated tokens → text, with stop strings, for one request (streamed or not).

`TextStream.add(tokens)` takes each step's committed tokens; `pending()` is the text
that may be sent now. Text that could be the start of a stop string is held back until
the string is complete (then everything from it on is dropped) or ruled out. An
end-of-generation token ends the text and is not part of it. Bytes that do not form
valid UTF-8 are dropped, as llama-cpp-python does (`errors="ignore"`); an incomplete
character at the end waits for its next bytes.

`num_tokens` counts the tokens up to the one that completed the text (for a stop string:
the token where it became complete), so the usage a client sees does not depend on how
many tokens one speculative step committed past a stop.

>>> pieces = {1: b"he", 2: b"llo", 3: b" wor", 4: b"ld", 9: b""}
>>> ts = TextStream(lambda t: pieces[t], stops=("wor",), eog={9})
>>> ts.add([1, 2]); ts.pending()
'hello'
>>> ts.add([3, 4]); ts.stopped, ts.pending(), ts.text, ts.num_tokens
(True, ' ', 'hello ', 3)
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Sequence

__all__ = ["TextStream"]


def _complete_utf8_prefix(data: bytes) -> int:
    """Length of `data` without an incomplete UTF-8 character at its end."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 == 0x80:  # a continuation byte: look further back
            continue
        if b & 0x80 == 0:  # ASCII: complete
            return n
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return n if back >= need else n - back
    return n


class TextStream:
    def __init__(
        self,
        piece: Callable[[int], bytes],
        *,
        stops: Sequence[str] = (),
        eog: Collection[int] = (),
        hold_all: bool = False,
    ) -> None:
        self._piece = piece
        self.stops = tuple(s for s in stops if s)
        self._eog = eog
        self.hold_all = hold_all
        self.tokens: list[int] = []
        self._bytes = bytearray()
        self._ends: list[int] = []  # byte length after each token
        self.text = ""
        self._sent = 0
        self._searched = 0
        self.stopped = False  # a stop string was found
        self.eos = False  # an end-of-generation token was generated
        self.num_tokens = 0
        self._max_stop = max((len(s) for s in self.stops), default=0)

    @property
    def done(self) -> bool:
        return self.stopped or self.eos

    def add(self, tokens: Sequence[int]) -> None:
        if self.done:
            return
        for t in tokens:
            if t in self._eog:
                self.eos = True
                break
            self.tokens.append(t)
            self._bytes += self._piece(t)
            self._ends.append(len(self._bytes))
        self.num_tokens = len(self.tokens)
        cut = len(self._bytes) if self.eos else _complete_utf8_prefix(bytes(self._bytes))
        self.text = bytes(self._bytes[:cut]).decode("utf-8", errors="ignore")
        if self.stops:
            self._find_stop()

    def _find_stop(self) -> None:
        start = max(0, self._searched - self._max_stop + 1)
        best = -1
        best_stop = ""
        for s in self.stops:
            p = self.text.find(s, start)
            if p >= 0 and (best < 0 or p < best):
                best, best_stop = p, s
        self._searched = len(self.text)
        if best < 0:
            return
        end_bytes = len(self.text[: best + len(best_stop)].encode("utf-8"))
        self.num_tokens = min(len(self.tokens), bisect.bisect_left(self._ends, end_bytes) + 1)
        self.text = self.text[:best]
        self.stopped = True

    def _holdback(self) -> int:
        if self.done or not self.stops:
            return 0
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.text)), hold, -1):
                if self.text.endswith(s[:k]):
                    hold = k
                    break
        return hold

    def pending(self, *, final: bool = False) -> str:
        """Text not sent yet that may be sent now (all of it when `final`)."""
        if self.hold_all and not final:
            return ""
        end = len(self.text) if final else len(self.text) - self._holdback()
        if end <= self._sent:
            return ""
        out = self.text[self._sent : end]
        self._sent = end
        return out
