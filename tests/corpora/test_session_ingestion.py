"""Incremental prompt ingestion (issue 11 item 3): a prompt that extends an earlier one, or
comes with `known_tokens`, adds exactly what a from-scratch split of the whole prompt
adds, without re-hashing the messages before it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agspec.corpora import SessionCorpus

SEP = 0


def reference_documents(prompts: list[list[int]]) -> list[list[int]]:
    """The session documents a whole-prompt split gives: each message (split before every
    separator) enters the first time it is seen, by its tokens."""
    seen: set[tuple[int, ...]] = set()
    docs = []
    for toks in prompts:
        starts = [0] + [i for i in range(1, len(toks)) if toks[i] == SEP]
        doc: list[int] = []
        for a, b in zip(starts, [*starts[1:], len(toks)]):
            part = tuple(toks[a:b])
            if part and part not in seen:
                seen.add(part)
                doc.extend(part)
        docs.append(doc)
    return docs


def documents(corpus: SessionCorpus, num_docs: int) -> list[list[int]]:
    return [corpus.index.document(i) if i in corpus.index else [] for i in range(num_docs)]


message = st.lists(st.integers(1, 4), min_size=0, max_size=4).map(lambda m: [SEP, *m])


@st.composite
def agent_sessions(draw):
    """Prompts of one session as agents send them: each extends an earlier prompt (its
    answer, then new messages) or starts over (another agent's system prompt); some
    carry a leading fragment without a separator."""
    prompts: list[list[int]] = []
    for _ in range(draw(st.integers(1, 7))):
        if prompts and draw(st.booleans()):
            base = draw(st.sampled_from(prompts))
            answer = draw(st.lists(st.integers(1, 4), max_size=4))
        else:
            base = draw(st.lists(st.integers(1, 4), max_size=2))  # text before any separator
            answer = []
        new = [t for m in draw(st.lists(message, max_size=4)) for t in m]
        prompts.append([*base, *answer, *new])
    return prompts


@settings(max_examples=150, deadline=None)
@given(agent_sessions())
def test_incremental_ingestion_equals_a_whole_prompt_split(prompts):
    corpus = SessionCorpus(separator_id=SEP)
    added = [corpus.add_prompt(i, p) for i, p in enumerate(prompts)]
    expected = reference_documents(prompts)
    assert documents(corpus, len(prompts)) == expected
    assert added == [len(d) for d in expected]


@settings(max_examples=150, deadline=None)
@given(agent_sessions(), st.data())
def test_known_tokens_at_a_message_boundary_change_nothing(prompts, data):
    """Vouching for a prefix that ends where a message of an earlier prompt ended (the
    resolver's boundary) gives the same documents as finding it out."""
    corpus = SessionCorpus(separator_id=SEP)
    for i, p in enumerate(prompts):
        known = 0
        earlier = [q for q in prompts[:i] if len(q) <= len(p) and p[: len(q)] == q]
        if earlier:
            q = data.draw(st.sampled_from(earlier))
            # Only a prefix that ends at a message end of q (a separator follows in p, or
            # p ends there) is a boundary of whole messages.
            if len(q) == len(p) or p[len(q)] == SEP:
                known = len(q)
        corpus.add_prompt(i, p, known_tokens=known)
    assert documents(corpus, len(prompts)) == reference_documents(prompts)


def test_known_tokens_index_the_rest_of_their_message_then_new_messages():
    corpus = SessionCorpus(separator_id=SEP)
    assert corpus.add_prompt(1, [SEP, 5, 6, SEP, 7]) == 5
    # "7" was the start of the answer; the session saw [0 5 6 0 7 8] (prompt + answer).
    assert corpus.add_prompt(2, [SEP, 5, 6, SEP, 7, 8, 9, SEP, 5, 6, SEP, 3], known_tokens=6) == 3
    assert corpus.index.document(2) == [9, SEP, 3]  # the tail "9", "0 5 6" seen, "0 3" new
    assert corpus.add_prompt(3, [SEP, 1], known_tokens=2) == 0
    assert 3 not in corpus.index


def test_known_tokens_are_checked():
    corpus = SessionCorpus(separator_id=SEP)
    with pytest.raises(ValueError, match="known_tokens"):
        corpus.add_prompt(0, [SEP, 1], known_tokens=3)
    with pytest.raises(ValueError, match="known_tokens"):
        corpus.add_prompt(0, [SEP, 1], known_tokens=-1)
    with pytest.raises(TypeError, match="known_tokens"):
        corpus.add_prompt(0, [SEP, 1], known_tokens=True)  # type: ignore[arg-type]


def test_a_refused_prompt_leaves_no_trace():
    corpus = SessionCorpus(separator_id=SEP)
    corpus.add_prompt(0, [SEP, 1, 2])
    with pytest.raises((ValueError, TypeError)):
        corpus.add_prompt(1, [SEP, 1, 2, SEP, -5])
    # The refused prompt is not remembered: the same messages still count as new.
    assert corpus.add_prompt(2, [SEP, 1, 2, SEP, 5]) == 2
    assert corpus.num_tokens == 5


def test_the_callers_list_may_change_afterwards():
    corpus = SessionCorpus(separator_id=SEP)
    prompt = [SEP, 1, 2, SEP, 3]
    corpus.add_prompt(0, prompt)
    prompt[1] = 4  # the caller reuses its list
    assert corpus.add_prompt(1, [*prompt, SEP, 9]) == 5  # "0 4 2" and "0 9" are new
