"""The native message split (`_native.message_keys`) against a plain Python split."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agspec import _native


def oracle(toks: list[int], sep: int, known: int) -> tuple[int, list[list[int]]]:
    """(first, messages): the messages of toks[first:], split before each separator."""
    n = len(toks)
    first = 0
    if known:
        first = next((i for i in range(known, n) if sep >= 0 and toks[i] == sep), n)
    cuts = [first] + [i for i in range(first + 1, n) if sep >= 0 and toks[i] == sep] + [n]
    return first, [toks[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]


@settings(max_examples=300, deadline=None)
@given(
    toks=st.lists(st.integers(0, 4), max_size=40),
    sep=st.sampled_from([-1, 0, 3]),
    data=st.data(),
)
def test_message_keys_split_as_python_does(toks, sep, data):
    known = data.draw(st.integers(0, len(toks)))
    first, starts, keys = _native.message_keys(toks, sep, known)
    want_first, messages = oracle(toks, sep, known)
    assert first == want_first
    ends = [*starts[1:], len(toks)]
    assert [toks[a:b] for a, b in zip(starts, ends)] == messages
    # Equal messages get equal keys, different ones (almost surely) different keys.
    for i, m in enumerate(messages):
        for j, other in enumerate(messages):
            assert (keys[i] == keys[j]) == (m == other)


def test_message_keys_tell_length_and_order_apart():
    keys = {
        _native.message_keys(t, -1, 0)[2][0]
        for t in ([1], [1, 0], [0, 1], [1, 1], [1, 1, 1], [2**31 - 1], [0])
    }
    assert len(keys) == 7
    assert _native.message_keys([], 0, 0) == (0, [], [])
