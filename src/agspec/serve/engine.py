"""The decode worker of `agspec serve`: one thread owns the llama.cpp model.

Requests become `Job`s in a bounded queue (`submit` raises `QueueFull` past it: the
route answers 503 with Retry-After). The worker takes one job at a time and runs the own
generation loop (`agspec.adapters.llama_cpp.generate`: AgSpec drafting, exact greedy or
sampled verification), with:

- the job's drafter call from its session (`AgSpecServer.session(id).call(agent, ...)`);
- `on_commit` turning each step's tokens into text (`TextStream`: stop strings, UTF-8)
  and handing it to the route as events (`loop.call_soon_threadsafe`);
- `should_stop` checked before every step: the client went away (`job.cancel`), the
  per-request deadline passed, a stop string completed, or the server is aborting.

Everything that touches the drafter state (sessions, scales, curves) runs on this
thread, so the drafter needs no lock; the session resolver (`agspec.drafter.session_inference`) is
thread-safe and is used from both sides. Sessions the resolver drops (TTL, LRU) are
ended on the worker thread before its next job (their trace is written then, with
`--record`).
"""

from __future__ import annotations

import collections
import logging
import math
import queue
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agspec.drafter.protocol import accept_length
from agspec.drafter.session_inference import Resolution, SessionResolver
from agspec.serve.metrics import ServeMetrics, speculative_decoding_metrics
from agspec.serve.schema import APIError, SamplingParams
from agspec.serve.text import TextStream

log = logging.getLogger("agspec.serve")

__all__ = ["Engine", "EngineConfig", "Job", "QueueFull", "Delta", "Finished", "Failed"]


@dataclass(frozen=True)
class EngineConfig:
    model: str = "qwen2.5-coder-0.5b-instruct"
    threads: int = 2
    n_ctx: int = 8192
    n_batch: int = 512
    drafter: str = "agspec"
    cost_profile: str | None = None
    state_dir: str | None = None
    record: str | None = None
    max_queue: int = 32
    request_timeout_s: float = 600.0
    session_ttl_s: float = 3600.0
    max_sessions: int = 256
    session_token_budget: int = 20_000_000
    num_draft_tokens: int = 16
    cache_dir: str | None = None  # model cache


class QueueFull(Exception):
    def __init__(self, retry_after_s: int) -> None:
        super().__init__("queue full")
        self.retry_after_s = retry_after_s


@dataclass
class Delta:
    text: str


@dataclass
class Finished:
    text: str
    finish_reason: str  # stop | length | cancelled
    prompt_tokens: int
    completion_tokens: int
    stats: dict[str, Any]
    answer: dict[str, Any] | None = None  # the assistant message (chat), set by `on_done`
    # vLLM's per-request spec-decode object (`speculative_decoding_metrics`); None when
    # the request was not decoded (cancelled before its first step).
    speculative_decoding: dict[str, Any] | None = None


@dataclass
class Failed:
    error: APIError


Event = Delta | Finished | Failed


@dataclass
class Job:
    prompt_ids: list[int]
    sampling: SamplingParams
    emit: Callable[[Event], None]
    agent: str
    resolution: Resolution
    kind: str = "chat"  # chat | completion
    messages: list[dict[str, Any]] = field(default_factory=list)  # chat: for sessions, traces
    prompt_text: str = ""  # completion
    hold_all: bool = False  # tools: parse the whole answer before sending it
    stream: bool = False
    return_ids: bool = False  # X-AgSpec-Return-Ids: token ids in the `agspec` object
    cancel: threading.Event = field(default_factory=threading.Event)
    deadline: float = math.inf
    submitted: float = field(default_factory=time.monotonic)
    # Called on the worker thread with the finished answer; returns the assistant message
    # (chat: text and parsed tool calls) that the session resolver remembers.
    on_done: Callable[[Finished], dict[str, Any] | None] | None = None


