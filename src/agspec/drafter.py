"""The AgSpec drafter: server → session → per-call drafter (paper §3).

    server = AgSpecServer(tokenizer=get_tokenizer("qwen2.5"), global_corpus=g)
    session = server.session("task-42", emission_format="unified_diff")
    session.open_artifact("src/app.py", text)
    call = session.call(agent="coder", role="code", turn=1)
    call.begin(prompt_ids)
    draft = call.propose(32)        # ... the engine verifies ...
    call.accept(committed_ids)      # accepted draft prefix + the bonus token
    call.end()
    session.end()

Per step: the same context is matched in the session, workspace and global corpora
(longest match lengths m_s, m_w, m_g); the draft comes from global only when
m_g > max(m_s, m_w) + δ, else from workspace when m_w > m_s, else from session.
Session and global copy the most frequent next-3-token group (ties: most recent);
workspace copies its first occurrence. Length: L = min(max(1, ⌊α_a·m⌋), C_a), no more
than the tokens available.
"""

from __future__ import annotations

import logging
import math
import os
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, get_args

import numpy as np

from agspec.corpora import GlobalCorpus, SessionCorpus, WorkspaceCorpus
from agspec.corpus_set import CorpusSet, SourceRule, advance_batch, match_lengths_batch
from agspec.costmodel import break_even_accept_prob
from agspec.policy.cost_length import MatchSurvival
from agspec.policy.length import (
    DraftLengthPolicy,
    LengthDecision,
    OnlineScale,
    OnlineScaleConfig,
    ProfiledCap,
)
from agspec.protocol import accept_length
from agspec.token_index import ContinuationRule, TokenIndex, as_tokens

log = logging.getLogger(__name__)

Source = Literal["request", "session", "workspace", "history", "global"]
LengthMode = Literal["static", "match", "cap", "cap+scale", "cost"]


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
    # Retrieval engine: "native" (agspec.token_index) or "suffix-tree" (arctic-inference's
    # SuffixDecoding tree, agspec.engines.arctic; needs the `suffix` extra).
    engine: str = "native"
    session_ttl_s: float = 3600.0
    live_token_budget: int = 50_000_000

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
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; one of {sorted(ENGINES)}")


def _native_index() -> Any:
    return TokenIndex()


def _suffix_tree_index() -> Any:
    from agspec.engines.arctic import SuffixTreeIndex

    # Depth 96 = AgSpec's longest match (64) + SuffixDecoding's longest draft (32): at the
    # tree's default depth 64 a long match leaves no room to draft (docs/baselines.md).
    return SuffixTreeIndex(max_depth=96)


# Retrieval engines by name: a factory of empty indexes.
ENGINES: dict[str, Callable[[], Any]] = {
    "native": _native_index,
    "suffix-tree": _suffix_tree_index,
}


# The ablation ladder of the replay lab, by name.
VARIANTS: dict[str, AgSpecConfig] = {
    "agspec": AgSpecConfig(),
    "agspec-request-only": AgSpecConfig(
        use_request=True, use_session=False, use_workspace=False, use_global=False
    ),
    "agspec-session": AgSpecConfig(use_workspace=False, use_global=False),
    "agspec-session+workspace": AgSpecConfig(use_emission_forms=False, use_global=False),
    "agspec-session+workspace+forms": AgSpecConfig(use_global=False),
    "agspec-static": AgSpecConfig(length_mode="static"),
    "agspec-match": AgSpecConfig(length_mode="match"),
    "agspec-cap": AgSpecConfig(length_mode="cap"),
    "agspec-on-suffix-tree": AgSpecConfig(engine="suffix-tree"),
    # Beyond the paper, each measured in the replay lab (docs/results.md).
    "agspec-recent": AgSpecConfig(session_rule="recent", global_rule="recent"),
    "agspec-history": AgSpecConfig(use_history=True),
    "agspec-gated": AgSpecConfig(min_match_tokens=8),
    # Length from the cost profile and learned acceptance curves (no cap, no α, no gate):
    # drafts only where the expected tokens per unit of step cost beat plain decoding.
    "agspec-cost": AgSpecConfig(length_mode="cost"),
    "agspec-cost-plus": AgSpecConfig(
        length_mode="cost",
        session_rule="recent",
        global_rule="recent",
        history_rule="recent",
        use_history=True,
    ),
    "agspec-plus": AgSpecConfig(
        session_rule="recent",
        global_rule="recent",
        history_rule="recent",
        use_history=True,
        default_cap_tokens=32,
        scale_max=16.0,
    ),
}


