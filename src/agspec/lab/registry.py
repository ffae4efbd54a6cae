"""Drafters the replay lab knows by name: one line per drafter.

A factory builds a fresh `DrafterServer` for one replay (one source, one fold, one batch
size): `factory(global_docs, tokenizer, cost_model, batch_size)`. `global_docs` are the
token-id documents of the other fold (see `agspec.lab.run`); a drafter that has no
global corpus ignores them.

>>> server = make_server("ar", global_docs=[[1, 2, 3]], tokenizer=None, cost_model=None,
...                      batch_size=1)
>>> server.session("s").call("coder", "code", 0).propose(8)
[]
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

DrafterFactory = Callable[[Sequence[Sequence[int]], Any, Any, int], Any]


class _NoDraft:
    """AR decoding: never proposes, so every step commits one token."""

    def begin(self, prompt_ids: Sequence[int]) -> None:
        pass

    def propose(self, max_tokens: int) -> list[int]:
        return []

    def accept(self, committed_ids: Sequence[int]) -> None:
        pass

    def end(self) -> None:
        pass


class _NoDraftSession:
    def open_artifact(self, path: str, text: str) -> None:
        pass

    def call(self, agent: str, role: str, turn: int) -> _NoDraft:
        return _NoDraft()

    def end(self) -> None:
        pass


class ARServer:
    """The AR baseline as a drafter server (proposes nothing)."""

    name = "ar"

    def session(self, session_id: str, *, emission_format: str = "none") -> _NoDraftSession:
        return _NoDraftSession()


def _baseline(name: str) -> DrafterFactory:
    """Factory for a baseline of `agspec.baselines.registry.make_family` (imported lazily)."""

    def factory(
        global_docs: Sequence[Sequence[int]], tokenizer: Any, cost_model: Any, batch_size: int
    ) -> Any:
        module = importlib.import_module("agspec.baselines.registry")
        make_family = module.make_family
        offered = {
            "global_docs": global_docs,
            "tokenizer": tokenizer,
            "cost_model": cost_model,
            "batch_size": batch_size,
        }
        params = inspect.signature(make_family).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            kwargs = offered
        else:
            kwargs = {k: v for k, v in offered.items() if k in params}
        return make_family(name, **kwargs)

    return factory


# name -> factory. "oracle" is built by the run itself (it reads the recorded outputs).
DRAFTERS: dict[str, DrafterFactory] = {
    "ar": lambda global_docs, tokenizer, cost_model, batch_size: ARServer(),
    "pld-hf": _baseline("pld-hf"),
    "pld-vllm": _baseline("pld-vllm"),
    "rest": _baseline("rest"),
    "sam-fixed": _baseline("sam-fixed"),
    "sam-scaled": _baseline("sam-scaled"),
    "suffix-64": _baseline("suffix-64"),
    "suffix-24": _baseline("suffix-24"),
    "fastcoder": _baseline("fastcoder"),
}

ORACLE = "oracle"


def register_drafter(name: str, factory: DrafterFactory) -> None:
    """Add (or replace) a drafter by name, e.g. an AgSpec ablation variant."""
    if not name or name == ORACLE:
        raise ValueError(f"drafter name {name!r} is reserved or empty")
    DRAFTERS[name] = factory


def drafter_names() -> list[str]:
    """Every name `agspec replay --drafters` accepts."""
    _load_agspec_entries()
    return [*DRAFTERS, ORACLE]


def make_server(
    name: str,
    *,
    global_docs: Sequence[Sequence[int]],
    tokenizer: Any,
    cost_model: Any,
    batch_size: int,
) -> Any:
    """A fresh server for drafter `name`; unknown names list the known ones."""
    _load_agspec_entries()
    if name not in DRAFTERS:
        known = ", ".join(drafter_names())
        from agspec.drafter.variants import renamed_hint

        raise ValueError(f"unknown drafter {name!r}{renamed_hint(name)}; known: {known}")
    return DRAFTERS[name](global_docs, tokenizer, cost_model, batch_size)


def _load_agspec_entries() -> None:
    """Add every baseline family `agspec.baselines.registry` knows (e.g. `suffix-64-local`)
    and the AgSpec variants of `agspec.drafter.replay.REPLAY_DRAFTERS`, when present."""
    try:
        baselines = importlib.import_module("agspec.baselines.registry")
    except ModuleNotFoundError as exc:
        if exc.name != "agspec.baselines.registry":
            raise
    else:
        for name in getattr(baselines, "FAMILY_NAMES", ()):
            DRAFTERS.setdefault(name, _baseline(name))
    try:
        module = importlib.import_module("agspec.drafter.replay")
    except ModuleNotFoundError as exc:
        if exc.name != "agspec.drafter.replay":
            raise
        return
    entries = getattr(module, "REPLAY_DRAFTERS", None)
    if isinstance(entries, dict):
        for name, factory in entries.items():
            DRAFTERS.setdefault(name, factory)


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
        if name == ORACLE:
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
