"""SuffixDecoding on arctic-inference 0.3.0: hand-computed drafts, and the engine's own
`SuffixDecodingCache` as the oracle (configured to enter responses at the end of a call)."""

from __future__ import annotations

import random

import numpy as np
import pytest

arctic = pytest.importorskip(
    "arctic_inference.suffix_decoding",
    reason="arctic-inference 0.3.0 is not installed (pip install 'agspec[suffix]'; "
    "see docs/baselines-suffix.md for the CPU-only install)",
)

from agspec.baselines.suffix import (  # noqa: E402
    SUFFIX_24,
    SUFFIX_64,
    SUFFIX_64_LOCAL,
    SuffixConfig,
    SuffixDecodingServer,
)


def _run_call(server: SuffixDecodingServer, session: str, prompt: list[int], out: list[int]):
    call = server.session(session).call("a", "code", 0)
    call.begin(prompt)
    call.accept(out)
    call.end()


def test_named_configs_carry_the_published_defaults() -> None:
    assert (SUFFIX_64.max_tree_depth, SUFFIX_24.max_tree_depth) == (64, 24)
    for cfg in (SUFFIX_64, SUFFIX_24):
        assert (cfg.max_spec_tokens, cfg.max_spec_factor, cfg.min_token_prob) == (32, 1.0, 0.1)
    assert SUFFIX_24.max_cached_requests == 10000  # vLLM's suffix_decoding_max_cached_requests
    assert SUFFIX_64_LOCAL.max_cached_requests == 0


def test_request_tree_draft_scales_with_match_length() -> None:
    # "1 2 3" matches (3 tokens, factor 1.0 -> 3 tokens); each step below has one
    # continuation in the tree, so probabilities stay 1 after the first branch.
    call = SuffixDecodingServer(SUFFIX_64).session("s").call("a", "code", 0)
    call.begin([1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3])
    assert call.propose(8) == [4, 5, 6]
    assert (call.last_match_length, call.last_source) == (3, "request")
    assert call.propose(2) == [4, 5]
    call.accept([4, 5, 6, 7, 9])  # model wrote 9 after 7: "9" never occurred
    assert call.propose(8) == []
    assert call.last_match_length is None


def test_whole_short_request_can_match() -> None:
    # The engine tries match lengths up to len(context) - 1 only: context [2, 3] alone
    # would match just "3" (factor 1.0 -> 1 token); the leading sentinel lets "2 3" match.
    server = SuffixDecodingServer(SUFFIX_64, global_docs=[[2, 3, 4, 5, 6]])
    call = server.session("s").call("a", "code", 0)
    call.begin([2, 3])
    assert call.propose(8) == [4, 5]
    assert call.last_match_length == 2


def test_min_token_prob_cuts_the_draft() -> None:
    # After "1 2" come 3 (x2) and 4, 5, 6, 7, 8, 9, 10, 11 (x1 each): 3 has prob 2/10 >= 0.1
    prompt: list[int] = []
    for nxt in [3, 3, 4, 5, 6, 7, 8, 9, 10, 11]:
        prompt += [1, 2, nxt, 0]
    prompt += [1, 2]
    call = SuffixDecodingServer(SUFFIX_64_LOCAL).session("s").call("a", "code", 0)
    call.begin(prompt)
    draft = call.propose(8)
    assert draft[:1] == [3]
    strict = SuffixConfig(name="strict", min_token_prob=0.25, max_cached_requests=0)
    call = SuffixDecodingServer(strict).session("s").call("a", "code", 0)
    call.begin(prompt)
    assert call.propose(8) == []  # 2/11 < 0.25 for every match length


def test_global_tree_gets_a_response_only_when_its_call_ends() -> None:
    server = SuffixDecodingServer(SUFFIX_64)
    first = server.session("s1").call("a", "code", 0)
    first.begin([100, 101])
    first.accept([7, 8, 9, 10, 11])
    other = server.session("s2").call("a", "code", 0)
    other.begin([50, 7, 8])
    assert other.propose(8) == []  # s1's response is still in flight
    first.end()
    assert server.num_cached_responses == 1
    assert other.propose(8) == [9, 10]  # "7 8" matched in the global tree: 2 tokens
    assert other.last_source == "global"


def test_request_tree_wins_score_ties() -> None:
    server = SuffixDecodingServer(SUFFIX_64)
    _run_call(server, "s1", [0], [7, 8, 1, 7, 8])
    call = server.session("s2").call("a", "code", 0)
    # "7 8" occurs twice in each tree, once followed by a token: request 2, global 1,
    # each with probability 1/2, so the same score
    call.begin([7, 8, 2, 9, 7, 8])
    assert call.propose(1) == [2]
    assert call.last_source == "request"


