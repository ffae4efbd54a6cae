"""Corpora: what goes in, once, in which forms (hand-computed and property tests)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agspec.corpora import GlobalCorpus, SessionCorpus, WorkspaceCorpus, split_messages
from agspec.corpora.forms import emission_forms, known_formats


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


messages = st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=6), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(st.lists(messages, min_size=1, max_size=5))
def test_session_corpus_indexes_each_message_once(prompts):
    corpus = SessionCorpus(separator_id=0)
    seen: set[tuple[int, ...]] = set()
    expected_total = 0
    for i, msgs in enumerate(prompts):
        prompt = [t for m in msgs for t in [0, *m]]
        new = {tuple([0, *m]) for m in msgs} - seen
        # A message repeated inside one prompt is also new only once.
        added = corpus.add_prompt(i, prompt)
        expected = sum(len(m) for m in new)
        assert added == expected
        seen |= new
        expected_total += expected
    assert corpus.num_tokens == expected_total


def test_split_messages_keeps_every_token():
    import numpy as np

    toks = np.array([7, 0, 1, 2, 0, 3], dtype=np.int32)
    parts = split_messages(toks, 0)
    assert [p.tolist() for p in parts] == [[7], [0, 1, 2], [0, 3]]
    assert [p.tolist() for p in split_messages(toks, None)] == [toks.tolist()]


def test_workspace_indexes_new_views_only_once():
    ws = WorkspaceCorpus(chars, "none")
    view1 = "def f():\n    return 1\n"
    assert ws.open_artifact("a.py", view1) == len(view1)
    assert ws.open_artifact("a.py", view1) == 0  # reused, not reindexed
    view2 = view1 + "\ndef g():\n    return 2\n"
    # Only the new run is indexed: the blank line joins it, the seen lines do not.
    assert ws.open_artifact("a.py", view2) == len("\ndef g():\n    return 2\n")
    assert ws.paths == ["a.py"]


def test_workspace_adds_emission_forms():
    ws = WorkspaceCorpus(chars, "unified_diff")
    text = "x = 1\ny = 2\n"
    assert ws.open_artifact("a.py", text) == 3 * len(text) + 2 * 2  # raw, " ", "-" forms
    ws_plain = WorkspaceCorpus(chars, "unified_diff", with_emission_forms=False)
    assert ws_plain.open_artifact("a.py", text) == len(text)


@given(st.text(max_size=200), st.sampled_from(known_formats()))
def test_emission_forms_start_with_the_raw_text(text, fmt):
    forms = emission_forms(text, fmt)
    assert forms[0] == text
    assert len(set(forms)) == len(forms)


def test_unknown_emission_format_is_a_clear_error():
    import pytest

    with pytest.raises(ValueError, match="unknown emission format"):
        WorkspaceCorpus(chars, "telepathy")


def test_global_corpus_round_trip(tmp_path):
    g = GlobalCorpus.build([[1, 2, 3, 4], [], [5, 6]])
    assert g.index.frozen  # read-only once built, as a loaded one is
    path = tmp_path / "g.agidx"
    g.save(path)
    loaded = GlobalCorpus.load(path)
    assert loaded.num_tokens == 6
    cur = loaded.cursor(8)
    cur.extend([2, 3])
    assert cur.continuation(4) == [4]
