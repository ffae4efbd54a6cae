"""FastCoder-style drafter (reimplemented from the paper's description): source order,
cache lifetime and repository artifacts, against hand-computed drafts."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("agspec._native", reason="native index not built (pip install -e .)")

from agspec.baselines.fastcoder import FastCoderConfig, FastCoderServer  # noqa: E402


class Ints:
    """Whitespace-separated integers as tokens."""

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]


def _words(tokens: list[int]) -> str:
    return " ".join(map(str, tokens))


def test_repository_file_drafts_with_static_cap() -> None:
    server = FastCoderServer(tokenizer=Ints())
    session = server.session("s")
    session.open_artifact("a.py", _words([1, 2, *range(100, 120)]))
    call = session.call("coder", "code", 0)
    call.begin([9, 1, 2])
    assert call.propose(64) == list(range(100, 110))  # static cap: 10 tokens
    assert (call.last_match_length, call.last_source) == (2, "repository")


def test_longer_datastore_match_wins_ties_go_to_repository() -> None:
    server = FastCoderServer(global_docs=[[5, 1, 2, 3, 40], [7, 8, 9, 70]], tokenizer=Ints())
    session = server.session("s")
    session.open_artifact("a.py", "1 2 3 30 8 9 80")
    call = session.call("coder", "code", 0)
    call.begin([5, 1, 2, 3])  # common: 4 tokens, repository: 3 tokens
    assert call.propose(1) == [40]
    assert call.last_source == "common"
    call.accept([6, 8, 9])  # "8 9": 2 tokens in both
    assert call.propose(1) == [80]
    assert call.last_source == "repository"


def test_cache_of_earlier_outputs_is_used_first_and_only_after_end() -> None:
    server = FastCoderServer(tokenizer=Ints())
    session = server.session("s")
    session.open_artifact("a.py", "5 10 20 30 40 50 60")
    first = session.call("coder", "code", 0)
    first.begin([0])
    first.accept([10, 20, 31, 32])
    second = server.session("t").call("coder", "code", 0)  # another session
    second.begin([10, 20])
    assert second.propose(2) == []  # t has no repository file; first call still running
    first.end()
    assert second.propose(2) == [31, 32]
    assert second.last_source == "cache"
    # the cache ("10 20") is consulted first even when the repository matches longer
    third = session.call("coder", "code", 1)
    third.begin([5, 10, 20])
    assert third.propose(2) == [31, 32]


def test_current_output_is_part_of_the_cache() -> None:
    server = FastCoderServer(tokenizer=Ints())
    call = server.session("s").call("coder", "code", 0)
    call.begin([1, 2, 3])  # the prompt itself is not a source
    assert call.propose(4) == []
    call.accept([5, 6, 7, 5, 6])
    assert call.propose(4) == [7, 5, 6]
    assert call.last_source == "generated"


def test_repeated_artifact_is_indexed_once() -> None:
    server = FastCoderServer(tokenizer=Ints())
    session = server.session("s")
    session.open_artifact("a.py", "1 2 3")
    session.open_artifact("a.py", "1 2 3")
    assert session.repository.num_documents == 1
    session.open_artifact("a.py", "1 2 4")
    assert session.repository.num_documents == 2


def test_missing_tokenizer_and_bad_arguments_raise() -> None:
    session = FastCoderServer().session("s")
    with pytest.raises(ValueError, match="tokenizer"):
        session.open_artifact("a.py", "1 2 3")
    with pytest.raises(TypeError):
        session.open_artifact("a.py", b"1 2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="turn"):
        session.call("a", "code", -1)
    with pytest.raises(ValueError):
        FastCoderConfig(min_match_tokens=3, max_match_tokens=2)


def _longest(docs: list[list[int]], context: list[int], cap: int) -> int:
    for span in range(min(cap, len(context)), 0, -1):
        if any(
            doc[i : i + span] == context[-span:] for doc in docs for i in range(len(doc) - span)
        ):
            return span
    return 0


@pytest.mark.parametrize("seed", range(20))
def test_source_choice_matches_brute_force(seed: int) -> None:
    """The chosen source and its match length, checked by brute force every step."""
    rng = random.Random(seed)
    vocab = 4
    common = [[rng.randrange(vocab) for _ in range(30)] for _ in range(2)]
    repo = [rng.randrange(vocab) for _ in range(30)]
    server = FastCoderServer(global_docs=common, tokenizer=Ints())
    outputs: list[list[int]] = []
    for call_no in range(3):
        session = server.session(f"s{call_no}")
        session.open_artifact("a.py", _words(repo))
        call = session.call("a", "code", 0)
        context = [rng.randrange(vocab) for _ in range(8)]
        call.begin(context)
        generated: list[int] = []
        for _ in range(5):
            call.propose(10)
            sources = {
                "generated": _longest([generated], context, 16),
                "cache": _longest(outputs, context, 16),
                "repository": _longest([repo], context, 16),
                "common": _longest(common, context, 16),
            }
            cache = max(sources["generated"], sources["cache"])
            store = max(sources["repository"], sources["common"])
            if cache >= 2:
                assert call.last_source in ("generated", "cache")
                assert call.last_match_length == cache
            elif store >= 2:
                assert call.last_source in ("repository", "common")
                assert call.last_match_length == store
            else:
                assert call.last_source is None
            step = [rng.randrange(vocab) for _ in range(3)]
            call.accept(step)
            context += step
            generated += step
        call.end()
        outputs.append(generated)
