"""Text from outside: the one rule for lone surrogates, everywhere AgSpec reads text.

JSON may spell a UTF-16 surrogate on its own (`"a\\ud800b"`): it parses into a Python
`str` that holds no real character and cannot be encoded as UTF-8, so a tokenizer, a file
write or an HTTP header fails on it far from where it came in. AgSpec refuses such text
where it enters, with a message that names the field and the position, and never replaces
it silently (a replacement would make the model see text the client did not send):

- `agspec serve`: a 400 whose `param` is the field (`messages[0].content`);
- trace files: `agspec traces check` reports `file:line: field: ...`, and every reader
  (`read_sessions`, `traces stats`, `replay`) refuses the same line with the same message.

A surrogate *pair* (`"\\ud83d\\ude00"`) is one real character and is accepted.

>>> lone_surrogate("a\\ud800b")
1
>>> lone_surrogate("ok \\U0001f600") is None
True
>>> find_lone_surrogate({"messages": [{"content": "x"}, {"content": "\\udc00"}]})
('messages[1].content', 0)
"""

from __future__ import annotations

from typing import Any

__all__ = ["lone_surrogate", "find_lone_surrogate", "surrogate_message"]


def lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in `text`, or None when it encodes as UTF-8."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def find_lone_surrogate(value: Any, path: str = "") -> tuple[str, int] | None:
    """`(field path, index)` of the first string (or object key) in a parsed JSON value
    that holds a lone surrogate; None when there is none. Paths read `a.b[2].c`; a bad
    object key is reported as the path of that key."""
    # Iterative, so that a deeply nested body cannot exhaust the stack.
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, str):
            pos = lone_surrogate(v)
            if pos is not None:
                return where or "<body>", pos
        elif isinstance(v, dict):
            items = list(v.items())
            for k, child in reversed(items):
                key = str(k)
                pos = lone_surrogate(key)
                if pos is not None:
                    return _join(where, key.encode("utf-8", "backslashreplace").decode()), pos
                stack.append((_join(where, key), child))
        elif isinstance(v, list):
            for i in range(len(v) - 1, -1, -1):
                stack.append((f"{where}[{i}]", v[i]))
    return None


def surrogate_message(text_pos: int) -> str:
    """The refusal's wording, shared by the server and the trace readers."""
    return (
        f"holds a lone UTF-16 surrogate at character {text_pos} (an escape such as \\ud800 "
        "without its pair); text must be valid Unicode"
    )
