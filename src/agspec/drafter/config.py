"""What an AgSpec drafter is configured by: `AgSpecConfig` (every knob, validated).

The named configurations (the default and its ablations) are in `agspec.drafter.variants`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal, get_args

from agspec.index.engines import ENGINES
from agspec.index.token_index import ContinuationRule

LengthMode = Literal["static", "match", "cap", "cap+scale", "cost"]
MIN_MEMORY_BUDGET_BYTES = 1 << 20


@dataclass(frozen=True)
class AgSpecConfig:
    """Knobs of the drafter; the named variants below are the paper's ablations."""

    use_request: bool = False  # a per-call corpus of the call's own prompt and output only
    use_session: bool = True
    use_workspace: bool = True
    use_emission_forms: bool = True
    use_global: bool = True
    # Beyond the paper: a live corpus of the outputs of finished calls of every session
    # this server served (like SuffixDecoding's response cache). Drafts from it when its
    # match is longer than both live matches.
    use_history: bool = False
    history_budget_tokens: int = 20_000_000
    # δ: global must beat the live match by more than this. 0 won the sweep on the dev
    # traces (benchmarks/sweep_global_margin.py, docs/drafter.md).
    global_margin_tokens: int = 0
    length_mode: LengthMode = "cap+scale"
    static_length_tokens: int = 8  # the draft length of length_mode="static"
    default_cap_tokens: int = 16  # C_a for agents without a profiled cap
    # length_mode="cost" (beyond the paper): the most tokens one draft may have, and the
    # weight of the prior in the learned acceptance curves (agspec.policy.cost_length).
    cost_max_draft_tokens: int = 32
    cost_prior_weight: float = 4.0
    # Beyond the paper: where verifying this many tokens costs one decode step (within
    # FREE_COST_TOLERANCE: a large model at batch size 1 on a big GPU), a draft may be
    # this long instead of cost_max_draft_tokens (0: off). The cost rule still picks the
    # length; this only lets it look further where tokens are free.
    cost_free_draft_tokens: int = 0
    # Beyond the paper: token trees (agspec.policy.tree_size). The most nodes one tree may
    # have (0 or 1: a chain, as the paper drafts), and the deepest branch besides the
    # chain's. Needs length_mode="cost": the cost rule sizes the tree.
    tree_max_nodes: int = 1
    tree_branch_tokens: int = 16
    # Of every matching corpus, the candidates of this many most recent occurrences (1 to
    # 8; the most frequent and the first besides): a native index lists them, others give
    # the most recent only.
    tree_occurrences: int = 8
    max_match_tokens: int = 64
    # Beyond the paper: no draft from a match shorter than this. Where verification is
    # dear (a CPU backend: 2 tokens cost 2.2-3.7 decode steps on llama.cpp), short matches
    # lose more than they win.
    min_match_tokens: int = 1
    max_occurrences: int = 32
    # Continuation rules (paper §3.1): next-3-token frequency for session and global,
    # first occurrence for workspace. "recent" is the measured alternative.
    session_rule: ContinuationRule = "frequent"
    workspace_rule: ContinuationRule = "first"
    global_rule: ContinuationRule = "frequent"
    history_rule: ContinuationRule = "frequent"
    scale_step: float = 0.05  # η of the online scale (agspec.policy.length.OnlineScale)
    scale_min: float = 0.05
    scale_max: float = 4.0
    break_even_prob: float = 0.5  # p*, overridden by the cost model when one is given
    # Retrieval engine: "native" (agspec.index.token_index) or "suffix-tree" (arctic-inference's
    # SuffixDecoding tree, agspec.index.suffix_tree; needs the `suffix` extra).
    engine: str = "native"
    session_ttl_s: float = 3600.0
    live_token_budget: int = 50_000_000
    # 0: off. Else the most bytes the corpora that grow (live sessions' session and
    # workspace indexes, the history) may hold, by their indexes' measured size; it
    # lowers the two token budgets above to fit (AgSpecServer.fit_memory_budget).
    memory_budget_bytes: int = 0

    def __post_init__(self) -> None:
        # Types first: a bool or a float where a count goes is a mistake, not a count.
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", "float", "bool") and (
                isinstance(value, bool) != (f.type == "bool")
                or not isinstance(value, (int, float) if f.type == "float" else int)
            ):
                raise ValueError(f"{f.name} must be {f.type}, got {value!r}")
        for name in (
            "cost_prior_weight",
            "scale_step",
            "scale_min",
            "scale_max",
            "break_even_prob",
            "session_ttl_s",
        ):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)!r}")
        if not self.session_ttl_s > 0:
            raise ValueError(f"session_ttl_s must be > 0 seconds, got {self.session_ttl_s}")
        for name in ("live_token_budget", "history_budget_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 token, got {getattr(self, name)}")
        if self.memory_budget_bytes != 0 and self.memory_budget_bytes < MIN_MEMORY_BUDGET_BYTES:
            raise ValueError(
                f"memory_budget_bytes must be 0 (off) or >= {MIN_MEMORY_BUDGET_BYTES} "
                f"(1 MiB), got {self.memory_budget_bytes}"
            )
        if not 0 < self.scale_step <= 1:
            raise ValueError(f"scale_step must be in (0, 1], got {self.scale_step}")
        if not 0 < self.scale_min <= 1.0 <= self.scale_max:
            raise ValueError(
                f"scale_min and scale_max must satisfy 0 < scale_min <= 1 <= scale_max, got "
                f"{self.scale_min} and {self.scale_max}"
            )
        for name in ("session_rule", "workspace_rule", "global_rule", "history_rule"):
            if getattr(self, name) not in get_args(ContinuationRule):
                raise ValueError(
                    f"{name} must be one of {get_args(ContinuationRule)}, got "
                    f"{getattr(self, name)!r}"
                )
        if self.length_mode not in ("static", "match", "cap", "cap+scale", "cost"):
            raise ValueError(f"unknown length_mode {self.length_mode!r}")
        if not 0 <= self.tree_max_nodes <= 256:
            raise ValueError(f"tree_max_nodes must be in [0, 256], got {self.tree_max_nodes}")
        if self.tree_max_nodes > 1 and self.length_mode != "cost":
            raise ValueError(
                f"tree_max_nodes = {self.tree_max_nodes} needs length_mode='cost' (the cost "
                f"rule sizes the tree), got length_mode={self.length_mode!r}"
            )
        if not 1 <= self.tree_occurrences <= 8:
            raise ValueError(f"tree_occurrences must be in [1, 8], got {self.tree_occurrences}")
        if not 1 <= self.tree_branch_tokens <= 64:
            raise ValueError(
                f"tree_branch_tokens must be in [1, 64], got {self.tree_branch_tokens}"
            )
        if not (
            self.cost_free_draft_tokens == 0
            or self.cost_max_draft_tokens <= self.cost_free_draft_tokens <= 256
        ):
            raise ValueError(
                f"cost_free_draft_tokens must be 0 (off) or in [cost_max_draft_tokens = "
                f"{self.cost_max_draft_tokens}, 256], got {self.cost_free_draft_tokens}"
            )
        if not self.cost_prior_weight > 0:
            raise ValueError(f"cost_prior_weight must be > 0, got {self.cost_prior_weight}")
        if not -64 <= self.global_margin_tokens <= 1 << 16:
            raise ValueError(
                f"global_margin_tokens must be in [-64, 65536], got {self.global_margin_tokens}"
            )
        for name in (
            "static_length_tokens",
            "default_cap_tokens",
            "max_match_tokens",
            "min_match_tokens",
            "max_occurrences",
            "cost_max_draft_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0.0 < self.break_even_prob < 1.0:
            raise ValueError("break_even_prob must be in (0, 1)")
        ENGINES.get(self.engine)  # an unknown engine: UnknownNameError, the known ones listed