def choose_source(m_s: int, m_w: int, m_g: int, margin: int, m_h: int = 0) -> Source | None:
    """The paper's preference: global only when it beats both live matches by > margin.

    `m_h` (history, beyond the paper) wins when strictly longer than both live matches.

    >>> choose_source(3, 5, 9, 4), choose_source(3, 5, 10, 4), choose_source(3, 3, 0, 4)
    ('workspace', 'global', 'session')
    >>> choose_source(3, 5, 0, 4, m_h=6), choose_source(3, 5, 0, 4, m_h=5)
    ('history', 'workspace')
    """
    live = max(m_s, m_w)
    if m_g > max(live, m_h) + margin:
        return "global"
    if m_h > live:
        return "history"
    if m_w > m_s:
        return "workspace"
    if m_s > 0:
        return "session"
    return None


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
    ) -> None:
        self.name = name
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
                    "agspec.costmodel.get_cost_model)"
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
        self.cost_mode = cfg.length_mode == "cost"
        self.batch_cost_mode = self.cost_mode and batch_size > 1
        self._sessions: OrderedDict[str, AgSpecSession] = OrderedDict()
        self._live_tokens = 0  # sum of the live sessions' _counted
        self._empty: tuple[SessionCorpus, WorkspaceCorpus] | None = None
        self._clock = clock
        # Hot-path lookups, computed once.
        # The source preference, most preferred first (agspec.corpus_set.SourceRule): the
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
        self.history: Any = ENGINES[cfg.engine]() if cfg.use_history else None
        self._history_docs = 0

    def add_history(self, output_ids: list[int]) -> None:
        """Adds a finished call's output to the history corpus (when enabled).

        Past the budget the history is started afresh (oldest text goes first).
        """
        if self.history is None or not output_ids:
            return
        if self.history.num_tokens + len(output_ids) > self.config.history_budget_tokens:
            self.history = ENGINES[self.config.engine]()
        self.history.extend_list(self._history_docs, output_ids)
        self._history_docs += 1

    def save_scales(self) -> None:
        """Writes what the server learned online (atomically) so it survives a restart:
        the per-agent scales to `scales_path`, the acceptance curves of length_mode="cost"
        to `curves_path` (each when given). Called at every `end_session`."""
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
            factory = ENGINES[self.config.engine]
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


class AgSpecSession:
    """Session and workspace corpora of one session; `call(...)` makes a drafter."""

    def __init__(self, server: AgSpecServer, session_id: str, emission_format: str) -> None:
        cfg = server.config
        self.server = server
        self.session_id = session_id
        factory = ENGINES[cfg.engine]
        self.session_corpus = SessionCorpus(separator_id=server.separator_id, index_factory=factory)
        self.workspace = WorkspaceCorpus(
            server.tokenizer.encode,
            emission_format,
            with_emission_forms=cfg.use_emission_forms,
            index_factory=factory,
        )
        self.last_used = 0.0
        self.closed = False
        # Over the live token budget on its own: indexes nothing more (AgSpecServer).
        self.frozen = False
        self._counted = 0  # tokens of this session in the server's live total
        self._calls: weakref.WeakSet[AgSpecCall] = weakref.WeakSet()
        self._num_calls = 0

    def _check_open(self) -> None:
        if self.closed:
            raise KeyError(f"session {self.session_id!r} was ended or evicted")

    def open_artifact(self, path: str, text: str) -> int:
        self._check_open()
        if not self.server.config.use_workspace or self.frozen:
            return 0
        before = self.workspace.num_tokens
        self.workspace.open_artifact(path, text)
        added = self.workspace.num_tokens - before
        self.server._grew(self, added)
        return added

    def call(self, agent: str, role: str = "other", turn: int = 0) -> AgSpecCall:
        self._check_open()
        self._num_calls += 1
        call = AgSpecCall(self, agent, role, turn, doc_id=self._num_calls)
        self._calls.add(call)
        return call

    def end(self) -> None:
        """Ends the session: its calls stop and its corpora are freed. Idempotent."""
        if self.server._sessions.get(self.session_id) is self:
            self.server.end_session(self.session_id)
        elif not self.closed:
            self.server._close(self)

    @property
    def num_tokens(self) -> int:
        return self.session_corpus.num_tokens + self.workspace.num_tokens