class _TokenizerView:
    """The model's own tokenizer, in the shape `AgSpecServer(tokenizer=...)` reads."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm
        ids = llm.tokenize(b"<|im_start|>", add_bos=False, special=True)
        self.im_start_id: int | None = int(ids[0]) if len(ids) == 1 else None

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self._llm.tokenize(text.encode("utf-8"), add_bos=False)]


class _CountingCall:
    """A drafter call that also counts drafted and accepted tokens per draft source."""

    def __init__(self, inner: Any, metrics: ServeMetrics, agent: str) -> None:
        self.inner = inner
        self.m = metrics
        self.agent = agent
        self._draft: list[int] = []
        self._source = "other"
        self.drafted = 0
        self.accepted = 0
        self.by_source: dict[str, list[int]] = {}

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.inner.begin(prompt_ids)

    def propose(self, max_tokens: int) -> list[int]:
        self._draft = list(self.inner.propose(max_tokens))
        self._source = str(getattr(self.inner, "last_source", None) or "other")
        return self._draft

    def accept(self, committed_ids: Sequence[int]) -> None:
        if self._draft:
            acc = accept_length(self._draft, committed_ids)
            self.drafted += len(self._draft)
            self.accepted += acc
            row = self.by_source.setdefault(self._source, [0, 0])
            row[0] += len(self._draft)
            row[1] += acc
            self.m.drafted.labels(self.agent, self._source).inc(len(self._draft))
            self.m.accepted.labels(self.agent, self._source).inc(acc)
        self._draft = []
        self.inner.accept(committed_ids)

    def end(self) -> None:
        self.inner.end()


def _eog_ids(llama_cpp: Any, llm: Any) -> set[int]:
    """Every end-of-generation token of the vocabulary (llama.cpp stops on each)."""
    vocab = getattr(llm._model, "vocab", None)
    is_eog = getattr(llama_cpp, "llama_vocab_is_eog", None)
    out: set[int] = set()
    if vocab is not None and is_eog is not None:
        for t in range(llm.n_vocab()):
            if is_eog(vocab, t):
                out.add(t)
    out.add(int(llm.token_eos()))
    return out


class Engine:
    """Model, drafter, sessions, metrics and the decode worker."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        progress: Callable[[str], None] = print,
        metrics: ServeMetrics | None = None,
    ) -> None:
        from agspec.adapters.llama_cpp import import_llama_cpp
        from agspec.models import resolve_model
        from agspec.serve.chat import ChatTemplate

        self.config = cfg = config
        self.metrics = metrics or ServeMetrics()
        llama_cpp = import_llama_cpp()
        self.model_path = Path(resolve_model(cfg.model, cfg.cache_dir))
        self.model_name = self._served_name(cfg.model, self.model_path)
        self.cost_profile_path: Path | None = None
        if cfg.drafter != "none":
            self.cost_profile_path = self._cost_profile(progress)
        progress(f"loading {self.model_path} (n_ctx {cfg.n_ctx}, {cfg.threads} threads)")
        self.llm = llama_cpp.Llama(
            model_path=str(self.model_path), n_ctx=cfg.n_ctx, n_batch=cfg.n_batch,
            n_threads=cfg.threads, n_threads_batch=cfg.threads, seed=0, verbose=False,
        )  # fmt: skip
        self.n_ctx = int(self.llm.n_ctx())
        self.eog = _eog_ids(llama_cpp, self.llm)
        self._pieces: dict[int, bytes] = {}
        meta = self.llm.metadata
        template = meta.get("tokenizer.chat_template")
        eos_id, bos_id = self.llm.token_eos(), self.llm.token_bos()
        eos = self.llm._model.token_get_text(eos_id) if eos_id != -1 else ""
        bos = self.llm._model.token_get_text(bos_id) if bos_id != -1 else ""
        self.chat_template = (
            ChatTemplate(template, eos_token=eos, bos_token=bos) if template else None
        )
        self.tokenizer = _TokenizerView(self.llm)
        self.drafter_server = self._make_drafter()
        self.resolver = SessionResolver(ttl_s=cfg.session_ttl_s, max_sessions=cfg.max_sessions)
        self._expired: collections.deque[str] = collections.deque()
        self.resolver.on_expire = self._expired.append
        self._sessions: dict[str, Any] = {}  # session id -> drafter session
        self._turns: dict[str, int] = {}
        self.recorder = None
        if cfg.record:
            from agspec.serve.record import ServeRecorder

            self.recorder = ServeRecorder(
                cfg.record, model=self.model_name, settings=self.settings()
            )
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=cfg.max_queue)
        self._accepting = True
        self._abort = threading.Event()
        self._thread: threading.Thread | None = None
        self._recent_s: collections.deque[float] = collections.deque(maxlen=16)
        self.running = 0

    # --- set-up -------------------------------------------------------------------------

    @staticmethod
    def _served_name(model: str, path: Path) -> str:
        from agspec.models import model_spec

        if path.suffix == ".gguf" and str(model).endswith(".gguf"):
            return path.stem
        try:
            return model_spec(model).name
        except KeyError:
            return path.stem

    def model_names(self) -> set[str]:
        """Every `model` value a request may send for this server."""
        from agspec.models import MODELS

        names = {self.model_name, self.model_path.name, self.model_path.stem}
        for spec in MODELS.values():
            if spec.filename == self.model_path.name:
                names |= {spec.name, *spec.aliases}
        return names

    def _cost_profile(self, progress: Callable[[str], None]) -> Path:
        if self.config.cost_profile:
            path = Path(self.config.cost_profile)
            if not path.is_file():
                raise ValueError(f"--cost-profile {path}: no such file")
            return path
        from agspec.serve.profile_cache import cached_cost_profile

        path, cached = cached_cost_profile(self.model_path, self.config.threads, progress=progress)
        progress(f"cost profile: {path}" + (" (cached)" if cached else " (measured now)"))
        return path

    def _make_drafter(self) -> Any:
        name = self.config.drafter
        if name == "none":
            return None
        from agspec.drafter import VARIANTS, AgSpecServer
        from agspec.policy.costmodel import ProfileCostModel, break_even_accept_prob

        assert self.cost_profile_path is not None
        cost_model = ProfileCostModel.load(self.cost_profile_path)
        # Every AgSpec variant prices its drafts with the measured profile; the default
        # `agspec` takes its length from it (docs/costmodel.md §5b).
        variant = name
        if variant in VARIANTS:
            cfg = replace(
                VARIANTS[variant],
                break_even_prob=float(break_even_accept_prob(cost_model, 1)),
                session_ttl_s=self.config.session_ttl_s,
                live_token_budget=self.config.session_token_budget,
            )
            state = Path(self.config.state_dir) if self.config.state_dir else None
            if state is not None:
                state.mkdir(parents=True, exist_ok=True)
            return AgSpecServer(
                tokenizer=self.tokenizer,
                config=cfg,
                cost_model=cost_model,
                model=self.model_name,
                name=name,
                scales_path=state / "scales.json" if state else None,
                curves_path=state / "curves.json" if state else None,
                # At most one state write per 30 s (and one at close), not one per session.
                save_interval_s=30.0,
            )
        from agspec.lab.registry import drafter_names, make_server

        if name not in drafter_names() or name == "oracle":
            known = ", ".join(["agspec", "none", *[n for n in drafter_names() if n != "oracle"]])
            raise ValueError(f"unknown drafter {name!r}; known: {known}")
        return make_server(
            name, global_docs=[], tokenizer=self.tokenizer, cost_model=cost_model, batch_size=1
        )

    def settings(self) -> dict[str, Any]:
        c = self.config
        return {
            "model": self.model_name,
            "drafter": c.drafter,
            "threads": c.threads,
            "n_ctx": self.n_ctx if hasattr(self, "n_ctx") else c.n_ctx,
            "num_draft_tokens": c.num_draft_tokens,
            "cost_profile": str(self.cost_profile_path) if self.cost_profile_path else None,
        }

    # --- tokens -------------------------------------------------------------------------

    def piece(self, token: int) -> bytes:
        p = self._pieces.get(token)
        if p is None:
            p = bytes(self.llm.detokenize([token]))
            self._pieces[token] = p
        return p

    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        return [int(t) for t in self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos,
                                                  special=special)]  # fmt: skip

    def detokenize(self, tokens: Sequence[int]) -> str:
        return bytes(self.llm.detokenize(list(tokens))).decode("utf-8", errors="ignore")

    # --- queue --------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="agspec-decode", daemon=True)
            self._thread.start()

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    def submit(self, job: Job) -> None:
        if not self._accepting:
            raise APIError(
                503, "the server is shutting down", type="server_error", code="shutting_down"
            )
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            mean = sum(self._recent_s) / len(self._recent_s) if self._recent_s else 1.0
            raise QueueFull(max(1, math.ceil(mean * (self._queue.qsize() + 1)))) from None
        self.metrics.queue_depth.set(self._queue.qsize())

    def close(self, *, timeout_s: float = 30.0) -> None:
        """Stop taking jobs, let the queued ones run (up to `timeout_s`; then abort the
        running one), end every session and save the drafter state."""
        self._accepting = False
        if self._thread is not None:
            deadline = time.monotonic() + timeout_s
            while not self._queue.empty() and time.monotonic() < deadline:
                time.sleep(0.05)
            if not self._queue.empty() or self.running:
                self._abort.set()
            while self._thread.is_alive():  # the queue may be full: wait for room
                try:
                    self._queue.put(None, timeout=0.5)
                    break
                except queue.Full:
                    self._abort.set()
            self._thread.join(timeout=max(1.0, deadline - time.monotonic() + 5.0))
            self._thread = None
        self._end_all_sessions()

    def _end_all_sessions(self) -> None:
        for sid in list(self._sessions):
            self._end_session(sid)
        if self.recorder is not None:
            self.recorder.flush_all()
        self.save_state()

    def save_state(self) -> None:
        save = getattr(self.drafter_server, "save_scales", None)
        if save is not None:
            save()

    # --- the worker -----------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            self.metrics.queue_depth.set(self._queue.qsize())
            if job is None:
                return
            self._drain_expired()
            if job.cancel.is_set():
                self.metrics.cancelled.labels("disconnected").inc()
                job.emit(Finished("", "cancelled", len(job.prompt_ids), 0, {}))
                continue
            if time.monotonic() > job.deadline:
                self.metrics.cancelled.labels("timeout").inc()
                job.emit(Failed(_timeout_error()))
                continue
            self.running = 1
            self.metrics.running.set(1)
            t0 = time.monotonic()
            final: Event
            try:
                final = self._run(job)
            except Exception as exc:  # never let one request take the worker down
                log.exception("generation failed")
                self._reset_cache()
                final = Failed(APIError(500, f"generation failed: {exc}", type="server_error"))
            self.running = 0
            self.metrics.running.set(0)
            self._recent_s.append(time.monotonic() - t0)
            job.emit(final)  # after the slot is free: a client that sees it sees a free slot

    def _reset_cache(self) -> None:
        try:
            self.llm.n_tokens = 0
            self.llm._ctx.kv_cache_seq_rm(-1, 0, -1)
        except Exception:  # pragma: no cover - best effort after a failure
            log.exception("could not reset the KV cache")

    def _drain_expired(self) -> None:
        while self._expired:
            self._end_session(self._expired.popleft())
        self.metrics.sessions.set(len(self.resolver))
        self.metrics.drafter_sessions.set(len(self._sessions))

    def _end_session(self, sid: str) -> None:
        self._turns.pop(sid, None)
        s = self._sessions.pop(sid, None)
        if s is not None:
            s.end()
        if self.recorder is not None:
            self.recorder.flush(sid)

    def _drafter_call(self, sid: str, agent: str, turn: int) -> Any:
        server = self.drafter_server
        if server is None:
            return None
        s = self._sessions.get(sid)
        if s is None or getattr(s, "closed", False):
            s = server.session(sid)
            self._sessions[sid] = s
            self.metrics.drafter_sessions.set(len(self._sessions))
        elif hasattr(server, "touch"):
            server.touch(sid)
        return s.call(agent, "other", turn)

    def _run(self, job: Job) -> Event:
        from agspec.adapters.llama_cpp import Sampling, generate

        m = self.metrics
        agent = m.agent_label(job.agent)
        sid = job.resolution.session_id
        turn = self._turns.get(sid, 0)
        self._turns[sid] = turn + 1
        inner = self._drafter_call(sid, job.agent, turn)
        call = _CountingCall(inner, m, agent) if inner is not None else None
        sp = job.sampling
        room = self.n_ctx - len(job.prompt_ids)
        max_new = room if sp.max_tokens is None else min(sp.max_tokens, room)
        sampling = None
        if not sp.greedy:
            seed = sp.seed if sp.seed is not None else secrets.randbits(32)
            sampling = Sampling(temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p,
                                seed=seed)  # fmt: skip
        text = TextStream(self.piece, stops=sp.stop, eog=self.eog, hold_all=job.hold_all)
        timed_out = False

        def on_commit(tokens: list[int]) -> None:
            text.add(tokens)
            if job.stream:
                delta = text.pending()
                if delta:
                    job.emit(Delta(delta))

        def should_stop() -> bool:
            nonlocal timed_out
            if text.done or job.cancel.is_set() or self._abort.is_set():
                return True
            if time.monotonic() > job.deadline:
                timed_out = True
                return True
            return False

        result = generate(
            self.llm, job.prompt_ids, call, max_new, num_draft_tokens=self.config.num_draft_tokens,
            eos_token_ids=sorted(self.eog), sampling=sampling, on_commit=on_commit,
            should_stop=should_stop,
        )  # fmt: skip
        steps = result.steps
        m.verify_steps.labels(agent).inc(len(steps))
        m.draft_seconds.labels(agent).inc(sum(s.draft_ms for s in steps) / 1000.0)
        m.verify_seconds.labels(agent).inc(sum(s.verify_ms for s in steps) / 1000.0)
        m.prefill_seconds.labels(agent).inc(result.prefill_ms / 1000.0)
        m.prompt_tokens.labels(agent).inc(len(job.prompt_ids))
        m.completion_tokens.labels(agent).inc(text.num_tokens)
        if job.cancel.is_set() and not text.done:
            m.cancelled.labels("disconnected").inc()
            return Finished(text.text, "cancelled", len(job.prompt_ids), text.num_tokens, {})
        if timed_out:
            m.cancelled.labels("timeout").inc()
            return Failed(_timeout_error())
        if self._abort.is_set() and not text.done:
            return Failed(APIError(503, "the server shut down during generation",
                                   type="server_error", code="shutting_down"))  # fmt: skip
        finish = "stop" if text.done else "length"
        stats = {
            "session_id": sid,
            "session_new": job.resolution.is_new,
            "session_known_units": job.resolution.num_known_units,
            "agent": job.agent,
            "turn": turn,
            "steps": len(steps),
            "drafted_tokens": call.drafted if call else 0,
            "accepted_tokens": call.accepted if call else 0,
            "by_source": call.by_source if call else {},
            "reused_prompt_tokens": result.reused_prompt_tokens,
            "prefill_ms": round(result.prefill_ms, 2),
            "decode_ms": round(result.total_ms - result.prefill_ms, 2),
            "total_ms": round(result.total_ms, 2),
        }
        if job.return_ids:
            stats["prompt_ids"] = list(job.prompt_ids)
            stats["output_ids"] = text.tokens[: text.num_tokens]
        done = Finished(text.text, finish, len(job.prompt_ids), text.num_tokens, stats)
        done.speculative_decoding = speculative_decoding_metrics(
            [(s.drafted_tokens, s.accepted_tokens) for s in steps],
            num_draft_tokens=self.config.num_draft_tokens,
        )
        answer = job.on_done(done) if job.on_done is not None else None
        done.answer = answer
        if job.kind == "chat":
            self.resolver.record_messages(job.resolution, job.messages, answer)
        else:
            self.resolver.record_tokens(job.resolution, job.prompt_ids, text.tokens)
        if self.recorder is not None:
            msgs = job.messages if job.kind == "chat" else [
                {"role": "user", "content": job.prompt_text}]  # fmt: skip
            self.recorder.add(
                sid, agent=job.agent, turn=turn, messages=msgs,
                output=text.text,
                live={
                    "agent": job.agent, "turn": turn,
                    "max_new_tokens": max_new,
                    "prompt_tokens": len(job.prompt_ids),
                    "reused_prompt_tokens": result.reused_prompt_tokens,
                    "output_ids": result.tokens,
                    "stopped_by": "stop_string" if text.stopped else result.stopped_by,
                    "prefill_ms": round(result.prefill_ms, 1),
                    "total_ms": round(result.total_ms, 1),
                    "steps": [[s.drafted_tokens, s.accepted_tokens, s.committed_tokens]
                              for s in steps],
                },
            )  # fmt: skip
        return done


def _timeout_error() -> APIError:
    return APIError(504, "the request timed out (--request-timeout)", type="timeout",
                    code="timeout")  # fmt: skip
