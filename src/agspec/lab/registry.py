"""Drafters the replay lab knows by name: `DRAFTERS`, one registry of drafter factories.

A factory builds a fresh `DrafterServer` for one replay (one source, one fold, one batch
size) from a `DrafterContext` (`agspec.drafter.factory`): the token-id documents of the
other fold (see `agspec.lab.run`; a drafter that has no global corpus ignores them), the
tokenizer, the cost model, the batch size and the profiled caps. The entries, in order:
`ar`, every baseline of `agspec.baselines.registry.BASELINES`, every AgSpec variant of
`agspec.drafter.variants.VARIANTS`; `oracle` and `oracle-tree` (the bound of any
retrieval tree, `agspec.lab.oracle`) are built by the run itself.

>>> server = make_server("ar", global_docs=[[1, 2, 3]], tokenizer=None, cost_model=None,
...                      batch_size=1)
>>> server.session("s").call("coder", "code", 0).propose(8)
[]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agspec._registry import Registry
from agspec.baselines.ar import ARServer
from agspec.baselines.registry import BASELINES
from agspec.drafter.factory import DrafterContext, DrafterFactory
from agspec.drafter.replay import replay_factory
from agspec.drafter.variants import VARIANTS, renamed_hint
from agspec.policy.caps import ProfiledCap


def _ar(ctx: DrafterContext) -> Any:
    return ARServer()


ORACLE = "oracle"  # built by the run itself (it reads the recorded outputs): reserved
ORACLE_TREE = "oracle-tree"  # the tree bound (`OracleServer(anchored=True)`): reserved
ORACLES = (ORACLE, ORACLE_TREE)

DRAFTERS: Registry[DrafterFactory] = Registry("drafter", hint=renamed_hint)
DRAFTERS.register("ar", _ar, help="autoregressive decoding: never drafts")
for _name in BASELINES:
    DRAFTERS.register(_name, BASELINES.get(_name), help=BASELINES.help(_name))
for _name in VARIANTS:
    DRAFTERS.register(_name, replay_factory(_name), help="AgSpec, agspec.drafter.variants")
del _name


def register_drafter(name: str, factory: DrafterFactory, *, help: str = "") -> None:
    """Add a drafter by name, e.g. a swept AgSpec setting (`replay_factory(name, config)`).

    In this process only: a worker started by `spawn` knows the built-in names alone.
    """
    if name in ORACLES:
        raise ValueError(f"drafter name {name!r} is reserved")
    DRAFTERS.register(name, factory, help=help)


def drafter_names() -> list[str]:
    """Every name `agspec replay --drafters` accepts."""
    return [*DRAFTERS.names(), *ORACLES]


def make_server(
    name: str,
    *,
    global_docs: Sequence[Sequence[int]],
    tokenizer: Any,
    cost_model: Any,
    batch_size: int,
    caps: ProfiledCap | None = None,
) -> Any:
    """A fresh server for drafter `name`; unknown names list the known ones."""
    factory = DRAFTERS.get(name)
    ctx = DrafterContext(
        global_docs=global_docs,
        tokenizer=tokenizer,
        cost_model=cost_model,
        batch_size=batch_size,
        caps=caps,
    )
    return factory(ctx)


def preload_drafters(
    names: Sequence[str], *, tokenizer: Any, cost_model: Any, batch_size: int
) -> None:
    """Resolve every named drafter and import everything it runs on, before a run starts.

    Builds each drafter's server with no global corpus and drives one tiny call through it
    (`session`, `call`, `begin`, `propose`, `accept`, `end`), so a missing engine fails at
    once and every module a drafter imports lazily is loaded: a package reinstalled while
    a long run goes on cannot break it halfway. Unknown names raise `ValueError`.
    """
    for name in names:
        if name in ORACLES:
            continue
        server = make_server(
            name, global_docs=[], tokenizer=tokenizer, cost_model=cost_model, batch_size=batch_size
        )
        session = server.session("preload/0")
        call = session.call("preload", "other", 0)
        call.begin([1, 2, 3, 1, 2])
        draft = call.propose(4)
        call.accept([*draft[:1], 7] if draft else [7])
        call.end()
        end = getattr(session, "end", None)
        if callable(end):
            end()