class AgSpecCall:
    """One model call: `begin / propose / accept / end`.

    The call's corpora (session, workspace, history, global, or its own text only) sit
    behind one `CorpusSet`: a step feeds them the committed tokens in one native call
    and reads their match lengths in another. After `propose`, `last_source` and
    `last_match_length` say where the draft came from.
    """

    def __init__(self, session: AgSpecSession, agent: str, role: str, turn: int, doc_id: int):
        self.session = session
        self.agent, self.role, self.turn = agent, role, turn
        self._doc_id = doc_id
        self._corpora: CorpusSet | None = None
        self._cap = 0
        self._request: Any = None
        self._draft: list[int] = []
        self._output: list[int] = []
        self._decision: LengthDecision | None = None
        self._begun = False
        self._ended = False
        self._released = False  # the session was ended or evicted
        self._index_output = False  # accept() appends to the session corpus
        self.last_source: Source | None = None
        self.last_match_length = 0

    def _release(self) -> None:
        """The session ended or was evicted: drop every reference to its corpora."""
        self._released = self._ended = True
        if self._corpora is not None:
            self._corpora.close()
        self._corpora = None
        self._request = None
        self._output = []
        self._draft = []
        self._decision = None
        self._index_output = False

    def _stop_indexing(self) -> None:
        """The session stopped indexing (over the live token budget on its own)."""
        if self._index_output and self._corpora is not None:
            self._corpora.stop_appending(self.session.session_corpus.index)
        self._index_output = False

    def _not_live(self, what: str) -> Exception:
        if self._released:
            return KeyError(f"{what}: session {self.session.session_id!r} was ended or evicted")
        return RuntimeError(f"{what} needs begin() first and no end()")

    def begin(self, prompt_ids: Sequence[int] | np.ndarray) -> None:
        if self._begun:
            raise RuntimeError("begin() was already called for this call")
        self.session._check_open()
        server = self.session.server
        cfg = server.config
        # Lists go to the corpora as they are (the native side checks the ids it indexes);
        # only the tail can be part of a match, so only the tail feeds the cursors.
        prompt = (
            prompt_ids
            if isinstance(prompt_ids, list)
            else as_tokens(prompt_ids, what="prompt_ids").tolist()
        )
        tail = as_tokens(prompt[-cfg.max_match_tokens :], what="prompt_ids").tolist()
        sess = self.session
        entries: list[tuple[str, Any, ContinuationRule]] = []
        appends: list[tuple[Any, int]] = []
        if cfg.use_session:
            if not sess.frozen:
                before = sess.session_corpus.num_tokens
                sess.session_corpus.add_prompt(self._doc_id, prompt)
                server._grew(sess, sess.session_corpus.num_tokens - before)
            entries.append(("session", sess.session_corpus.index, cfg.session_rule))
            self._index_output = not sess.frozen
            if self._index_output:
                appends.append((sess.session_corpus.index, self._doc_id))
        if cfg.use_workspace:
            entries.append(("workspace", sess.workspace.index, cfg.workspace_rule))
        if server.history is not None:
            entries.append(("history", server.history, cfg.history_rule))
        if server.global_corpus is not None:
            entries.append(("global", server.global_corpus.index, cfg.global_rule))
        if cfg.use_request:
            self._request = ENGINES[cfg.engine]()
            self._request.extend_list(0, prompt)
            entries.append(("request", self._request, cfg.session_rule))
            appends.append((self._request, 0))
        self._corpora = CorpusSet(
            entries,
            tail,
            max_match_tokens=cfg.max_match_tokens,
            appends=appends,
            order=server.source_order,
        )
        lengths = server.lengths
        # The cap of this agent cannot change during a call: look it up once.
        self._cap = lengths.caps.cap_for(
            self.agent, model=lengths.model, batch_size=lengths.batch_size
        )
        self._begun = True

    def propose(self, max_tokens: int) -> list[int]:
        if not self._begun or self._ended:
            raise self._not_live("propose()")
        if max_tokens < 0 or max_tokens > 1 << 16:
            raise ValueError(f"max_tokens must be in [0, 65536], got {max_tokens}")
        self._draft = []
        self.last_source, self.last_match_length = None, 0
        if max_tokens == 0:
            return []
        corpora = self._corpora
        assert corpora is not None
        slot, want, m = self._plan(corpora.match_lengths(), max_tokens)
        if want == 0:
            return []
        draft = corpora.continuation(
            slot, want, max_occurrences=self.session.server.config.max_occurrences
        )
        return self._take(draft, slot, want, m)

    def _plan(self, lengths: list[int], max_tokens: int) -> tuple[int, int, int]:
        """Source slot, draft length and match length for these match lengths (policy)."""
        corpora = self._corpora
        assert corpora is not None
        slot = corpora.pick(lengths)
        if slot < 0:
            return -1, 0, 0
        m = lengths[slot]
        server = self.session.server
        if m < server.config.min_match_tokens:
            return -1, 0, 0
        # An engine with its own length rule (SuffixDecoding's) bounds the draft too.
        want = server.lengths.draft_length(
            self.agent,
            match_tokens=m,
            available_tokens=max_tokens,
            engine_max_tokens=corpora.engine_max_tokens(slot),
        ).draft_tokens
        if server.cost_mode and want:
            # The best length over [0, want] bounds the one over [0, retrieved]; when it is
            # 0 (most short matches on a CPU), skip the continuation altogether.
            want = server.lengths.cost_length(self.agent, m, want)
        return slot, want, m

    def _take(self, draft: list[int], slot: int, want: int, m: int) -> list[int]:
        """Records the draft of this step (after the continuation was copied)."""
        server = self.session.server
        if server.cost_mode and len(draft) < want:
            draft = draft[: server.lengths.cost_length(self.agent, m, len(draft))]
        if not draft:
            return []
        cap = self._cap
        # Censored only when the cap itself bounded the draft (not max_tokens, not text).
        capped = server.capped_mode and len(draft) == want == cap
        self._draft = draft
        self._decision = LengthDecision(len(draft), cap, capped, m)
        assert self._corpora is not None
        self.last_source = self._corpora.names[slot]  # type: ignore[assignment]
        self.last_match_length = m
        return list(draft)

    def _check_committed(self, committed_ids: Sequence[int] | np.ndarray) -> list[int]:
        """The committed tokens as a list, checked against the draft; feeds the policy."""
        if not self._begun or self._ended:
            raise self._not_live("accept()")
        committed = (
            committed_ids
            if isinstance(committed_ids, list)
            else as_tokens(committed_ids, what="committed_ids").tolist()
        )
        n = len(committed)
        draft = self._draft
        if n == 0:
            raise ValueError("committed_ids is empty: a step commits at least one token")
        if n > len(draft) + 1 or committed[: n - 1] != draft[: n - 1]:
            raise ValueError(
                f"committed_ids {committed[:8]} are not a prefix of the draft "
                f"{draft[:8]} plus one token: these tokens were never proposed"
            )
        last = committed[-1]  # the only token not checked against the draft
        if isinstance(last, bool) or not isinstance(last, (int, np.integer)):
            raise TypeError(f"committed_ids[-1] must be an int token id, got {type(last).__name__}")
        if not 0 <= last < 2**31:
            raise ValueError(f"committed_ids[-1] = {last} is outside [0, 2^31)")
        if type(last) is not int:
            committed = [*committed[:-1], int(last)]
        server = self.session.server
        lengths = server.lengths
        if self._decision is not None and draft:
            accepted = accept_length(draft, committed)
            lengths.observe(self.agent, self._decision, accepted)
        if server.batch_cost_mode:
            lengths.note_step(len(draft), n)
        self._draft, self._decision = [], None
        return committed

    def _count(self, n: int) -> None:
        """Bookkeeping after the corpora took `n` committed tokens."""
        if self._index_output:
            sess = self.session
            sess._counted += n
            server = sess.server
            server._live_tokens += n
            if server._live_tokens > server.config.live_token_budget:
                server._over_budget(sess)

    def accept(self, committed_ids: Sequence[int] | np.ndarray) -> None:
        committed = self._check_committed(committed_ids)
        assert self._corpora is not None
        self._corpora.advance(committed)
        if self.session.server.history is not None:
            self._output.extend(committed)
        self._count(len(committed))

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self.session.server.add_history(self._output)
        self._output = []
        if self._corpora is not None:
            self._corpora.close()
        self._corpora = None
        self._request = None
        if not self.session.closed:
            self.session.server.touch(self.session.session_id)


