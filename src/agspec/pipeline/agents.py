"""The agents' prompts and the parsing of their replies.

Two LLM agents, each with its own system prompt:

- **localizer** (role `localize`, emission `none`): call 1 sees the issue and the file
  list and answers `READ <path>` lines; call 2 sees those files and answers
  `EDIT <path>` lines, the file(s) to change.
- **coder** (role `code`, emission `unified_diff`): sees the issue and the files to change
  and answers one unified diff; each retry sees its previous patch (its own last message)
  and the executor's observation (a `user` message) and writes a new patch against the
  original files.

The executor (`agspec.pipeline.executor`) is not an LLM call.

>>> parse_paths("READ pages.py\\nREAD links.py", ["links.py", "pages.py", "test_pages.py"])
['pages.py', 'links.py']
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from agspec.traces.schema import Message

__all__ = [
    "LOCALIZER",
    "CODER",
    "LOCALIZER_SYSTEM",
    "CODER_SYSTEM",
    "parse_paths",
    "localizer_read_messages",
    "localizer_edit_message",
    "coder_messages",
    "coder_retry_message",
    "show_files",
]

LOCALIZER = "localizer"
CODER = "coder"

LOCALIZER_SYSTEM = (
    "You are the localizer in a team of coding agents. You read a bug report and a small "
    "Python repository and find the file that must change to fix the bug. Answer only with "
    "the requested lines, no explanation."
)

CODER_SYSTEM = (
    "You are the coder in a team of coding agents. You fix a bug by writing a patch: one "
    "unified diff in a ```diff block that applies to the files exactly as shown. It starts "
    "with the lines `--- a/<path>` and `+++ b/<path>` for the file you change, then one "
    "`@@ -<line>,<count> +<line>,<count> @@` line per hunk, then the hunk: unchanged lines "
    "copied from the file with a space in front, each line you remove with `-` in front, "
    "each line you add with `+` in front. Change only the lines that must change. No "
    "explanation."
)


def show_files(files: Mapping[str, str], paths: Sequence[str]) -> str:
    """The files as the agents see them: a header and a fenced block each."""
    parts = []
    for path in paths:
        parts.append(f"### {path}\n```python\n{files[path].rstrip()}\n```")
    return "\n\n".join(parts)


def localizer_read_messages(issue: str, paths: Sequence[str]) -> list[Message]:
    """Call 1 of the localizer: the issue and the file list."""
    listing = "\n".join(paths)
    return [
        Message("system", LOCALIZER_SYSTEM),
        Message(
            "user",
            f"Bug report:\n{issue}\n\nFiles in the repository:\n{listing}\n\n"
            "Which files do you want to read? Answer with one line `READ <path>` per file.",
        ),
    ]


def localizer_edit_message(files: Mapping[str, str], paths: Sequence[str]) -> Message:
    """Call 2 of the localizer: the files it asked for (a tool observation)."""
    return Message(
        "user",
        f"{show_files(files, paths)}\n\nWhich file must change to fix the bug? Answer with "
        "one line `EDIT <path>`; name a second file only if it must change too.",
    )


def coder_messages(issue: str, files: Mapping[str, str], paths: Sequence[str]) -> list[Message]:
    """The coder's first call: the issue and the files to patch."""
    return [
        Message("system", CODER_SYSTEM),
        Message(
            "user",
            f"Bug report:\n{issue}\n\nFiles to change:\n\n{show_files(files, paths)}\n\n"
            "Write the patch.",
        ),
    ]


def coder_retry_message(observation: str) -> Message:
    """What the coder sees after the executor ran its patch."""
    return Message(
        "user",
        f"Executor: {observation}\n\nWrite a corrected patch against the original files "
        "shown above.",
    )


def parse_paths(text: str, known: Sequence[str]) -> list[str]:
    """Known paths named in `text`, in order of first mention (by path or file name)."""
    found: list[tuple[int, str]] = []
    for path in known:
        name = path.rsplit("/", 1)[-1]
        pattern = r"(?<![\w./-])(?:" + re.escape(path) + "|" + re.escape(name) + r")(?![\w/-])"
        m = re.search(pattern, text)
        if m:
            found.append((m.start(), path))
    return [p for _, p in sorted(found)]
