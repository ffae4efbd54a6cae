"""Import ChatDev 1.0 `.log` files: one session per log, one call per logged output block.

A log is a sequence of records, each starting `[<timestamp> INFO] `. Three kinds matter:

- `<User>: **[Start Chat]**` + `[<assistant system prompt>]` + the phase prompt: a new
  two-agent chat (camel `RolePlaying`) begins;
- `<Speaker>: **<A><-><B> on : <Phase>, turn <n>**` + `[<the other agent's system
  prompt>]` + the output: one call by `Speaker` (A is the chat's assistant, B its user);
- `System: **[RolePlaying]**`: a parameter table; its `model_type` names the model.

What each call received is rebuilt from camel's memory of each agent: the assistant
received `[system(A's prompt), user(phase prompt), assistant(A1), user(B1), ...]` and the
user agent `[system(B's prompt), assistant(phase prompt), user(A1), assistant(B1), ...]`
(B's prompt is the bracket of A's first output block).

An output block that repeats the block just before it (same header, same text) is the same
call logged twice (under both participants): it is dropped. An identical block later in the
log is a real call. Calls whose prompt the log does not hold (the `Prompt Engineer` task
self-improvement) and output blocks outside any chat are skipped and counted in `notes`.
Logs in the older layout (`AI Assistant (...) sys message:` records, no `[Start Chat]`)
raise `UnsupportedLayoutError`.

Roles come from the phase (`agspec.traces.roles.chatdev_phase_role`); the chat's assistant
in Coding, CodeComplete, CodeReviewModification and TestModification emits `whole_file`,
every other call `none`. Artifacts: the files of each `Codes:` block of a phase prompt,
whole (`complete=True`), at the chat's first call, again whenever their text changed.

Example: a chat with prompt `P`, assistant output `A1` and user reply `B1` gives two calls:
`Programmer` received `[system, user P]` and wrote `A1`; `Chief Technology Officer`
received `[system, assistant P, user A1]` and wrote `B1`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from agspec.traces._util import decode_text, read_bytes, session_id_of, stem
from agspec.traces.artifacts import ArtifactTracker
from agspec.traces.roles import chatdev_phase_role
from agspec.traces.schema import (
    Call,
    EmissionFormat,
    Message,
    Session,
    TraceFormatError,
    UnsupportedLayoutError,
)

__all__ = ["import_chatdev", "parse_chatdev", "parse_codes"]

SOURCE = "chatdev"
_RECORD = re.compile(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} [A-Z]+\] ", re.M)
_START = re.compile(r"([^\n:]+): \*\*\[Start Chat\]\*\*")
_PHASE_TURN = re.compile(r"(\w+), turn (\d+)")
_MODEL = re.compile(r"^\| \*\*model_type\*\* \| ModelType\.(\w+) \|", re.M)
_OLD_LAYOUT = re.compile(r"AI Assistant \([^)]*\) sys message:|PhaseType: PhaseType\.")
_CODE_PHASES = frozenset({"Coding", "CodeComplete", "CodeReviewModification", "TestModification"})
# Bounded repeats: a huge dotted token must not make the match quadratic.
_CODES_FILE = re.compile(r"([^\s`\"]{1,255}\.[A-Za-z0-9_]{1,32})[ \t]*\n```[^\n]{0,64}\n")


@dataclass
class _Chat:
    assistant_name: str
    user_name: str
    assistant_system: str
    prompt: str
    user_system: str | None = None
    turns: list[tuple[str, str]] = field(default_factory=list)  # (speaker side, text)
    first_call: bool = True


def import_chatdev(
    path: str | os.PathLike[str],
    notes: list[str] | None = None,
    *,
    drop_repeated_blocks: bool = True,
) -> Session:
    """Read one ChatDev `.log`; skipped parts are described in `notes` when given."""
    p = os.fspath(path)
    return parse_chatdev(read_bytes(p), p, notes, drop_repeated_blocks=drop_repeated_blocks)


def parse_chatdev(
    data: bytes,
    name: str = "<log>",
    notes: list[str] | None = None,
    *,
    drop_repeated_blocks: bool = True,
) -> Session:
    """Parse the bytes of a ChatDev 1.0 log; `TraceFormatError` when it is not one.

    `drop_repeated_blocks=False` keeps a block that repeats the one before it as a call.
    """
    text = decode_text(data, name).replace("\r\n", "\n")
    records = _RECORD.split(text)[1:]
    if not any(_START.match(r) for r in records):
        if _OLD_LAYOUT.search(text):
            raise UnsupportedLayoutError(
                f"{name}: older ChatDev layout ('AI Assistant (...) sys message:' records, "
                "no '**[Start Chat]**'): its prompts are not logged in full; not imported"
            )
        raise TraceFormatError(f"{name}: no '**[Start Chat]**' record: not a ChatDev 1.0 log")

    model = "unknown"
    tracker = ArtifactTracker()
    calls: list[Call] = []
    chat: _Chat | None = None
    prev_block: tuple[str, str] | None = None
    num_duplicates = num_orphans = num_unlogged = num_bare_chats = num_bare_blocks = 0
    for rec in records:
        head, _, rest = rec.partition("\n")
        if model == "unknown" and head.startswith("System: **[RolePlaying]**"):
            mm = _MODEL.search(rest)
            if mm:
                model = mm.group(1)
        ms = _START.fullmatch(head.rstrip())
        if ms:
            system, body = _bracketed(rest)
            if system is None:
                # An intermediate layout: system prompt and phase prompt are not separable.
                num_bare_chats += 1
                chat = None
                continue
            chat = _Chat("", ms.group(1), system, body)
            prev_block = None
            for path, code in parse_codes(body):
                tracker.show_full(path, code)
            continue
        parsed = _output_header(head.rstrip())
        if parsed is None:
            if head.startswith("**[Task Prompt Self Improvement]**"):
                num_unlogged += 1
            continue
        speaker, header, a_name, b_name, phase = parsed
        if chat is None:
            num_orphans += 1
            continue
        counterpart_system, output = _bracketed(rest)
        if counterpart_system is None:
            num_bare_blocks += 1
            continue
        if drop_repeated_blocks and prev_block == (header, output):
            num_duplicates += 1
            continue
        prev_block = (header, output)
        chat.assistant_name, chat.user_name = a_name, b_name
        is_assistant = speaker == a_name
        if is_assistant:
            if chat.user_system is None:
                chat.user_system = counterpart_system
            messages = [Message("system", chat.assistant_system), Message("user", chat.prompt)]
            mine, theirs = "assistant", "user"
        else:
            messages = [Message("system", chat.user_system)] if chat.user_system else []
            messages.append(Message("assistant", chat.prompt))
            mine, theirs = "user", "assistant"
        for side, said in chat.turns:
            messages.append(Message("assistant" if side == mine else "user", said))
        del theirs
        chat.turns.append((mine, output))
        calls.append(
            Call(
                agent=speaker,
                role=chatdev_phase_role(phase),
                turn=len(calls),
                messages=messages,
                output=output,
                artifacts=tracker.take(),
                emission_format=(
                    EmissionFormat.WHOLE_FILE.value
                    if is_assistant and phase in _CODE_PHASES
                    else EmissionFormat.NONE.value
                ),
                phase=phase,
            )
        )
    found: list[str] = []
    if num_duplicates:
        found.append(f"{num_duplicates} output blocks repeating the block before them, dropped")
    if num_orphans:
        found.append(f"{num_orphans} output blocks outside a readable chat, skipped")
    if num_bare_chats:
        found.append(
            f"{num_bare_chats} chats whose [Start Chat] has no bracketed system prompt "
            "(older layout), skipped"
        )
    if num_bare_blocks:
        found.append(f"{num_bare_blocks} output blocks without a system prompt, skipped")
    if num_unlogged:
        found.append(
            f"{num_unlogged} task self-improvement calls whose prompt is not logged, skipped"
        )
    if not calls:
        raise UnsupportedLayoutError(
            f"{name}: no call could be read ({'; '.join(found) or 'no output blocks'})"
        )
    if notes is not None:
        notes.extend(f"{name}: {f}" for f in found)
    task = stem(name, (".log",))
    return Session(session_id_of(SOURCE, model, task), SOURCE, model, task, calls)


def _output_header(head: str) -> tuple[str, str, str, str, str] | None:
    """`Speaker: **A<->B on : Phase, turn n**` -> (speaker, header, A, B, phase), else None.

    Parsed by hand, not by one regex: a regex with two lazy groups is quadratic on
    adversarial lines.
    """
    speaker, sep, rest = head.partition(": **")
    if not sep or not speaker or ":" in speaker or not rest.endswith("**"):
        return None
    header = rest[:-2]
    pair, sep, phase_turn = header.rpartition(" on : ")
    a_name, sep2, b_name = pair.partition("<->")
    m = _PHASE_TURN.fullmatch(phase_turn)
    if not (sep and sep2 and a_name and b_name and m):
        return None
    return speaker, header, a_name, b_name, m.group(1)


def _bracketed(rest: str) -> tuple[str | None, str]:
    """Split `\\n[<system prompt>]\\n\\n<body>` into (system prompt, body)."""
    body = rest.lstrip("\n")
    if not body.startswith("["):
        return None, rest.rstrip("\n")
    end = body.find("]\n\n")
    if end < 0:
        end = len(body) - 1 if body.rstrip("\n").endswith("]") else -1
        if end < 0:
            return None, rest.rstrip("\n")
        return body.rstrip("\n")[1:-1], ""
    return body[1:end], body[end + 3 :].rstrip("\n")


def parse_codes(prompt: str) -> list[tuple[str, str]]:
    """The files of a ChatDev `Codes:` block, as (file name, whole text).

    >>> block = '"main.py\\n```python\\nprint(1)\\n```\\n\\nb.py\\n```python\\nx = 2\\n```\\n"'
    >>> parse_codes("Codes:\\n" + block)
    [('main.py', 'print(1)\\n'), ('b.py', 'x = 2\\n')]
    """
    at = prompt.find("Codes:")
    if at < 0:
        return []
    pos = at + len("Codes:")
    files: list[tuple[str, str]] = []
    while True:
        # Between files: blank space and the opening quote of the block.
        while pos < len(prompt) and prompt[pos] in ' \t\n"':
            pos += 1
        m = _CODES_FILE.match(prompt, pos)
        if m is None:
            return files
        close = prompt.find("\n```", m.end() - 1)
        if close < 0:
            return files
        files.append((m.group(1), prompt[m.end() : close + 1]))
        pos = close + 4
