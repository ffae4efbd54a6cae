"""What `agspec serve`'s `Engine` needs built before it decodes: the cost profile, the
drafter, and the live cost profile that corrects the first from the server's own steps.

Three steps, in the order the engine takes them (each needs what the one before gave,
the drafter also the model's tokenizer):

1. `resolve_cost_profile`: `--cost-profile`, or the profile cached for this model and
   thread count (measured now on the first start);
2. `make_drafter`: `--drafter` by name: an AgSpec variant (`AgSpecServer.from_variant`,
   priced with the profile, its state under `--state-dir`), `ar`, a baseline, or None for
   `none`;
3. `start_live_cost`: the profile as the prior of a `LiveCostProfile` (unless
   `--fixed-cost-profile`).

The per-step part (a timed step as a live sample, the drafter repriced) stays in the
engine (`Engine._observe_step`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agspec.serve.cost_online import LiveCostProfile
    from agspec.serve.engine import EngineConfig

__all__ = ["resolve_cost_profile", "make_drafter", "start_live_cost"]


def resolve_cost_profile(
    config: EngineConfig, model_path: Path, progress: Callable[[str], None]
) -> Path:
    """The cost profile file the drafter is priced with: `config.cost_profile` (checked to
    exist), else the one cached for the model and thread count (measured on a miss)."""
    if config.cost_profile:
        path = Path(config.cost_profile)
        if not path.is_file():
            raise ValueError(f"--cost-profile {path}: no such file")
        return path
    from agspec.serve.profile_cache import cached_cost_profile

    path, cached = cached_cost_profile(model_path, config.threads, progress=progress)
    progress(f"cost profile: {path}" + (" (cached)" if cached else " (measured now)"))
    return path


def make_drafter(
    config: EngineConfig,
    *,
    tokenizer: Any,
    model_name: str,
    cost_profile_path: Path | None,
) -> Any:
    """The drafter server `config.drafter` names (None for "none"); raises ValueError
    with the known names for an unknown one."""
    name = config.drafter
    if name == "none":
        return None
    from agspec.drafter import VARIANTS, AgSpecServer
    from agspec.policy.costmodel import ProfileCostModel

    assert cost_profile_path is not None
    cost_model = ProfileCostModel.load(cost_profile_path)
    # Every AgSpec variant prices its drafts with the measured profile; the default
    # `agspec` takes its length from it (docs/costmodel.md, "The cost-aware length").
    variant = name
    if variant in VARIANTS:
        cfg = replace(
            VARIANTS[variant],
            session_ttl_s=config.session_ttl_s,
            live_token_budget=config.session_token_budget,
            memory_budget_bytes=config.memory_budget_bytes,
        )
        state = Path(config.state_dir) if config.state_dir else None
        if state is not None:
            state.mkdir(parents=True, exist_ok=True)
        return AgSpecServer.from_variant(
            variant,
            tokenizer=tokenizer,
            cost_model=cost_model,
            batch_size=1,
            config=cfg,
            model=model_name,
            scales_path=state / "scales.json" if state else None,
            curves_path=state / "curves.json" if state else None,
            # At most one state write per 30 s (and one at close), not one per session.
            save_interval_s=30.0,
        )
    from agspec.baselines.ar import ARServer
    from agspec.baselines.registry import BASELINES
    from agspec.drafter.factory import DrafterContext

    if name == "ar":
        return ARServer()
    if name not in BASELINES:
        known = ", ".join(["agspec", "none", "ar", *BASELINES.names(), *VARIANTS])
        raise ValueError(f"unknown drafter {name!r}; known: {known}")
    ctx = DrafterContext(tokenizer=tokenizer, cost_model=cost_model, batch_size=1)
    return BASELINES.get(name)(ctx)


def start_live_cost(
    cost_profile_path: Path, progress: Callable[[str], None], *, max_tokens: int = 17
) -> LiveCostProfile:
    """A `LiveCostProfile` with the profile as its prior (said on `progress`), probing up
    to `max_tokens` tokens per request (1 + the draft cap)."""
    from agspec.policy.costmodel import ProfileCostModel
    from agspec.serve.cost_online import LiveCostProfile, describe_profile

    prior = ProfileCostModel.load(cost_profile_path)
    provisional = bool(prior.extra.get("provisional"))
    live = LiveCostProfile(
        prior, max_tokens=max_tokens, source=str(cost_profile_path), provisional=provisional
    )
    note = " (provisional: measured on a busy machine)" if provisional else ""
    progress(f"cost profile{note}: {describe_profile(prior)}; corrected online from "
             "this server's own steps")  # fmt: skip
    return live
