"""The one registry type (`agspec._registry`) and the five families built on it."""

from __future__ import annotations

import pytest

from agspec._registry import Registry, UnknownNameError


def test_entries_in_registration_order_with_help() -> None:
    r: Registry[int] = Registry("widget")
    r.register("b", 2, help="the second")
    r.register("a", 1)
    assert r.names() == ["b", "a"] and list(r) == ["b", "a"] and len(r) == 2
    assert (r.get("a"), r.get("b"), r.help("b"), r.help("a")) == (1, 2, "the second", "")
    assert "a" in r and "c" not in r and 1 not in r


def test_unknown_name_lists_the_known_ones_in_order() -> None:
    r: Registry[int] = Registry("widget", hint=lambda n: " (now 'b')" if n == "old" else "")
    r.register("b", 2)
    r.register("a", 1)
    with pytest.raises(UnknownNameError) as err:
        r.get("c")
    assert str(err.value) == "unknown widget 'c'; known: b, a"
    assert isinstance(err.value, ValueError)
    with pytest.raises(UnknownNameError, match=r"^unknown widget 'old' \(now 'b'\); known: b, a$"):
        r.get("old")
    with pytest.raises(UnknownNameError, match="unknown widget 3"):
        r.get(3)  # type: ignore[arg-type]
    with pytest.raises(UnknownNameError, match=r"known: \(none\)"):
        Registry[int]("gadget").get("x")
    with pytest.raises(UnknownNameError):
        r.help("c")


def test_a_name_is_registered_once_and_must_be_a_real_name() -> None:
    r: Registry[int] = Registry("widget")
    r.register("a", 1)
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        r.register("a", 2)
    assert r.get("a") == 1  # never replaced
    for bad in ("", " a", "a ", None, 7):
        with pytest.raises(ValueError, match="widget name must be a non-empty string"):
            r.register(bad, 3)  # type: ignore[arg-type]
    assert r.names() == ["a"]


def test_every_family_is_a_registry_with_the_same_errors() -> None:
    pytest.importorskip("agspec._native", reason="native index not built (pip install -e .)")
    from agspec.baselines.registry import BASELINES
    from agspec.corpora.forms import EMISSION_FORMS
    from agspec.index.engines import ENGINES
    from agspec.lab.registry import DRAFTERS
    from agspec.traces.importers import IMPORTERS

    families = {
        "drafter": (DRAFTERS, "agspec-paper"),
        "baseline": (BASELINES, "suffix-64"),
        "trace format": (IMPORTERS, "chatdev"),
        "emission format": (EMISSION_FORMS, "unified_diff"),
        "index engine": (ENGINES, "native"),
    }
    for family, (registry, member) in families.items():
        assert isinstance(registry, Registry) and registry.family == family
        assert member in registry.names()
        with pytest.raises(UnknownNameError) as err:
            registry.get("no-such-name")
        assert str(err.value).startswith(f"unknown {family} 'no-such-name'; known: ")
        assert str(err.value).endswith(", ".join(registry.names()))
    # Every drafter: `ar`, then each baseline, then each AgSpec variant, in that order.
    from agspec.drafter.variants import VARIANTS

    assert DRAFTERS.names() == ["ar", *BASELINES.names(), *VARIANTS]
    # The drafter config checks its engine by the same lookup.
    from agspec.drafter.config import AgSpecConfig

    with pytest.raises(UnknownNameError, match="unknown index engine 'nope'; known: native"):
        AgSpecConfig(engine="nope")
    # A name from before the rename says what it is called now.
    with pytest.raises(UnknownNameError, match="'agspec-cost-plus' \\(renamed .*now 'agspec'\\)"):
        DRAFTERS.get("agspec-cost-plus")
