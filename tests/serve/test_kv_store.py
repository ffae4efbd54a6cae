"""agspec.serve.kv_store: the saved-KV store against a brute-force model (a list in
recency order, every rule spelled out), on random sequences of puts and takes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agspec.serve.kv_store import KVStore


@dataclass(frozen=True)
class Entry:
    tokens: tuple[int, ...]
    nbytes: int


def starts_with(longer: tuple[int, ...], prefix: tuple[int, ...]) -> bool:
    return len(longer) >= len(prefix) and longer[: len(prefix)] == prefix


def common(a: tuple[int, ...], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


tokens = st.lists(st.integers(0, 3), min_size=0, max_size=8).map(tuple)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), tokens, st.integers(1, 40)),
        st.tuples(st.just("best"), st.lists(st.integers(0, 3), max_size=8)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, budget=st.integers(1, 100))
def test_store_matches_a_brute_force_model(ops, budget) -> None:
    store = KVStore(budget)
    model: list[Entry] = []  # least recent first
    for op in ops:
        if op[0] == "put":
            e = Entry(op[1], op[2])
            covered = any(starts_with(m.tokens, e.tokens) for m in model)
            want = not (e.nbytes > budget or covered)
            if want:
                model = [m for m in model if not starts_with(e.tokens, m.tokens)]
                while model and sum(m.nbytes for m in model) + e.nbytes > budget:
                    model.pop(0)
                model.append(e)
            assert store.put(e) == want
        else:
            prompt = op[1]
            key, n = store.best(prompt)
            most = max((common(m.tokens, prompt) for m in model), default=0)
            assert n == most
            if most > 0:
                got = store.take(key)
                assert common(got.tokens, prompt) == most
                model.remove(got)
            else:
                assert key == -1
        assert store.nbytes == sum(m.nbytes for m in model) <= budget
        assert len(store) == len(model)
        assert sorted(store._entries.values(), key=id) == sorted(model, key=id)


def test_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="budget_bytes"):
        KVStore(0)
