"""`suffix-cache` (arctic-inference's SuffixDecodingCache driven as vLLM's proposer drives
it) against `suffix-64` (the lab's drive of the bare trees): a cross-check of the lab's
SuffixDecoding, on hand-made sessions."""

from __future__ import annotations

import random

import pytest

pytest.importorskip(
    "arctic_inference.suffix_decoding", reason="arctic-inference 0.3.0 is not installed"
)

from agspec.baselines.registry import make_family  # noqa: E402
from agspec.baselines.suffix_cache import SuffixCacheServer  # noqa: E402
from agspec.lab.records import ReplayCall, ReplaySession  # noqa: E402
from agspec.lab.simulator import replay_batched  # noqa: E402


class Flat:
    def step_cost(self, n_tokens: int, batch_size: int) -> float:
        return 1.0


def hand_made_sessions(seed: int, num_sessions: int = 6) -> list[ReplaySession]:
    """Agent-like sessions: outputs copy lines from a shared pool (with edits), and each
    prompt resends the session's history, so both trees find long matches."""
    rng = random.Random(seed)
    pool = [[rng.randrange(1, 400) for _ in range(rng.randrange(4, 12))] for _ in range(40)]
    sessions = []
    for s in range(num_sessions):
        history = [rng.randrange(1, 400) for _ in range(80)]  # a task statement
        calls = []
        for turn in range(5):
            out: list[int] = []
            for _ in range(rng.randrange(6, 14)):
                line = list(rng.choice(pool))
                if rng.random() < 0.3:
                    line[rng.randrange(len(line))] = rng.randrange(1, 400)
                out += line
            calls.append(ReplayCall("coder", "code", turn, list(history), out))
            history = history + out + [rng.randrange(1, 400) for _ in range(30)]
        sessions.append(ReplaySession(f"hand/{seed}/{s}", tuple(calls)))
    return sessions


def replay(name: str, sessions: list[ReplaySession], batch_size: int = 1):
    server = make_family(name)
    return replay_batched([(s, server) for s in sessions], batch_size=batch_size, cost_model=Flat())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_local_tree_drafts_are_identical_step_by_step(seed: int) -> None:
    # Without a global tree the two drives ask the same per-request tree the same
    # question (a whole-context match never has a continuation there), so every draft,
    # hence every step, is the same.
    sessions = hand_made_sessions(seed)
    lab = replay("suffix-64-local", sessions)
    cache = replay("suffix-cache-local", sessions)
    assert lab.recorder.columns["drafted"] == cache.recorder.columns["drafted"]
    assert lab.recorder.columns["accepted"] == cache.recorder.columns["accepted"]
    assert lab.num_steps == cache.num_steps


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_suffix_cache_equals_suffix_64_within_one_percent(seed: int) -> None:
    # With the global tree they differ only in when a response enters it (token by token
    # in the cache, at the call's end in suffix-64) and in whole-context matches of
    # requests shorter than the depth; tokens per step agree within 1%.
    sessions = hand_made_sessions(seed)
    lab = replay("suffix-64", sessions)
    cache = replay("suffix-cache", sessions)
    assert lab.num_output_tokens == cache.num_output_tokens
    assert cache.tokens_per_step == pytest.approx(lab.tokens_per_step, rel=0.01)
    # The global tree is used: more tokens per step than the request tree alone.
    assert lab.tokens_per_step > replay("suffix-64-local", sessions).tokens_per_step
    print(
        f"seed {seed}: tokens/step suffix-64 {lab.tokens_per_step:.4f} suffix-cache "
        f"{cache.tokens_per_step:.4f}; drafting us/token suffix-64 "
        f"{lab.draft_us_per_token:.1f} suffix-cache {cache.draft_us_per_token:.1f}"
    )


def test_global_docs_are_cached_responses_and_requests_are_stopped() -> None:
    server = SuffixCacheServer(global_docs=[[9, 8, 7, 6, 5], [4, 4]])
    assert len(server.cache.cached_requests) == 2
    assert len(server.cache.active_requests) == 0
    call = server.session("s").call("coder", "code", 0)
    call.begin([1, 2, 9, 8, 7])
    assert call.propose(8) == [6, 5]  # "9 8 7" from the cached response, 3 tokens allowed
    assert call.last_match_length == 3
    call.accept([6, 5, 1])
    assert len(server.cache.active_requests) == 1
    call.end()
    assert len(server.cache.active_requests) == 0
    assert len(server.cache.cached_requests) == 3  # the response stays cached
    with pytest.raises(ValueError, match="prompt_ids"):
        server.session("t").call("coder", "code", 0).begin([1, -2])


def test_tree_mode_drafts_the_caches_tree_and_its_first_branch() -> None:
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    from agspec.baselines.suffix_cache import SUFFIX_CACHE_TREE, SuffixCacheServer

    prompt = [1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 6, 7, 1, 2, 3, 4, 6, 8, 1, 2, 3]
    server = SuffixCacheServer(SUFFIX_CACHE_TREE, use_tree_spec=True)
    call = server.session("s").call("coder", "code", 0)
    call.begin(prompt)
    tree = call.propose_tree(8)
    # The same question asked of the cache directly, as vLLM's proposer would in tree mode.
    cache = SuffixDecodingCache(max_tree_depth=64, max_cached_requests=-1)
    cache.start_request(0, prompt)
    direct = cache.speculate(
        0, prompt, max_spec_tokens=8, max_spec_factor=1.0, min_token_prob=0.1, use_tree_spec=True
    )
    assert (tree.token_ids, tree.parents) == (direct.token_ids, direct.parents)
    assert not tree.is_chain
    assert call.propose(8) == tree.first_branch()


@pytest.mark.parametrize("seed", [0, 1])
def test_tree_mode_accepts_at_least_what_its_first_branch_would(seed: int) -> None:
    sessions = hand_made_sessions(seed)
    tree = replay("suffix-cache-tree", sessions)
    assert tree.num_output_tokens == replay("suffix-cache", sessions).num_output_tokens
    first = tree.recorder.columns["first_branch_accepted"]
    accepted = tree.recorder.columns["accepted"]
    assert all(a >= f for a, f in zip(accepted, first))
