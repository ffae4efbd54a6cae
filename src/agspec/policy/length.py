"""Agent-aware draft length (paper §3.2): offline cap C_a, online scale α_a, and the policy.

For agent a with a match of m tokens:

    L = min(max(1, floor(α_a · m)), C_a)      then  L ≤ tokens available after the match
                                              and   L ≤ the engine's own length, if any
    m = 0 → L = 0 (no match, no draft)

- `ProfiledCap`: C_a is the last k whose acceptance probability P(r ≥ k) exceeds p*,
  from replayed acceptance records; saved per (agent, model, batch size) in a caps file.
- `OnlineScale`: α_a starts at 1; after each verification α_a += η·(1[a = d] − p*), where
  a is the accept length (bonus token excluded, see `agspec.drafter.protocol`) and d the draft
  length; skipped when a fully accepted draft had the cap's length (the cap censors it);
  clipped to [α_min, α_max]; persisted atomically.
- `DraftLengthPolicy`: the rule above, with ablation variants "static", "match", "cap",
  "cap+scale", and "cost" (beyond the paper, below).
- Variant "cost" delegates to its own rule, `agspec.policy.cost_rule.CostLengthRule`
  (expected committed tokens per unit of measured step cost, from acceptance curves
  learned online; `agspec.policy.cost_length`).

Example: agent "coder" with α = 0.5, C = 6 and a 20-token match with 9 tokens available:
floor(0.5·20) = 10, capped to 6, and 6 ≤ 9, so the draft is 6 tokens; if all 6 are
accepted the scale is not updated (the cap cut the draft).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from math import floor

from agspec.policy._state import atomic_write_text, check_int
from agspec.policy.caps import (
    AcceptanceRecord,
    CapsFileError,
    ProfiledCap,
    acceptance_curve,
    cap_from_curve,
)
from agspec.policy.cost_length import MatchSurvival
from agspec.policy.cost_rule import CostLengthRule
from agspec.policy.scale import OnlineScale, OnlineScaleConfig

__all__ = [
    "AcceptanceRecord",
    "acceptance_curve",
    "cap_from_curve",
    "ProfiledCap",
    "CapsFileError",
    "OnlineScale",
    "OnlineScaleConfig",
    "DraftLengthPolicy",
    "LengthDecision",
    "VARIANTS",
    "atomic_write_text",
]


logger = logging.getLogger(__name__)


VARIANTS = ("static", "match", "cap", "cap+scale", "cost")


# --------------------------------------------------------------------------- policy
@dataclass(frozen=True)
class LengthDecision:
    """How many tokens to draft, and whether the cap was what bounded it."""

    draft_tokens: int
    cap_tokens: int | None
    censored_by_cap: bool
    match_tokens: int = 0  # the match the draft came from (variant "cost" learns by it)


class DraftLengthPolicy:
    """The draft length for one retrieval step, by variant.

    - "static": a fixed `static_tokens` whenever there is a match;
    - "match": max(1, m) (α fixed at 1, no cap; SuffixDecoding-style);
    - "cap": min(max(1, m), C_a);
    - "cap+scale": min(max(1, floor(α_a·m)), C_a) (the paper's rule);
    - "cost": first an upper bound (≤ `survival.max_tokens`), then `cost_length` trims
      what the index retrieved to the expected-throughput optimum (`best_length`); the
      rule and its state are `self.cost`, a `CostLengthRule` (the other variants keep an
      idle one, for its survival).
    Every variant then takes ≤ available tokens and ≤ the engine's own length, and m = 0
    gives 0.

    >>> pol = DraftLengthPolicy("cap+scale", caps=ProfiledCap(default_cap_tokens=6),
    ...                         scale=OnlineScale(p_star=0.2, scales={"coder": 0.5}))
    >>> pol.draft_length("coder", match_tokens=20, available_tokens=9).draft_tokens
    6
    >>> pol.draft_length("coder", match_tokens=5, available_tokens=9).draft_tokens  # floor 2.5
    2
    """

    def __init__(
        self,
        variant: str = "cap+scale",
        *,
        caps: ProfiledCap | None = None,
        scale: OnlineScale | None = None,
        model: str = "",
        batch_size: int = 1,
        static_tokens: int = 8,
        step_costs: Sequence[float] | None = None,
        survival: MatchSurvival | None = None,
    ) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"unknown draft-length variant {variant!r}; one of {VARIANTS}")
        if variant == "cap+scale" and scale is None:
            raise ValueError("variant 'cap+scale' needs an OnlineScale")
        if variant == "cost":
            if step_costs is None or len(step_costs) < 2:
                raise ValueError(
                    "variant 'cost' needs step_costs: the cost of verifying 1, 2, ... tokens "
                    "(a cost profile from `agspec costmodel measure`)"
                )
            costs = self.normalized_costs(step_costs)
        else:
            costs = []
        # Variant "cost"'s rule: its step costs, survival, batch size and running batch
        # means (the properties below read and set them there).
        self.cost = CostLengthRule(
            costs, survival, batch_size=check_int("batch_size", batch_size, minimum=1)
        )
        self.variant = variant
        self.caps = caps if caps is not None else ProfiledCap()
        self.scale = scale
        self.model = model
        self.static_tokens = check_int("static_tokens", static_tokens, minimum=1)

    @property
    def step_costs(self) -> list[float]:
        """Variant "cost": the step costs relative to one token (empty for the others)."""
        return self.cost.step_costs

    @step_costs.setter
    def step_costs(self, costs: list[float]) -> None:
        self.cost.step_costs = costs

    @property
    def survival(self) -> MatchSurvival:
        """The acceptance curves variant "cost" learns (`CostLengthRule.survival`)."""
        return self.cost.survival

    @survival.setter
    def survival(self, survival: MatchSurvival) -> None:
        self.cost.survival = survival

    @property
    def batch_size(self) -> int:
        """The batch size the caps are looked up at and variant "cost" prices for."""
        return self.cost.batch_size

    @batch_size.setter
    def batch_size(self, batch_size: int) -> None:
        self.cost.batch_size = batch_size

    @property
    def mean_draft(self) -> float:
        """Variant "cost": the running mean draft tokens per step (`note_step`)."""
        return self.cost.mean_draft

    @mean_draft.setter
    def mean_draft(self, value: float) -> None:
        self.cost.mean_draft = value

    @property
    def mean_committed(self) -> float:
        """Variant "cost": the running mean committed tokens per step (`note_step`)."""
        return self.cost.mean_committed

    @mean_committed.setter
    def mean_committed(self, value: float) -> None:
        self.cost.mean_committed = value

    @staticmethod
    def normalized_costs(step_costs: Sequence[float]) -> list[float]:
        """Step costs relative to verifying one token (checked: finite and > 0).

        >>> DraftLengthPolicy.normalized_costs([2.0, 3.0, 5.0])
        [1.0, 1.5, 2.5]
        """
        costs = [float(c) for c in step_costs]
        if not all(math.isfinite(c) and c > 0 for c in costs):
            raise ValueError(f"step_costs must be finite and > 0, got {costs[:8]}")
        return [c / costs[0] for c in costs]

    def draft_length(
        self,
        agent: str,
        *,
        match_tokens: int,
        available_tokens: int,
        engine_max_tokens: int | None = None,
    ) -> LengthDecision:
        # The drafter calls this every step: one cheap type check for the common case.
        if not (type(match_tokens) is int and type(available_tokens) is int):
            check_int("match_tokens", match_tokens)
            check_int("available_tokens", available_tokens)
        if match_tokens < 0 or available_tokens < 0:
            raise ValueError(
                f"match_tokens and available_tokens must be >= 0, got {match_tokens} "
                f"and {available_tokens}"
            )
        if engine_max_tokens is not None:
            check_int("engine_max_tokens", engine_max_tokens)
        if match_tokens == 0:
            return LengthDecision(0, None, False)
        cap: int | None = None
        if self.variant in ("cap", "cap+scale"):
            cap = self.caps.cap_for(agent, model=self.model, batch_size=self.batch_size)
        length = self.length_tokens(agent, match_tokens, available_tokens, engine_max_tokens, cap)
        censored = cap is not None and length >= cap
        return LengthDecision(length, cap, censored, match_tokens)

    def length_tokens(
        self,
        agent: str,
        match_tokens: int,
        available_tokens: int,
        engine_max_tokens: int | None,
        cap_tokens: int | None,
    ) -> int:
        """`draft_length(...).draft_tokens` for a caller that has checked its arguments
        (match_tokens >= 1) and looked up the cap of variants "cap" and "cap+scale" once
        (the drafter's hot path: no checks, no decision object)."""
        variant = self.variant
        if variant == "cap+scale" or variant == "cap":
            assert cap_tokens is not None
            scale = self.scale
            if variant == "cap+scale" and scale is not None:
                # `OnlineScale.alpha`, inlined (the drafter asks this every step).
                length = floor(scale.scales.get(agent, scale.config.alpha_init) * match_tokens)
            else:
                length = match_tokens  # α = 1
            if length < 1:
                length = 1
            if cap_tokens < length:
                length = cap_tokens
        elif variant == "cost":
            length = self.cost.bound_tokens
        elif variant == "static":
            length = self.static_tokens
        else:
            length = max(1, match_tokens)
        if available_tokens < length:
            length = available_tokens
        if engine_max_tokens is not None and engine_max_tokens < length:
            length = engine_max_tokens
        return length

    @property
    def cost_bound_tokens(self) -> int:
        """Variant "cost": the longest draft it considers (`CostLengthRule.bound_tokens`)."""
        return self.cost.bound_tokens

    def cost_length(self, agent: str, match_tokens: int, retrieved_tokens: int) -> int:
        """Variant "cost": how many of the `retrieved_tokens` to draft (0: none); see
        `CostLengthRule.cost_length`."""
        return self.cost.cost_length(agent, match_tokens, retrieved_tokens)

    def cost_table(
        self, agent: str, match_tokens: int, upto_tokens: int | None = None
    ) -> list[int]:
        """Variant "cost": [`cost_length(agent, match_tokens, r)` for r in 0 .. R], R =
        `cost_bound_tokens` (`CostLengthRule.cost_table`).

        >>> pol = DraftLengthPolicy("cost", step_costs=[1.0, 1.1, 1.2, 1.3, 3.0],
        ...                         survival=MatchSurvival(max_tokens=4, prior_weight=1.0))
        >>> pol.cost_table("coder", 16)    # S(k) = (16/17)^k: drafting 3 pays, the 4th not
        [0, 1, 2, 3, 3]
        """
        return self.cost.cost_table(agent, match_tokens, upto_tokens)

    def draft_lengths(
        self,
        agents: Sequence[str],
        match_tokens: Sequence[int],
        available_tokens: Sequence[int],
        cap_tokens: Sequence[int | None] | None,
        engine_max_tokens: Sequence[int | None] | None = None,
    ) -> list[int]:
        """The draft lengths of one batch step's requests (the drafter's hot path, checked
        arguments as for `length_tokens`, `engine_max_tokens` None: no engine bounds any;
        `cap_tokens` None: no caps, for the variants that read none):
        for request i `length_tokens(...)`, then in variant "cost" `cost_length(...)` of
        that, as `AgSpecCall` asks them one request at a time, with the same answers.

        >>> pol = DraftLengthPolicy("cap+scale", caps=ProfiledCap(default_cap_tokens=6),
        ...                         scale=OnlineScale(p_star=0.2, scales={"coder": 0.5}))
        >>> pol.draft_lengths(["coder", "coder"], [20, 5], [9, 9], [6, 6])
        [6, 2]
        """
        variant = self.variant
        if cap_tokens is None:
            if variant in ("cap+scale", "cap"):
                raise ValueError(f"variant {variant!r} needs the requests' cap_tokens")
            cap_tokens = [None] * len(agents)  # the other variants read no cap
        if engine_max_tokens is not None or variant not in ("cost", "cap+scale", "cap"):
            engines = engine_max_tokens or [None] * len(agents)
            out = [
                self.length_tokens(agent, m, k, e, cap)
                for agent, m, k, e, cap in zip(
                    agents, match_tokens, available_tokens, engines, cap_tokens
                )
            ]
            if variant == "cost":
                out = [
                    self.cost_length(agent, m, want) if want else 0
                    for agent, m, want in zip(agents, match_tokens, out)
                ]
            return out
        out = []
        if variant == "cost":
            tables = self.cost_tables(agents, match_tokens, available_tokens)
            return [
                table[k] if k < len(table) else table[-1]
                for table, k in zip(tables, available_tokens)
            ]
        scale = self.scale if variant == "cap+scale" else None
        scales = scale.scales if scale is not None else {}
        init = scale.config.alpha_init if scale is not None else 1.0
        floor = math.floor
        for agent, m, k, cap in zip(agents, match_tokens, available_tokens, cap_tokens):
            assert cap is not None
            length = floor(scales.get(agent, init) * m)
            if length < 1:
                length = 1
            if cap < length:
                length = cap
            out.append(k if k < length else length)
        return out

    def refresh_cost_tables(self) -> None:
        """Variant "cost": the tables of the last state (the (agent, match bucket) keys a
        batch step used, each as far as it went) computed again at the current one, when
        it moved. `step_batch` calls it while the native advance runs on helper threads,
        so that the next plan mostly finds its tables ready; it changes no answer.

        >>> pol = DraftLengthPolicy("cost", step_costs=[1.0, 1.1, 1.2, 1.3, 3.0],
        ...                         survival=MatchSurvival(max_tokens=4, prior_weight=1.0))
        >>> pol.cost_table("coder", 16)
        [0, 1, 2, 3, 3]
        >>> for _ in range(10):     # ten drafts rejected at their first token
        ...     pol.observe_tokens("coder", 3, False, 16, 0)
        >>> pol.refresh_cost_tables(); pol.cost.tables
        {('coder', 5): [0, 0, 0, 0, 0]}
        """
        self.cost.refresh_tables()

    def cost_tables(
        self, agents: Sequence[str], match_tokens: Sequence[int], available_tokens: Sequence[int]
    ) -> list[list[int]]:
        """Variant "cost": `cost_table` of each request of one batch step (matches >= 1),
        at least as far as the largest of `available_tokens`, each (agent, match bucket)'s
        table computed once: a request's draft length is table[min(retrieved, R)], before
        the continuation is copied and after.

        >>> pol = DraftLengthPolicy("cost", step_costs=[1.0, 1.1, 1.2, 1.3, 3.0],
        ...                         survival=MatchSurvival(max_tokens=4, prior_weight=1.0))
        >>> [t[3] for t in pol.cost_tables(["coder", "coder"], [16, 1], [4, 4])]  # q = 16/17, 1/2
        [3, 2]
        """
        return self.cost.cost_tables(agents, match_tokens, available_tokens)

    def observe_batch(
        self,
        agents: Sequence[str],
        decisions: Sequence[tuple[int, bool, int]],
        accept_lengths: Sequence[int],
    ) -> None:
        """`observe_tokens` for many verifications, in order (one batch step of many
        requests; decisions[i] = (draft tokens, censored by the cap, match tokens)): the
        same state as that many `observe_tokens` calls."""
        if not decisions:
            return
        variant = self.variant
        if variant == "cost":
            drafted, _, matches = zip(*decisions)
            self.survival.observe_batch(agents, matches, drafted, accept_lengths)
        elif variant == "cap+scale" and self.scale is not None:
            drafted, censored, _ = zip(*decisions)
            self.scale.apply_batch(agents, drafted, accept_lengths, censored)

    def note_steps(self, drafted_tokens: Sequence[int], committed_tokens: Sequence[int]) -> None:
        """`note_step` for many requests' verification steps, in order (the same running
        means; `CostLengthRule.note_steps`)."""
        self.cost.note_steps(drafted_tokens, committed_tokens)

    def note_step(self, drafted_tokens: int, committed_tokens: int) -> None:
        """Every verification step of every request, drafted or not (variant "cost" at
        batch size > 1 keeps running means of the draft length and committed tokens:
        an exponential average over the last ~1/`BATCH_EMA` steps;
        `CostLengthRule.note_step`)."""
        self.cost.note_step(drafted_tokens, committed_tokens)

    def observe(self, agent: str, decision: LengthDecision, accept_length: int) -> None:
        """Feed a verification outcome back (updates α_a in the "cap+scale" variant, the
        acceptance survival in the "cost" variant)."""
        if self.variant == "cost":
            self.survival.observe(
                agent,
                decision.match_tokens,
                drafted_tokens=decision.draft_tokens,
                accepted_tokens=accept_length,
            )
            return
        if self.variant != "cap+scale" or self.scale is None:
            return
        self.scale.update(
            agent,
            drafted_tokens=decision.draft_tokens,
            accept_length=accept_length,
            censored_by_cap=decision.censored_by_cap,
        )

    def observe_tokens(
        self,
        agent: str,
        draft_tokens: int,
        censored_by_cap: bool,
        match_tokens: int,
        accept_length: int,
    ) -> None:
        """`observe` for a caller that checked its numbers (0 <= accept_length <=
        draft_tokens, draft_tokens >= 1): the drafter's hot path, no decision object."""
        variant = self.variant
        if variant == "cost":
            self.survival.observe(
                agent, match_tokens, drafted_tokens=draft_tokens, accepted_tokens=accept_length
            )
        elif variant == "cap+scale" and self.scale is not None:
            self.scale.apply(agent, draft_tokens, accept_length, censored_by_cap)
