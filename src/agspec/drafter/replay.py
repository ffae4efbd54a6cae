"""Replay-lab factories: one AgSpec server per named variant (`agspec.lab.registry`).

`replay_factory(name)` is the `DrafterFactory` of variant `name` of `VARIANTS` (or of an
explicit `config`, e.g. a swept setting); what the run sets (global documents, cost
model, batch size, profiled caps) comes in the `DrafterContext` of each call.
"""

from __future__ import annotations

from typing import Any

from agspec.corpora import GlobalCorpus
from agspec.drafter.config import AgSpecConfig
from agspec.drafter.factory import DrafterContext, DrafterFactory
from agspec.drafter.server import AgSpecServer
from agspec.drafter.variants import VARIANTS
from agspec.index.engines import ENGINES


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
        return AgSpecServer.from_variant(
            name,
            tokenizer=ctx.tokenizer,
            cost_model=ctx.cost_model,
            batch_size=ctx.batch_size,
            config=cfg0,
            global_corpus=g,
            caps=ctx.caps,
        )

    return factory