def step_batch(
    calls: Sequence[AgSpecCall],
    committed: Sequence[Sequence[int] | np.ndarray | None],
    max_tokens: Sequence[int] | int,
) -> list[list[int]]:
    """One verification step for many requests at once: accept, then propose.

    `committed[i]` is what the engine committed for `calls[i]` since its last step (its
    accepted draft prefix plus one token; None or empty right after `begin`), and
    `max_tokens[i]` bounds its next draft. Returns the drafts, in order. Equivalent to
    `accept` on every call, then `propose` on every call (so requests of one session see
    each other's tokens of this step), with every corpus of every request moved in one
    native call and every match read in another (one per call with a non-native engine).
    The calls may belong to different sessions of one server, or of several.

    >>> # drafts = step_batch([c1, c2], [[5], [7, 8]], 16)
    """
    n = len(calls)
    if len(committed) != n:
        raise ValueError(f"committed has {len(committed)} entries for {n} calls")
    raw = [max_tokens] * n if isinstance(max_tokens, (int, np.integer)) else list(max_tokens)
    if len(raw) != n:
        raise ValueError(f"max_tokens has {len(raw)} entries for {n} calls")
    for k in raw:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= 1 << 16:
            raise ValueError(f"max_tokens must be ints in [0, 65536], got {k!r}")
    caps = [int(k) for k in raw]
    applied: list[AgSpecCall] = []
    moved: list[list[int]] = []
    try:
        for call, c in zip(calls, committed):
            if c is not None and len(c):
                toks = call._check_committed(c)
                applied.append(call)
                moved.append(toks)
            elif not call._begun or call._ended:
                raise call._not_live("step_batch()")
    finally:
        # Every call whose tokens were checked (its policy already saw them) gets them into
        # its corpora, even when a later call's tokens were refused: no call is left half
        # accepted.
        if applied:
            advance_batch([call._corpora for call in applied], moved)  # type: ignore[misc]
        for call, toks in zip(applied, moved):
            if call.session.server.history is not None:
                call._output.extend(toks)
            call._count(len(toks))
    # Propose: read every match in one call, plan each draft, copy the continuations.
    live: list[AgSpecCall] = []
    for call in calls:
        if not call._begun or call._ended:
            raise call._not_live("step_batch()")
        call._draft = []
        call.last_source, call.last_match_length = None, 0
        live.append(call)
    all_sets = [call._corpora for call in live]
    lengths = match_lengths_batch(all_sets)  # type: ignore[arg-type]
    plans = [call._plan(ls, k) if k > 0 else (-1, 0, 0) for call, ls, k in zip(live, lengths, caps)]
    drafts: list[list[int]] = []
    for call, (slot, want, m) in zip(live, plans):
        if want == 0:
            drafts.append([])
            continue
        corpora = call._corpora
        assert corpora is not None
        draft = corpora.continuation(
            slot, want, max_occurrences=call.session.server.config.max_occurrences
        )
        drafts.append(call._take(draft, slot, want, m))
    return drafts


def _break_even(cost_model: Any, batch_size: int) -> float | None:
    """p* from `agspec.costmodel` when a cost model is given (None: keep the default)."""
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


# Picked up by agspec.replay.registry: every variant is a replay drafter by its name.
REPLAY_DRAFTERS = {name: replay_factory(name) for name in VARIANTS}
