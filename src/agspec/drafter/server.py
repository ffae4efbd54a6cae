"""`AgSpecServer`: process-level drafter state (global and history corpora, caps, scales,
acceptance curves, the live-token budget); makes sessions (`agspec.drafter` has the
lifecycle and an example)."""

from __future__ import annotations

import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Any

from agspec._memory import release_free_memory
from agspec.corpora import GlobalCorpus, SessionCorpus, WorkspaceCorpus
from agspec.corpora.corpus_set import SourceRule
from agspec.drafter.config import AgSpecConfig
from agspec.drafter.session import AgSpecSession
from agspec.index.engines import ENGINES
from agspec.index.token_index import ContinuationRule
from agspec.policy.caps import ProfiledCap
from agspec.policy.length import DraftLengthPolicy
from agspec.policy.scale import OnlineScale, OnlineScaleConfig
from agspec.policy.source import Source
from agspec.policy.survival import MatchSurvival
from agspec.policy.tree_size import BranchRates

log = logging.getLogger(__name__)

# With a byte budget, the corpora are fitted to this share of it (the rest is headroom).
MEMORY_FIT_SHARE = 0.9
# A step "costs one decode step" when within this share of it (`cost_free_draft_tokens`).
FREE_COST_TOLERANCE = 0.01


class AgSpecServer:
    """Process-level state: the global corpus, caps, scales; creates sessions."""

    def __init__(
        self,
        *,
        tokenizer: Any,
        global_corpus: GlobalCorpus | None = None,
        config: AgSpecConfig | None = None,
        caps: ProfiledCap | None = None,
        scales_path: str | os.PathLike[str] | None = None,
        model: str = "",
        batch_size: int = 1,
        name: str = "agspec",
        clock: Callable[[], float] = time.monotonic,
        cost_model: Any = None,
        curves_path: str | os.PathLike[str] | None = None,
        save_interval_s: float = 0.0,
    ) -> None:
        if not (isinstance(save_interval_s, (int, float)) and 0 <= save_interval_s < math.inf):
            raise ValueError(
                f"save_interval_s must be a finite number >= 0, got {save_interval_s!r}"
            )
        self.name = name
        # end_session saves the learned state at most this often (0: at every session end);
        # a server that ends many short sessions (agspec serve) saves on a timer and at close.
        self.save_interval_s = float(save_interval_s)
        self._last_save = -math.inf
        self.config = cfg = config or AgSpecConfig()
        self.tokenizer = tokenizer
        self.global_corpus = global_corpus if cfg.use_global else None
        self.separator_id: int | None = getattr(tokenizer, "im_start_id", None)
        self.scales_path = scales_path
        scale_cfg = OnlineScaleConfig(
            step_size=cfg.scale_step, alpha_min=cfg.scale_min, alpha_max=cfg.scale_max
        )
        if scales_path is not None:
            scale = OnlineScale.load(scales_path, p_star=cfg.break_even_prob, config=scale_cfg)
        else:
            scale = OnlineScale(p_star=cfg.break_even_prob, config=scale_cfg)
        step_costs = None
        if cfg.length_mode == "cost":
            if cost_model is None:
                raise ValueError(
                    "length_mode='cost' needs a cost model: pass cost_model= (a "
                    "ProfileCostModel from `agspec costmodel measure`, or a preset from "
                    "agspec.policy.costmodel.get_cost_model)"
                )
            step_costs = self._length_costs(cost_model, batch_size)
        self.lengths = DraftLengthPolicy(
            cfg.length_mode,
            caps=caps or ProfiledCap(default_cap_tokens=cfg.default_cap_tokens),
            scale=scale,
            model=model,
            batch_size=batch_size,
            static_tokens=cfg.static_length_tokens,
            step_costs=step_costs,
            survival=(
                MatchSurvival.load(
                    curves_path,
                    max_tokens=max(cfg.cost_max_draft_tokens, cfg.cost_free_draft_tokens),
                    prior_weight=cfg.cost_prior_weight,
                )
                if curves_path is not None
                else MatchSurvival(
                    max_tokens=max(cfg.cost_max_draft_tokens, cfg.cost_free_draft_tokens),
                    prior_weight=cfg.cost_prior_weight,
                )
            ),
        )
        self.curves_path = curves_path
        self._cost_model = cost_model
        # Normalized step costs by batch size (set_batch_size), the constructor's first.
        self._step_costs_at: dict[int, list[float]] = {}
        if step_costs is not None:
            self._step_costs_at[batch_size] = self.lengths.step_costs
        self.cost_mode = cfg.length_mode == "cost"
        # Token trees (`AgSpecCall.propose_tree`): the node budget (1: chains only), the
        # step costs of verifying 1 .. budget + 1 tokens at this batch size, normalized,
        # and the alternatives' learned rates.
        self.tree_max_nodes = cfg.tree_max_nodes if self.cost_mode else 1
        self.branch_rates = BranchRates()
        # Whether the last batched tree step grew a tree: only then does the next begin
        # copying its candidates while it plans the chains (`agspec.drafter.batch`), so
        # that a profile where trees do not pay copies nothing ahead.
        self.trees_grew = True
        self._tree_costs_at: dict[int, list[float]] = {}
        self.tree_step_costs: list[float] = (
            self._tree_costs(batch_size) if self.tree_max_nodes > 1 else []
        )
        self.min_match_tokens = cfg.min_match_tokens
        self.batch_cost_mode = self.cost_mode and batch_size > 1
        self._sessions: OrderedDict[str, AgSpecSession] = OrderedDict()
        self._live_tokens = 0  # sum of the live sessions' _counted
        self._empty: tuple[SessionCorpus, WorkspaceCorpus] | None = None
        self._clock = clock
        # Hot-path lookups, computed once.
        # The source preference, most preferred first (agspec.corpora.corpus_set.SourceRule): the
        # paper's order, with history (beyond the paper) between global and the live ones.
        self.source_order: list[SourceRule] = (
            [SourceRule("request")]
            if cfg.use_request
            else [
                SourceRule("global", cfg.global_margin_tokens),
                SourceRule("history"),
                SourceRule("workspace"),
                SourceRule("session"),
            ]
        )
        self.rules: dict[Source, ContinuationRule] = {
            "request": cfg.session_rule,
            "session": cfg.session_rule,
            "workspace": cfg.workspace_rule,
            "global": cfg.global_rule,
            "history": cfg.history_rule,
        }
        self.capped_mode = cfg.length_mode in ("cap", "cap+scale")
        self.history: Any = ENGINES.get(cfg.engine)() if cfg.use_history else None
        self._history_docs = 0
        # The token budgets in force: the config's, lowered to fit memory_budget_bytes.
        self.live_token_budget = cfg.live_token_budget
        self.history_budget_tokens = cfg.history_budget_tokens
        self._fitted_tokens = -1  # live + history tokens when the budgets were last fitted

    @classmethod
    def from_variant(
        cls,
        variant: str,
        *,
        tokenizer: Any,
        cost_model: Any = None,
        batch_size: int = 1,
        config: AgSpecConfig | None = None,
        **options: Any,
    ) -> AgSpecServer:
        """AgSpec as variant `variant` of `agspec.drafter.VARIANTS`: the one way the lab,
        `agspec serve`, vLLM and `agspec record` build it, so every field is set alike.

        With a cost model, the online scale's p* is the break-even accept probability of
        that model at `batch_size` (`agspec.policy.costmodel.break_even_accept_prob`), and
        the cost rule prices its drafts with it; without one the variant's own p* stays.
        `config` replaces the variant's configuration (a lab-side override of a named
        config, e.g. a swept setting); `options` are the other keyword arguments of
        `AgSpecServer` (global_corpus, caps, scales_path, curves_path, model, ...); the
        server's `name` defaults to the variant's.

        >>> from agspec.policy.costmodel import get_cost_model
        >>> cost = get_cost_model("h200-qwen2.5-32b")
        >>> s = AgSpecServer.from_variant("agspec-paper", tokenizer=None, cost_model=cost)
        >>> s.name, s.config.break_even_prob == AgSpecServer.from_variant(
        ...     "agspec-paper", tokenizer=None).config.break_even_prob
        ('agspec-paper', False)
        >>> AgSpecServer.from_variant("agspec-papr", tokenizer=None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: unknown AgSpec variant 'agspec-papr'; one of ...
        """
        from dataclasses import replace

        from agspec.drafter.variants import VARIANTS, renamed_hint
        from agspec.policy.costmodel import break_even_accept_prob

        if config is None:
            if variant not in VARIANTS:
                raise ValueError(
                    f"unknown AgSpec variant {variant!r}{renamed_hint(variant)}; one of "
                    + ", ".join(VARIANTS)
                )
            config = VARIANTS[variant]
        if cost_model is not None:
            p_star = float(break_even_accept_prob(cost_model, batch_size))
            config = replace(config, break_even_prob=p_star)
        options.setdefault("name", variant)
        return cls(
            tokenizer=tokenizer,
            config=config,
            cost_model=cost_model,
            batch_size=batch_size,
            **options,
        )

    def _length_costs(self, cost_model: Any, batch_size: int) -> list[float]:
        """The step costs of verifying 1 .. K + 1 tokens at this batch size, K the longest
        draft the cost rule looks at: `cost_free_draft_tokens` where verifying that many
        costs one decode step (within FREE_COST_TOLERANCE), else `cost_max_draft_tokens`.

        On the H200 roofline of a 32B model, 65 tokens cost what 1 does at batch size 1
        (K = 64 with the default's 64) but 2.4 times as much at 8 (K = 32)."""
        cfg = self.config
        top = max(cfg.cost_max_draft_tokens, cfg.cost_free_draft_tokens)
        raw = [cost_model.step_cost(n, batch_size) for n in range(1, top + 2)]
        # Every length up to it, not only the last: a profile extrapolated past its
        # measured lengths grows only by its mean slope, which can be far below a step.
        if max(raw) > raw[0] * (1.0 + FREE_COST_TOLERANCE):
            del raw[cfg.cost_max_draft_tokens + 1 :]
        return raw

    def _tree_costs(self, batch_size: int) -> list[float]:
        """The normalized cost of verifying 1 .. tree_max_nodes + 1 tokens at this batch
        size (computed once per size)."""
        costs = self._tree_costs_at.get(batch_size)
        if costs is None:
            raw = [
                self._cost_model.step_cost(n, batch_size) for n in range(1, self.tree_max_nodes + 2)
            ]
            costs = self._tree_costs_at[batch_size] = DraftLengthPolicy.normalized_costs(raw)
        return costs

    def set_batch_size(self, batch_size: int) -> None:
        """Prices the cost rule (length_mode "cost") at `batch_size` requests per step from
        now on: that batch size's step costs from the cost model (computed once per size),
        the batch form of the rule above 1. The running batch means carry over. Other
        length modes only record it (their caps were looked up when each call began).

        >>> # server.set_batch_size(48)   # vLLM stepped 48 requests this time
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        lengths = self.lengths
        if batch_size == lengths.batch_size:
            return
        if self.cost_mode:
            costs = self._step_costs_at.get(batch_size)
            if costs is None:
                raw = self._length_costs(self._cost_model, batch_size)
                costs = self._step_costs_at[batch_size] = lengths.normalized_costs(raw)
            lengths.step_costs = costs
            self.batch_cost_mode = batch_size > 1
            if self.tree_max_nodes > 1:
                self.tree_step_costs = self._tree_costs(batch_size)
        lengths.batch_size = batch_size

    def set_cost_model(self, cost_model: Any) -> None:
        """Prices the cost rule with `cost_model` from now on (a profile an engine keeps
        correcting from its own timed steps: `agspec.serve.cost_online`): the step costs
        of every batch size are computed again when next used, the current one at once.
        Other length modes only keep it.

        >>> # server.set_cost_model(live_profile)   # after the live medians moved
        """
        self._cost_model = cost_model
        self._step_costs_at.clear()
        if self.cost_mode:
            b = self.lengths.batch_size
            raw = self._length_costs(cost_model, b)
            costs = self._step_costs_at[b] = self.lengths.normalized_costs(raw)
            self.lengths.step_costs = costs

    def open_history(self) -> tuple[Any, int] | None:
        """A new document of the history corpus for one call's output: (index, doc id), or
        None when the history corpus is off. The call appends every token it commits, as
        it commits it, so calls running at the same time draft from each other's answers
        while they are written (as SuffixDecoding's response tree does).

        Past the budget the history is started afresh (the oldest text goes first); calls
        still writing to the old one keep it until they end.
        """
        if self.history is None:
            return None
        if self.history.num_tokens >= self.history_budget_tokens:
            self.history = ENGINES.get(self.config.engine)()
        self._history_docs += 1
        return self.history, self._history_docs

    def save_scales(self) -> None:
        """Writes what the server learned online (atomically) so it survives a restart:
        the per-agent scales to `scales_path`, the acceptance curves of length_mode="cost"
        to `curves_path` (each when given). `end_session` calls it (at most every
        `save_interval_s`); call it at shutdown too."""
        self._last_save = self._clock()
        if self.scales_path is not None and self.lengths.scale is not None:
            self.lengths.scale.save(self.scales_path)
        if self.curves_path is not None and self.cost_mode:
            self.lengths.survival.save(self.curves_path)

    def session(self, session_id: str, *, emission_format: str = "none") -> AgSpecSession:
        if not isinstance(session_id, str) or not session_id:
            got = repr(session_id) if isinstance(session_id, str) else type(session_id).__name__
            raise ValueError(f"session_id must be a non-empty str, got {got}")
        s = self._sessions.get(session_id)
        if s is None:
            self._evict()
            s = AgSpecSession(self, session_id, emission_format)
            self._sessions[session_id] = s
        self.touch(session_id)
        return s

    def get_session(self, session_id: str) -> AgSpecSession:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise KeyError(f"unknown session {session_id!r} (ended or evicted)") from None

    def touch(self, session_id: str) -> None:
        s = self._sessions[session_id]
        s.last_used = self._clock()
        self._sessions.move_to_end(session_id)

    def end_session(self, session_id: str) -> None:
        s = self._sessions.pop(session_id, None)
        if s is not None:
            self._close(s)
        if self._clock() - self._last_save >= self.save_interval_s:
            self.save_scales()

    @property
    def sessions(self) -> MappingProxyType[str, AgSpecSession]:
        """The live sessions by id, least recently used first (a read-only view)."""
        return MappingProxyType(self._sessions)

    @property
    def live_tokens(self) -> int:
        """Tokens held by the live sessions' session and workspace corpora."""
        return self._live_tokens

    def memory_bytes(self) -> int:
        """Bytes held by the corpora that grow: every live session's session and workspace
        index and the history (the indexes' own measure, `TokenIndex.num_bytes`). The
        global corpus is loaded once and is not counted."""
        total = self.history.num_bytes() if self.history is not None else 0
        for s in self._sessions.values():
            total += s.session_corpus.index.num_bytes() + s.workspace.index.num_bytes()
        return total

    def fit_memory_budget(self, current: AgSpecSession | None = None) -> None:
        """With `memory_budget_bytes` set, lowers the live and history token budgets so
        that the corpora that grow fit in it at their measured bytes per token, and evicts
        the least recently used sessions other than `current` past the new live budget.
        The history gets at most a quarter of the tokens. Measured again after every 1/16
        growth (at least 4,096 tokens), at the start of a call; a call's own growth shows
        at the next."""
        budget = self.config.memory_budget_bytes
        if not budget:
            return
        history_tokens = self.history.num_tokens if self.history is not None else 0
        tokens = self._live_tokens + history_tokens
        if self._fitted_tokens >= 0 and abs(tokens - self._fitted_tokens) < max(
            4096, self._fitted_tokens >> 4
        ):
            return
        self._fitted_tokens = tokens
        per_token = self.memory_bytes() / max(tokens, 1)
        # Aim under the budget: the corpora grow between fits (a call's own tokens) and
        # an array that outgrows its capacity is copied into one twice its size.
        allowed = int(MEMORY_FIT_SHARE * budget / max(per_token, 1.0))
        cfg = self.config
        history = min(cfg.history_budget_tokens, allowed // 4) if self.history is not None else 0
        self.history_budget_tokens = max(1, history)
        self.live_token_budget = max(1, min(cfg.live_token_budget, allowed - history))
        if self.history is not None and history_tokens > self.history_budget_tokens:
            self.history = ENGINES.get(cfg.engine)()  # started afresh, as at its budget
            release_free_memory()
        if self._live_tokens > self.live_token_budget:
            # The session starting a call is spared (it stops indexing if alone over).
            if current is not None:
                self._over_budget(current)
            else:
                self._evict()

    def _close(self, s: AgSpecSession) -> None:
        """Ends `s` for good: its calls stop (KeyError) and its corpora are freed, even
        while a caller still holds the session or one of its call objects."""
        s.closed = True
        self._live_tokens -= s._counted
        s._counted = 0
        for call in list(s._calls):
            call._release()
        s._calls.clear()
        if self._empty is None:
            factory = ENGINES.get(self.config.engine)
            self._empty = (
                SessionCorpus(separator_id=self.separator_id, index_factory=factory),
                WorkspaceCorpus(self.tokenizer.encode, "none", index_factory=factory),
            )
        # Closed sessions refuse every use, so they can share one pair of empty corpora.
        s.session_corpus, s.workspace = self._empty
        if self.config.memory_budget_bytes:
            release_free_memory()  # or the freed arrays stay in the process's RSS

    def _grew(self, s: AgSpecSession, num_tokens: int) -> None:
        """`s` indexed `num_tokens` more; keeps the live total within the budget."""
        s._counted += num_tokens
        self._live_tokens += num_tokens
        if self._live_tokens > self.live_token_budget:
            self._over_budget(s)

    def count_committed(self, calls: Sequence[Any], sizes: Sequence[int]) -> None:
        """The live-token bookkeeping of one batched step (`step_batch`): `sizes[i]`
        committed tokens went into the corpora of `calls[i]` (calls of this server), in
        order. Past the live token budget a session stops indexing or is evicted, call by
        call, as `accept` does."""
        live = self._live_tokens
        budget = self.live_token_budget
        if live + sum(sizes) <= budget:
            # Within the budget whatever the order: no call is checked against it.
            for call, k in zip(calls, sizes):
                if call.indexes_output:
                    call.session._counted += k
                    live += k
            self._live_tokens = live
            return
        for call, k in zip(calls, sizes):
            # Checked call by call: going over the budget may stop other calls' indexing.
            if call.indexes_output:
                sess = call.session
                sess._counted += k
                live += k
                if live > budget:
                    self._live_tokens = live
                    self._over_budget(sess)
                    live = self._live_tokens
        self._live_tokens = live

    def within_budget(self, num_tokens: int) -> bool:
        """Whether `num_tokens` more live tokens keep the server within its budget."""
        return self._live_tokens + num_tokens <= self.live_token_budget

    def _over_budget(self, s: AgSpecSession) -> None:
        """Evicts the least recently used other sessions; when `s` alone is over the
        budget, `s` stops indexing (one warning) and drafts from what it holds."""
        budget = self.live_token_budget
        while self._live_tokens > budget:
            victim = next((v for v in self._sessions.values() if v is not s), None)
            if victim is None:
                break
            log.info("evicting session %s to stay within the live token budget", victim.session_id)
            del self._sessions[victim.session_id]
            self._close(victim)
        if self._live_tokens > budget and not s.frozen:
            s.frozen = True
            for call in list(s._calls):
                call._stop_indexing()
            log.warning(
                "session %s alone holds %d tokens, over the live token budget of %d: it "
                "stops indexing new tokens and drafts from what it holds",
                s.session_id,
                s._counted,
                budget,
            )

    def _evict(self) -> None:
        """Drops sessions idle past the TTL, then the oldest while over the token budget."""
        now = self._clock()
        ttl = self.config.session_ttl_s
        # Sessions are in least-recently-used order: the idle ones come first.
        while self._sessions:
            sid, s = next(iter(self._sessions.items()))
            if now - s.last_used <= ttl:
                break
            log.info("evicting idle session %s", sid)
            del self._sessions[sid]
            self._close(s)
        while self._sessions and self._live_tokens > self.live_token_budget:
            sid, s = self._sessions.popitem(last=False)
            log.info("evicting session %s to stay within the live token budget", sid)
            self._close(s)
