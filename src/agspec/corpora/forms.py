"""Emission forms: the copies of an artifact the agent would emit, by scaffold format.

A coder that patches a file with a unified diff writes each kept line as " line" and each
removed line as "-line"; one that writes whole files through a JSON tool call escapes
newlines, quotes and backslashes. The workspace corpus indexes these forms next to the
raw text, so a copied line matches what the agent writes.

Adding a scaffold format is one small function and one line in `EMISSION_FORMS`:

    def _my_format(text: str) -> list[str]:
        return [text.upper()]

    EMISSION_FORMS.register("my_format", _my_format, help="...")

Example:
    >>> emission_forms("a\\nb\\n", "unified_diff")
    ['a\\nb\\n', ' a\\n b\\n', '-a\\n-b\\n']
"""

from __future__ import annotations

import json
from collections.abc import Callable

from agspec._registry import Registry

# The extra forms (besides the raw text) of one emission format.
FormFn = Callable[[str], list[str]]


def prefix_lines(text: str, prefix: str) -> str:
    """Prefixes every line (keeping line ends): `prefix_lines("a\\nb", "-") == "-a\\n-b"`."""
    return "".join(prefix + line for line in text.splitlines(keepends=True))


def _unified_diff(text: str) -> list[str]:
    return [prefix_lines(text, " "), prefix_lines(text, "-")]


def _whole_file_json(text: str) -> list[str]:
    # The file as a JSON string literal carries it, without the surrounding quotes.
    return [json.dumps(text, ensure_ascii=False)[1:-1]]


def _raw_only(text: str) -> list[str]:
    return []


EMISSION_FORMS: Registry[FormFn] = Registry("emission format")
EMISSION_FORMS.register("unified_diff", _unified_diff, help="kept ' line' and removed '-line'")
EMISSION_FORMS.register(
    "whole_file_json", _whole_file_json, help="the file as a JSON string literal's body"
)
# Formats whose emitted lines equal the file's lines: the raw text is the emitted form.
for _name in ("whole_file", "search_replace", "line_edit", "bash", "none"):
    EMISSION_FORMS.register(_name, _raw_only, help="the raw text only")


def known_formats() -> list[str]:
    return sorted(EMISSION_FORMS)


def emission_forms(text: str, emission_format: str, *, include_raw: bool = True) -> list[str]:
    """The raw text (first, unless `include_raw=False`) and the format's extra forms."""
    if not isinstance(text, str):
        raise TypeError(f"artifact text must be str, got {type(text).__name__}")
    extra = EMISSION_FORMS.get(emission_format)
    forms = [text] if include_raw else []
    for form in extra(text):
        if form != text and form not in forms:
            forms.append(form)
    return forms
