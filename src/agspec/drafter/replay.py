"""Replay-lab factories: one AgSpec server per named variant (`agspec.lab.registry`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from agspec.corpora import GlobalCorpus
from agspec.drafter.server import AgSpecServer
from agspec.drafter.variants import VARIANTS
from agspec.index.engines import ENGINES
from agspec.policy.caps import ProfiledCap
from agspec.policy.costmodel import break_even_accept_prob


def _break_even(cost_model: Any, batch_size: int) -> float | None:
    """p* from `agspec.policy.costmodel` when a cost model is given (None: keep the default)."""
    if cost_model is None:
        return None
    return float(break_even_accept_prob(cost_model, batch_size))


def replay_factory(
    variant: str,
) -> Callable[[Sequence[Sequence[int]], Any, Any, int], AgSpecServer]:
    """A replay-lab factory for one named variant of `VARIANTS`."""
    config = VARIANTS[variant]

    def factory(
        global_docs: Sequence[Sequence[int]], tokenizer: Any, cost_model: Any, batch_size: int
    ) -> AgSpecServer:
        g = (
            GlobalCorpus.build(global_docs, ENGINES[config.engine])
            if config.use_global and global_docs
            else None
        )
        p_star = _break_even(cost_model, batch_size)
        cfg = config if p_star is None else replace(config, break_even_prob=p_star)
        return AgSpecServer(
            tokenizer=tokenizer,
            global_corpus=g,
            config=cfg,
            caps=_replay_caps(),
            batch_size=batch_size,
            name=variant,
            cost_model=cost_model,
        )

    return factory


_REPLAY_CAPS: ProfiledCap | None = None


def set_replay_caps(caps: ProfiledCap | None) -> None:
    """Caps the replay factories hand to AgSpec servers (from `agspec profile`)."""
    global _REPLAY_CAPS
    _REPLAY_CAPS = caps


def _replay_caps() -> ProfiledCap | None:
    return _REPLAY_CAPS


# Picked up by agspec.lab.registry: every variant is a replay drafter by its name.
REPLAY_DRAFTERS = {name: replay_factory(name) for name in VARIANTS}
