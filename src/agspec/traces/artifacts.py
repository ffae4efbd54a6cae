"""Reassemble the files a session showed, from full dumps and numbered line windows.

Rules (documented in `docs/traces-importers.md`):
- a full view (`cat FILE`, ChatDev `Codes:`) replaces what was known; `complete=True`;
- a window (SWE-agent `NNN:` lines, `sed -n 'A,Bp'`, `nl -ba`) merges by line number,
  the newer text winning; `complete=True` once every line `1..total` is known;
- a window that reports a different total line count than before, or any view after the
  session wrote the file (`invalidate`), starts the file afresh: old lines may have moved;
- gaps are left out of `text`: the known lines are joined in line order.

>>> t = ArtifactTracker()
>>> t.show_lines("a.py", 3, ["c = 3", "d = 4"], total_lines=4)
>>> t.show_lines("a.py", 1, ["a = 1", "b = 2"], total_lines=4)
>>> t.take()
[Artifact(path='a.py', text='a = 1\\nb = 2\\nc = 3\\nd = 4\\n', complete=True)]
>>> t.take()
[]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agspec.traces.schema import Artifact

__all__ = ["ArtifactTracker"]


@dataclass
class _FileState:
    lines: dict[int, str] = field(default_factory=dict)  # 1-based line number -> text
    total_lines: int | None = None  # None: unknown
    full_text: str | None = None  # set by a full view, until the next window
    stale: bool = False  # the session wrote the file since it was last viewed


class ArtifactTracker:
    """What the session has shown of each file; `take()` yields the new or changed ones."""

    def __init__(self) -> None:
        self._files: dict[str, _FileState] = {}
        self._touched: list[str] = []  # paths viewed since the last take(), first-view order
        self._emitted: dict[str, str] = {}  # path -> text of the last artifact emitted

    def show_full(self, path: str, text: str) -> None:
        """The whole file was shown."""
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        self._files[path] = _FileState(
            lines=dict(enumerate(lines, start=1)), total_lines=len(lines), full_text=text
        )
        self._touch(path)

    def show_lines(
        self, path: str, first_line: int, lines: Sequence[str], total_lines: int | None = None
    ) -> None:
        """Lines `first_line, first_line + 1, ...` were shown (1-based)."""
        self.show_numbered(path, {first_line + i: s for i, s in enumerate(lines)}, total_lines)

    def show_numbered(
        self, path: str, lines: dict[int, str], total_lines: int | None = None
    ) -> None:
        """Lines by number were shown (1-based numbers)."""
        st = self._files.get(path)
        if (
            st is None
            or st.stale
            or (total_lines is not None and st.total_lines not in (None, total_lines))
        ):
            st = _FileState()
            self._files[path] = st
        st.full_text = None
        st.lines.update(lines)
        if total_lines is not None:
            st.total_lines = total_lines
        self._touch(path)

    def invalidate(self, path: str) -> None:
        """The session wrote `path`: the next view of it starts afresh."""
        st = self._files.get(path)
        if st is not None:
            st.stale = True

    def known_paths(self) -> list[str]:
        return list(self._files)

    def take(self) -> list[Artifact]:
        """Artifacts viewed since the last call whose text changed, in first-view order."""
        out = []
        for path in self._touched:
            art = self._artifact(path)
            if self._emitted.get(path) != art.text:
                self._emitted[path] = art.text
                out.append(art)
        self._touched = []
        return out

    def _touch(self, path: str) -> None:
        if path not in self._touched:
            self._touched.append(path)

    def _artifact(self, path: str) -> Artifact:
        st = self._files[path]
        if st.full_text is not None:
            return Artifact(path, st.full_text, True)
        nums = sorted(st.lines)
        text = "".join(st.lines[n] + "\n" for n in nums)
        complete = (
            st.total_lines is not None
            and len(nums) == st.total_lines
            and (not nums or (nums[0] == 1 and nums[-1] == st.total_lines))
        )
        return Artifact(path, text, complete)
