"""Shared test helper: a tokenizer with one token per character (its code point), so token
lists in tests read as the text they stand for; token 0 starts a message.

>>> CharTokenizer().encode("ab"), toks("ab")
([97, 98], [97, 98])
"""

from __future__ import annotations


class CharTokenizer:
    """One token per character (ord); `im_start_id` 0 is the message separator."""

    im_start_id = 0

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def toks(s: str) -> list[int]:
    """The token ids of `s` under CharTokenizer."""
    return [ord(c) for c in s]
