"""`AgSpecServer.from_variant`: the one way every caller builds AgSpec by name, so every
field is set alike; the oracle is the variant's config with p* replaced by the cost
model's break-even probability at the batch size (agspec.policy.costmodel)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agspec.drafter import VARIANTS, AgSpecServer
from agspec.drafter.factory import DrafterContext
from agspec.drafter.replay import replay_factory
from agspec.policy.costmodel import break_even_accept_prob, get_cost_model
from agspec.tokenizers import get_tokenizer

COST = "h200-qwen2.5-32b"


@pytest.mark.parametrize("variant", ["agspec", "agspec-paper", "agspec-paper+cost"])
@pytest.mark.parametrize("batch_size", [1, 16])
def test_p_star_comes_from_the_cost_model_at_the_batch_size(variant, batch_size) -> None:
    cost = get_cost_model(COST)
    server = AgSpecServer.from_variant(
        variant, tokenizer=get_tokenizer("qwen2.5"), cost_model=cost, batch_size=batch_size
    )
    p_star = float(break_even_accept_prob(cost, batch_size))
    assert server.config == replace(VARIANTS[variant], break_even_prob=p_star)
    assert server.lengths.scale.p_star == p_star
    assert server.name == variant and server.lengths.batch_size == batch_size


def test_without_a_cost_model_the_variant_is_kept() -> None:
    server = AgSpecServer.from_variant("agspec-paper", tokenizer=None)
    assert server.config == VARIANTS["agspec-paper"] and server.config.break_even_prob == 0.5
    with pytest.raises(ValueError, match="length_mode='cost' needs a cost model"):
        AgSpecServer.from_variant("agspec", tokenizer=None)


def test_a_config_overrides_the_named_one_and_options_reach_the_server() -> None:
    cost = get_cost_model(COST)
    swept = replace(VARIANTS["agspec-paper"], global_margin_tokens=3)
    server = AgSpecServer.from_variant(
        "swept", tokenizer=None, cost_model=cost, config=swept, model="m", name="other"
    )
    assert server.config == replace(swept, break_even_prob=break_even_accept_prob(cost, 1))
    assert server.name == "other" and server.lengths.model == "m"


def test_unknown_and_renamed_variants_are_refused_with_the_known_names() -> None:
    with pytest.raises(ValueError, match=r"unknown AgSpec variant 'agspec-papr'; one of agspec"):
        AgSpecServer.from_variant("agspec-papr", tokenizer=None)


def test_the_lab_and_agspec_record_build_what_from_variant_builds() -> None:
    """The lab's factory and `agspec record`'s (which never set p* from its cost profile
    before from_variant) give the same configuration as from_variant."""
    from agspec.cli.record_cmd import _agspec_factory

    cost = get_cost_model(COST)
    want = AgSpecServer.from_variant(
        "agspec-paper", tokenizer=get_tokenizer("qwen2.5"), cost_model=cost
    ).config
    lab = replay_factory("agspec-paper")(DrafterContext(cost_model=cost, batch_size=1))
    record = _agspec_factory("agspec-paper", cost, None)()
    assert lab.config == want and record.config == want
    assert want.break_even_prob != VARIANTS["agspec-paper"].break_even_prob
