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
