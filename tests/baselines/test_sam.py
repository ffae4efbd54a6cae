"""SAM-Decoding (request automaton + static automaton, len_bias 5) against hand-computed
drafts and a brute-force SAM (earliest occurrence, biased choice, fixed/scaled length)."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("agspec._native", reason="native index not built (pip install -e .)")

from agspec.baselines.sam import SAM_FIXED, SAM_SCALED, SamConfig, SamServer  # noqa: E402


def _call(config: SamConfig, docs: list[list[int]], prompt: list[int]):
    call = SamServer(config, global_docs=docs).session("s").call("coder", "code", 0)
    call.begin(prompt)
    return call


def test_published_defaults() -> None:
    assert (SAM_FIXED.n_predicts, SAM_FIXED.len_bias, SAM_FIXED.len_threshold) == (40, 5, 5)
    assert (SAM_SCALED.max_predicts, SAM_SCALED.alpha, SAM_SCALED.len_bias) == (60, 4.0, 5)
    # n_predicts counts the start token (the one the model just produced): 39 drafted.
    assert SAM_FIXED.draft_tokens(7) == 39
    # min(max_predicts, 1 + int(match * alpha)) - 1
    assert [SAM_SCALED.draft_tokens(m) for m in (1, 2, 14, 15, 100)] == [4, 8, 56, 59, 59]


def test_request_match_copies_from_the_earliest_occurrence() -> None:
    # "1 2 3 4 5" occurs at 0 (-> 6) and at 6 (-> 8); the earliest one wins.
    prompt = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 8, 1, 2, 3, 4, 5]
    call = _call(SAM_FIXED, [], prompt)
    assert call.propose(3) == [6, 1, 2]
    assert (call.last_match_length, call.last_source) == (5, "request")


def test_fixed_length_draft_is_39_tokens() -> None:
    prompt = [1, 2, 3, 4, 5] + list(range(10, 60)) + [1, 2, 3, 4, 5]
    call = _call(SAM_FIXED, [], prompt)
    assert call.propose(64) == list(range(10, 49))


def test_below_threshold_fixed_drafts_nothing_scaled_drafts_4x() -> None:
    prompt = [1, 2, 3, 4, 9, 9, 9, 9, 9, 9, 7, 1, 2, 3, 4]  # request match of 4 tokens
    assert _call(SAM_FIXED, [], prompt).propose(64) == []
    # scaled: min(59, int(4 * 4)) = 16 tokens, but only 11 follow the occurrence
    assert _call(SAM_SCALED, [], prompt).propose(64) == prompt[4:]
    assert _call(SAM_SCALED, [], prompt).propose(3) == [9, 9, 9]


def test_static_wins_only_when_longer_by_more_than_len_bias() -> None:
    # request match "1 2 3 4 5" (5 tokens, continues with 40);
    # static docs match 10 tokens (-> 77) or 11 tokens (-> 88).
    tail = [20, 21, 22, 23, 24, 1, 2, 3, 4, 5]  # the prompt ends with these 10 tokens
    prompt_head = [1, 2, 3, 4, 5, 40, 41, 42]
    prompt = prompt_head + tail
    ten = _call(SAM_FIXED, [[99, *tail, 77, 78]], prompt)  # 10 - 5 = 5 >= 5: request wins
    assert ten.propose(2) == [40, 41]
    assert ten.last_source == "request"
    eleven = _call(SAM_FIXED, [[42, *tail, 88, 89]], prompt)  # 11 - 5 = 6 > 5: static
    assert eleven.propose(2) == [88, 89]
    assert (eleven.last_match_length, eleven.last_source) == (11, "global")


def test_static_match_alone_needs_threshold_plus_bias() -> None:
    doc = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    assert _call(SAM_FIXED, [doc], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]).propose(5) == []  # 9-5 < 5
    call = _call(SAM_FIXED, [doc], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # 10 - 5 = 5
    assert call.propose(5) == [11, 12]


def test_scaled_static_uses_the_biased_match_and_most_frequent_path() -> None:
    tail = list(range(20, 27))  # 7-token static match -> biased 2 -> int(4 * 2) = 8 tokens
    docs = [[*tail, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [*tail, 5, 5], [*tail, 5, 6]]
    call = _call(SAM_SCALED, docs, [99, *tail])
    # first tokens: 1 once, 5 twice -> 5; then 5 and 6 tie -> 6 (the more recent row)
    assert call.propose(64) == [5, 6]
    first = _call(SamConfig(name="x", length_rule="scaled", len_threshold=1), docs, [99, *tail])
    assert first.propose(64) == [1, 2, 3, 4, 5, 6, 7, 8]  # rule="first": earliest occurrence


def test_accept_grows_the_request_automaton() -> None:
    call = _call(SAM_SCALED, [], [5, 6, 7])
    assert call.propose(4) == []
    call.accept([5, 6])  # now "5 6" occurred before, followed by 7 5 6
    assert call.propose(8) == [7, 5, 6]
    call.end()


def test_bad_config_raises() -> None:
    with pytest.raises(ValueError):
        SamConfig(name="x", length_rule="linear")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SamConfig(name="x", length_rule="fixed", n_predicts=1)


# -- brute-force oracle ------------------------------------------------------------------


def _longest(docs: list[list[int]], context: list[int]) -> tuple[int, list[tuple[int, int]]]:
    for span in range(len(context), 0, -1):
        occ = [
            (d, i + span - 1)
            for d, doc in enumerate(docs)
            for i in range(len(doc) - span)
            if doc[i : i + span] == context[-span:]
        ]
        if occ:
            return span, occ
    return 0, []


def _frequent(rows: list[list[int]]) -> list[int]:
    path: list[int] = []
    while True:
        depth = len(path)
        live = [r for r in rows if len(r) > depth and r[:depth] == path]
        if not live:
            return path
        counts: dict[int, int] = {}
        for r in live:
            counts[r[depth]] = counts.get(r[depth], 0) + 1
        best = max(counts.values())
        path.append(next(r[depth] for r in live if counts[r[depth]] == best))


def _sam_oracle(cfg: SamConfig, docs: list[list[int]], context: list[int], k: int) -> list[int]:
    m_dyn, occ_dyn = _longest([context], context)
    m_static, occ_static = _longest(docs, context)
    m_static -= cfg.len_bias
    if m_dyn >= m_static:
        if m_dyn < cfg.len_threshold or m_dyn == 0:
            return []
        n = min(k, cfg.draft_tokens(m_dyn))
        e = min(occ_dyn)[1]
        return context[e + 1 : e + 1 + n]
    if m_static < cfg.len_threshold:
        return []
    n = min(k, cfg.draft_tokens(m_static))
    if cfg.static_rule == "first":
        d, e = min(occ_static)
        return docs[d][e + 1 : e + 1 + n]
    return _frequent([docs[d][e + 1 : e + 1 + n] for d, e in sorted(occ_static, reverse=True)])


@pytest.mark.parametrize("config", [SAM_FIXED, SAM_SCALED], ids=lambda c: c.name)
@pytest.mark.parametrize("seed", range(30))
def test_matches_brute_force_sam(config: SamConfig, seed: int) -> None:
    rng = random.Random(seed)
    vocab = rng.choice([2, 3, 4])
    # small vocabularies give long matches in both automata; len_bias 1 or 5 varies the winner
    cfg = SamConfig(
        name=config.name,
        length_rule=config.length_rule,
        len_bias=rng.choice([1, 5]),
        len_threshold=config.len_threshold,
        static_rule=config.static_rule,
        n_predicts=rng.choice([4, 40]),
    )
    docs = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 50))] for _ in range(3)]
    context = [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
    call = SamServer(cfg, global_docs=docs).session("s").call("a", "code", 0)
    call.begin(context)
    for _ in range(5):
        k = rng.randrange(1, 30)
        assert call.propose(k) == _sam_oracle(cfg, docs, context, k)
        step = [rng.randrange(vocab) for _ in range(rng.randrange(1, 5))]
        call.accept(step)
        context += step
