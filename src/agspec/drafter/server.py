"""`AgSpecServer`: process-level drafter state (global and history corpora, caps, scales,
acceptance curves, the live-token budget); makes sessions (`agspec.drafter` has the
lifecycle and an example)."""

from __future__ import annotations

import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

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

log = logging.getLogger(__name__)


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
            step_costs = [
                cost_model.step_cost(n, batch_size) for n in range(1, cfg.cost_max_draft_tokens + 2)
            ]
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
                    max_tokens=cfg.cost_max_draft_tokens,
                    prior_weight=cfg.cost_prior_weight,
                )
                if curves_path is not None
                else MatchSurvival(
                    max_tokens=cfg.cost_max_draft_tokens, prior_weight=cfg.cost_prior_weight
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
                raw = [
                    self._cost_model.step_cost(n, batch_size)
                    for n in range(1, self.config.cost_max_draft_tokens + 2)
                ]
                costs = self._step_costs_at[batch_size] = lengths.normalized_costs(raw)
            lengths.step_costs = costs
            self.batch_cost_mode = batch_size > 1
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
            top = self.config.cost_max_draft_tokens + 1
            raw = [cost_model.step_cost(n, b) for n in range(1, top + 1)]
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
        if self.history.num_tokens >= self.config.history_budget_tokens:
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
            raise ValueError("session_id must be a non-empty str")
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
    def live_tokens(self) -> int:
        """Tokens held by the live sessions' session and workspace corpora."""
        return self._live_tokens

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

    def _grew(self, s: AgSpecSession, num_tokens: int) -> None:
        """`s` indexed `num_tokens` more; keeps the live total within the budget."""
        s._counted += num_tokens
        self._live_tokens += num_tokens
        if self._live_tokens > self.config.live_token_budget:
            self._over_budget(s)

    def _over_budget(self, s: AgSpecSession) -> None:
        """Evicts the least recently used other sessions; when `s` alone is over the
        budget, `s` stops indexing (one warning) and drafts from what it holds."""
        budget = self.config.live_token_budget
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
        while self._sessions and self._live_tokens > self.config.live_token_budget:
            sid, s = self._sessions.popitem(last=False)
            log.info("evicting session %s to stay within the live token budget", sid)
            self._close(s)
