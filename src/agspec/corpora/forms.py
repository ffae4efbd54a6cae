"""Emission forms: the copies of an artifact the agent would emit, by scaffold format.

A coder that patches a file with a unified diff writes each kept line as " line" and each
removed line as "-line"; one that writes whole files through a JSON tool call escapes
newlines, quotes and backslashes. The workspace corpus indexes these forms next to the
raw text, so a copied line matches what the agent writes.

Adding a scaffold format is one small function:

    @register("my_format")
    def _my_format(text: str) -> list[str]:
        return [text.upper()]

Example:
    >>> emission_forms("a\\nb\\n", "unified_diff")
    ['a\\nb\\n', ' a\\n b\\n', '-a\\n-b\\n']
"""

from __future__ import annotations

import json
from collections.abc import Callable

FormFn = Callable[[str], list[str]]
_REGISTRY: dict[str, FormFn] = {}


def register(name: str) -> Callable[[FormFn], FormFn]:
    """Registers the extra forms (besides the raw text) for an emission format."""

    def deco(fn: FormFn) -> FormFn:
        if name in _REGISTRY:
            raise ValueError(f"emission format {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return deco


def prefix_lines(text: str, prefix: str) -> str:
    """Prefixes every line (keeping line ends): `prefix_lines("a\\nb", "-") == "-a\\n-b"`."""
    return "".join(prefix + line for line in text.splitlines(keepends=True))


@register("unified_diff")
def _unified_diff(text: str) -> list[str]:
    return [prefix_lines(text, " "), prefix_lines(text, "-")]


@register("whole_file_json")
def _whole_file_json(text: str) -> list[str]:
    # The file as a JSON string literal carries it, without the surrounding quotes.
    return [json.dumps(text, ensure_ascii=False)[1:-1]]


# Formats whose emitted lines equal the file's lines: the raw text is the emitted form.
for _name in ("whole_file", "search_replace", "line_edit", "bash", "none"):
    register(_name)(lambda text: [])


def known_formats() -> list[str]:
    return sorted(_REGISTRY)


def emission_forms(text: str, emission_format: str, *, include_raw: bool = True) -> list[str]:
    """The raw text (first, unless `include_raw=False`) and the format's extra forms."""
    if not isinstance(text, str):
        raise TypeError(f"artifact text must be str, got {type(text).__name__}")
    try:
        extra = _REGISTRY[emission_format]
    except KeyError:
        raise ValueError(
            f"unknown emission format {emission_format!r}; known: {', '.join(known_formats())}"
        ) from None
    forms = [text] if include_raw else []
    for form in extra(text):
        if form != text and form not in forms:
            forms.append(form)
    return forms