def test_fifo_eviction_and_disabled_global_tree() -> None:
    server = SuffixDecodingServer(SuffixConfig(name="fifo", max_cached_requests=2))
    for i, out in enumerate([[10, 11, 12], [20, 21, 22], [30, 31, 32]]):
        _run_call(server, f"s{i}", [0], out)
    assert server.num_cached_responses == 2
    call = server.session("q").call("a", "code", 0)
    call.begin([5, 10, 11])  # the oldest response was evicted
    assert call.propose(4) == []
    call = server.session("r").call("a", "code", 0)
    call.begin([5, 20, 21])
    assert call.propose(4) == [22]
    local_only = SuffixDecodingServer(SUFFIX_64_LOCAL)
    _run_call(local_only, "s", [0], [10, 11, 12])
    assert local_only.num_cached_responses == 0


def test_global_docs_seed_the_global_tree() -> None:
    server = SuffixDecodingServer(SUFFIX_24, global_docs=[[1, 2, 3, 4, 5]])
    call = server.session("s").call("a", "code", 0)
    call.begin([9, 2, 3])
    assert call.propose(8) == [4, 5]


def test_bad_config_and_inputs_raise() -> None:
    with pytest.raises(ValueError):
        SuffixConfig(name="x", max_tree_depth=1)
    with pytest.raises(ValueError):
        SuffixConfig(name="x", max_cached_requests=-2)
    call = SuffixDecodingServer(SUFFIX_64).session("s").call("a", "code", 0)
    with pytest.raises(ValueError, match="token ids"):
        call.begin([1, -1])


# -- the engine's own cache as the oracle ------------------------------------------------


@pytest.mark.parametrize("config", [SUFFIX_64, SUFFIX_24, SUFFIX_64_LOCAL], ids=lambda c: c.name)
@pytest.mark.parametrize("seed", range(6))
def test_drafts_equal_suffix_decoding_cache(config: SuffixConfig, seed: int) -> None:
    """Same drafts as `SuffixDecodingCache.speculate` step by step, over a run of calls.

    The oracle cache drops each call's own slot in the global tree right after
    `start_request` (so `add_active_response` feeds only the request tree) and caches the
    response as a separate finished request when the call ends: our end-of-call rule.
    Prompts are longer than the tree depth, where the sentinel makes no difference.
    """
    rng = random.Random(seed)
    vocab = 6
    oracle_limit = -1 if config.max_cached_requests != 0 else 0
    cache = arctic.SuffixDecodingCache(config.max_tree_depth, max_cached_requests=oracle_limit)
    server = SuffixDecodingServer(config)
    phrases = [[rng.randrange(vocab) for _ in range(rng.randrange(3, 12))] for _ in range(6)]
    for call_no in range(5):
        prompt = [t for _ in range(rng.randrange(8, 16)) for t in rng.choice(phrases)]
        while len(prompt) <= config.max_tree_depth + 1:
            prompt += rng.choice(phrases)
        output = [t for _ in range(rng.randrange(3, 8)) for t in rng.choice(phrases)]
        output += [rng.randrange(vocab) for _ in range(5)]  # some surprises
        cache.start_request(call_no, prompt)
        if oracle_limit != 0:
            cache.evict_cached_response(call_no)
        call = server.session(f"s{call_no}").call("a", "code", 0)
        call.begin(prompt)
        context, pos = list(prompt), 0
        while pos < len(output):
            k = rng.choice([4, 16, 32])
            expected = cache.speculate(
                call_no,
                np.asarray(context, dtype=np.int32),
                max_spec_tokens=min(k, config.max_spec_tokens),
                max_spec_factor=config.max_spec_factor,
                min_token_prob=config.min_token_prob,
            ).token_ids
            draft = call.propose(k)
            assert draft == list(expected)
            accepted = 0
            while accepted < len(draft) and pos + accepted < len(output):
                if draft[accepted] != output[pos + accepted]:
                    break
                accepted += 1
            committed = output[pos : pos + accepted + 1]
            call.accept(committed)
            cache.add_active_response(call_no, committed)
            context += committed
            pos += len(committed)
        call.end()
        cache.stop_request(call_no)
        if oracle_limit != 0:
            key = ("response", call_no)
            cache.start_request(key, [])
            cache.add_active_response(key, output)
            cache.stop_request(key)
