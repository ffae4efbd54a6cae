"""A small, forgiving unified-diff applier for model-written patches.

Small models write diffs with wrong line numbers, missing `@@` counts, context lines
without their leading space (inside a ```diff fence every unprefixed line is taken as
context; outside one, prose ends the hunk), or a fence around the diff. Each hunk is applied by
content, not by line number: its old side (context + removed lines) is searched in the
file, nearest to the hunk's hinted line first; when it is not found, lines are compared
with trailing whitespace ignored, then the outer context lines are dropped one by one
(up to `max_fuzz_lines` from each end, as `patch --fuzz` does). A hunk that still does not
match raises `PatchError` naming the file and the hunk.

Example: the file `x = 1\\ny = 2\\n` and the patch

    --- a/m.py
    +++ b/m.py
    @@ -1,2 +1,2 @@
     x = 1
    -y = 2
    +y = 3

give `{"m.py": "x = 1\\ny = 3\\n"}` (`apply_patch(patch, {"m.py": "x = 1\\ny = 2\\n"})`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["PatchError", "FilePatch", "Hunk", "parse_patch", "apply_patch", "extract_diff"]


class PatchError(ValueError):
    """A patch that cannot be parsed or applied; the message says which file and hunk."""


@dataclass
class Hunk:
    """One `@@` block: `old_start` is the 1-based hinted line (0 when unknown)."""

    old_start: int
    lines: list[str] = field(default_factory=list)  # each starts with ' ', '-' or '+'

    @property
    def old_lines(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " -"]

    @property
    def new_lines(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " +"]


@dataclass
class FilePatch:
    """The hunks for one file; `old_path` is None for a new file (`--- /dev/null`)."""

    old_path: str | None
    new_path: str | None
    hunks: list[Hunk] = field(default_factory=list)


_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@")
_FENCE_RE = re.compile(r"```[ \t]*(?:diff|patch|udiff)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_diff(text: str) -> str:
    """The diff inside a model's reply: the first fenced block that looks like a diff,
    else the text from the first `---`/`@@` line on."""
    return _extract(text)[0]


def _extract(text: str) -> tuple[str, bool]:
    """`(diff, fenced)`: inside a fence every line belongs to the diff."""
    for m in _FENCE_RE.finditer(text):
        body = m.group(1)
        if re.search(r"^(---|\+\+\+|@@)", body, re.MULTILINE):
            return body, True
    first = re.search(r"^(---|@@)", text, re.MULTILINE)
    return (text[first.start() :], False) if first else ("", False)


def _clean_path(path: str) -> str | None:
    path = path.strip().split("\t")[0].strip()
    if path == "/dev/null":
        return None
    for prefix in ("a/", "b/"):
        if path.startswith(prefix):
            path = path[len(prefix) :]
            break
    while path.startswith("./"):
        path = path[2:]
    return path


def parse_patch(text: str) -> list[FilePatch]:
    """Parse a unified diff (fences and prose around it are ignored).

    Headerless hunks (only `@@` blocks) give one `FilePatch` with both paths `""`: the
    caller decides the file. Hunks that change nothing are dropped; raises `PatchError`
    when no hunk is left.
    """
    body, fenced = _extract(text)
    patches: list[FilePatch] = []
    current: FilePatch | None = None
    hunk: Hunk | None = None
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            current = FilePatch(_clean_path(line[4:]), _clean_path(lines[i + 1][4:]))
            patches.append(current)
            hunk = None
            i += 2
            continue
        if line.startswith("@@"):
            m = _HUNK_RE.match(line)
            hunk = Hunk(int(m.group(1)) if m else 0)
            if current is None:
                current = FilePatch("", "")
                patches.append(current)
            current.hunks.append(hunk)
        elif hunk is not None:
            if line.startswith(("diff --git", "index ")):
                hunk = None
            elif line.startswith("\\"):
                pass  # "\ No newline at end of file"
            elif line == "":
                hunk.lines.append(" ")  # a blank context line that lost its space
            elif line[0] in " -+":
                hunk.lines.append(line)
            elif fenced:
                hunk.lines.append(" " + line)  # a context line that lost its space
            else:
                hunk = None  # prose after an unfenced diff ends the hunk
        i += 1
    for p in patches:
        p.hunks = [h for h in p.hunks if any(line[0] in "-+" for line in h.lines)]
    patches = [p for p in patches if p.hunks]
    if not patches:
        raise PatchError("no unified-diff hunk (a line starting with @@) found in the patch")
    for p in patches:
        for h in p.hunks:
            while h.lines and h.lines[-1] == " ":  # trailing blank lines are not context
                h.lines.pop()
    return patches


def _find(haystack: list[str], needle: list[str], hint: int, *, loose: bool) -> int:
    """Start index of `needle` in `haystack` nearest to `hint`, or -1."""
    if not needle:
        return min(max(hint, 0), len(haystack))
    if loose:
        haystack = [s.rstrip() for s in haystack]
        needle = [s.rstrip() for s in needle]
    starts = [
        i for i in range(len(haystack) - len(needle) + 1) if haystack[i : i + len(needle)] == needle
    ]
    return min(starts, key=lambda i: abs(i - hint)) if starts else -1


def _apply_hunk(lines: list[str], hunk: Hunk, offset: int, max_fuzz_lines: int) -> int:
    """Apply `hunk` to `lines` in place; returns the new line offset for later hunks."""
    old = hunk.old_lines
    hint = max(hunk.old_start - 1 + offset, 0)
    for fuzz in range(max_fuzz_lines + 1):
        # Drop up to `fuzz` context lines from each end (never a removed line).
        top = 0
        while top < fuzz and top < len(hunk.lines) and hunk.lines[top][0] == " ":
            top += 1
        bottom = 0
        while (
            bottom < fuzz
            and bottom < len(hunk.lines) - top
            and hunk.lines[len(hunk.lines) - 1 - bottom][0] == " "
        ):
            bottom += 1
        body = hunk.lines[top : len(hunk.lines) - bottom]
        old_f = [line[1:] for line in body if line[0] in " -"]
        if fuzz and not old_f and old:
            break
        for loose in (False, True):
            at = _find(lines, old_f, hint + top, loose=loose)
            if at >= 0:
                # Context lines keep the file's own text (whitespace included).
                replacement, i = [], at
                for line in body:
                    if line[0] == " ":
                        replacement.append(lines[i])
                        i += 1
                    elif line[0] == "-":
                        i += 1
                    else:
                        replacement.append(line[1:])
                lines[at : at + len(old_f)] = replacement
                return offset + len(replacement) - len(old_f)
    raise PatchError(
        "hunk @@ -{} @@ does not match the file; its first lines:\n{}".format(
            hunk.old_start, "\n".join(hunk.lines[:4])
        )
    )


def _resolve(path: str | None, files: Mapping[str, str], default: str | None) -> str:
    if path is not None and path in files:
        return path
    if path:
        by_name = [p for p in files if p.rsplit("/", 1)[-1] == path.rsplit("/", 1)[-1]]
        if len(by_name) == 1:
            return by_name[0]
    if not path and default is not None:
        return default
    raise PatchError(f"the patch names {path!r}, which is not one of {sorted(files)}")


def apply_patch(
    patch: str,
    files: Mapping[str, str],
    *,
    default_path: str | None = None,
    max_fuzz_lines: int = 2,
) -> dict[str, str]:
    """Apply a unified diff to `files` (path → text); returns the changed files' new text.

    `default_path` is the file for hunks without `---`/`+++` headers. Raises `PatchError`
    when the patch has no hunk, names an unknown file, or a hunk does not match.
    """
    changed: dict[str, str] = {}
    for fp in parse_patch(patch):
        if fp.old_path is None:  # a new file
            if not fp.new_path:
                raise PatchError("a patch from /dev/null must name the new file")
            text_lines: list[str] = []
            path = fp.new_path
        else:
            path = _resolve(fp.old_path or fp.new_path, files, default_path)
            text = changed.get(path, files[path])
            text_lines = text.splitlines()
        offset = 0
        for hunk in fp.hunks:
            offset = _apply_hunk(text_lines, hunk, offset, max_fuzz_lines)
        changed[path] = "\n".join(text_lines) + "\n" if text_lines else ""
    return changed
