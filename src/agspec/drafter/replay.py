"""Replay-lab factories: one AgSpec server per named variant (`agspec.lab.registry`).

`replay_factory(name)` is the `DrafterFactory` of variant `name` of `VARIANTS` (or of an
explicit `config`, e.g. a swept setting); what the run sets (global documents, cost
model, batch size, profiled caps) comes in the `DrafterContext` of each call.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agspec.corpora import GlobalCorpus
from agspec.drafter.config import AgSpecConfig
from agspec.drafter.factory import DrafterContext, DrafterFactory
from agspec.drafter.server import AgSpecServer
from agspec.drafter.variants import VARIANTS
from agspec.index.engines import ENGINES
from agspec.policy.costmodel import break_even_accept_prob


def _break_even(cost_model: Any, batch_size: int) -> float | None:
    """p* from `agspec.policy.costmodel` when a cost model is given (None: keep the default)."""
    if cost_model is None:
        return None
    return float(break_even_accept_prob(cost_model, batch_size))


def replay_factory(name: str, config: AgSpecConfig | None = None) -> DrafterFactory:
    """The factory of AgSpec servers named `name`, configured as `VARIANTS[name]` unless
    `config` is given."""
    cfg0 = VARIANTS[name] if config is None else config

    # -> AgSpecServer, a DrafterServer whose sessions' open_artifact returns a count.
    def factory(ctx: DrafterContext) -> Any:
        g = (
            GlobalCorpus.build(ctx.global_docs, ENGINES.get(cfg0.engine))
            if cfg0.use_global and ctx.global_docs
            else None
        )
        p_star = _break_even(ctx.cost_model, ctx.batch_size)
        cfg = cfg0 if p_star is None else replace(cfg0, break_even_prob=p_star)
        return AgSpecServer(
            tokenizer=ctx.tokenizer,
            global_corpus=g,
            config=cfg,
            caps=ctx.caps,
            batch_size=ctx.batch_size,
            name=name,
            cost_model=ctx.cost_model,
        )

    return factory
