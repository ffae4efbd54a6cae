"""The decode worker of `agspec serve`: one thread owns the llama.cpp model.

Requests become `Job`s in a bounded waiting queue (`submit` raises `QueueFull` past it:
the route answers 503 with Retry-After). The worker (`agspec.serve.batching.BatchLoop`)
runs up to `--parallel` jobs at once, one slot each, in one llama.cpp batch per step,
with:

- each job's drafter call from its session (`AgSpecServer.session(id).call(agent, ...)`),
  all of them stepped together (`step_batch`);
- each step's committed tokens turned into text (`TextStream`: stop strings, UTF-8) and
  handed to the route as events (`loop.call_soon_threadsafe`);
- checks before every step: the client went away (`job.cancel`), the per-request time
  bound passed (504), a stop string completed, or the server is aborting; a job that
  waits for a slot past `--queue-timeout` gets 503 with Retry-After.

Everything that touches the drafter state (sessions, scales, curves) runs on this
thread, so the drafter needs no lock; the session resolver (`agspec.drafter.session_inference`) is
thread-safe and is used from both sides. Sessions the resolver drops (TTL, LRU) are
ended on the worker thread before its next step (their trace is written then, with
`--record`).
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agspec.drafter.session_inference import Resolution, SessionResolver
from agspec.serve.metrics import ServeMetrics
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
    live_cost: bool = True  # correct the cost profile online from the server's own steps
    state_dir: str | None = None
    record: str | None = None
    max_queue: int = 32
    request_timeout_s: float = 600.0
    session_ttl_s: float = 3600.0
    max_sessions: int = 256
    session_token_budget: int = 20_000_000
    memory_budget_bytes: int = 0  # 0: off; else the drafter corpora's byte budget
    num_draft_tokens: int = 16
    cache_dir: str | None = None  # model cache
    parallel: int = 4  # slots: requests decoded together in one batch
    prefill_chunk: int = 256  # prompt tokens per step while other requests decode
    queue_timeout_s: float = 120.0  # longest wait for a slot before a 503
    kv_store_bytes: int = 1 << 30  # host memory for saved slot KV; 0: off


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
    final: Finished | Failed | None = None  # the outcome, as the route received it


class _TokenizerView:
    """The model's own tokenizer, in the shape `AgSpecServer(tokenizer=...)` reads."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm
        ids = llm.tokenize(b"<|im_start|>", add_bos=False, special=True)
        self.im_start_id: int | None = int(ids[0]) if len(ids) == 1 else None

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self._llm.tokenize(text.encode("utf-8"), add_bos=False)]


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
        from agspec.serve.drafter_setup import make_drafter, resolve_cost_profile, start_live_cost

        self.config = cfg = config
        self.metrics = metrics or ServeMetrics()
        llama_cpp = import_llama_cpp()
        self.model_path = Path(resolve_model(cfg.model, cfg.cache_dir))
        self.model_name = self._served_name(cfg.model, self.model_path)
        self.cost_profile_path: Path | None = None
        if cfg.drafter != "none" or cfg.parallel > 1:
            # The drafter prices its drafts with it; with several slots the scheduler reads
            # it for how many requests one step decodes (`BatchLoop._decode_width`).
            self.cost_profile_path = resolve_cost_profile(cfg, self.model_path, progress)
        _check_batching(cfg)
        progress(
            f"loading {self.model_path} ({cfg.parallel} slots of {cfg.n_ctx} tokens, "
            f"{cfg.threads} threads)"
        )
        # The Llama object gives the model and its tokenizer; decoding runs in the slots'
        # own context (`BatchLoop`), so its context is kept small.
        self.llm = llama_cpp.Llama(
            model_path=str(self.model_path), n_ctx=256, n_batch=256,
            n_threads=cfg.threads, n_threads_batch=cfg.threads, seed=0, verbose=False,
        )  # fmt: skip
        self.n_ctx = cfg.n_ctx
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
        self.drafter_server = make_drafter(
            cfg,
            tokenizer=self.tokenizer,
            model_name=self.model_name,
            cost_profile_path=self.cost_profile_path,
        )
        self.live_cost: Any = None  # LiveCostProfile: the start-up profile, healed online
        self.cost_summary: dict[str, Any] | None = None  # its last snapshot, for /health
        self._cost_version = -1
        if self.cost_profile_path is not None and cfg.live_cost and self.drafter_server is not None:
            self.live_cost = start_live_cost(
                self.cost_profile_path, progress, max_tokens=cfg.num_draft_tokens + 1
            )
            self._refresh_cost(force=True)
        # What a step of B requests costs, for the scheduler: the live profile, else the
        # profile as given (None: one slot, no drafter; every decoding request steps).
        self.step_costs: Any = self.live_cost
        if self.step_costs is None and self.cost_profile_path is not None:
            from agspec.policy.costmodel import ProfileCostModel

            self.step_costs = ProfileCostModel.load(self.cost_profile_path)
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
        self._waiting: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._accepting = True
        self.worker_failed = False  # the decode worker stopped on an error it could not survive
        self._abort = threading.Event()
        self._thread: threading.Thread | None = None
        self._recent_s: collections.deque[float] = collections.deque(maxlen=16)
        self.running = 0
        from agspec.serve.batching import BatchLoop

        self.loop = BatchLoop(self)

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

    def _observe_step(
        self, batch_size: int, total_tokens: int, ms: float, *, filler: int = 0
    ) -> None:
        """A timed decoding step (worker thread; `filler`: the tokens of a probe it carried): a
        live cost sample; every 16 steps the drafter is repriced if the live curve moved."""
        live = self.live_cost
        if live is None:
            return
        step = self.loop.num_steps
        live.add(batch_size, total_tokens, ms, step=step, probe=filler > 0, filler=filler)
        if step % 16 == 0:
            self._refresh_cost()

    def _refresh_cost(self, *, force: bool = False) -> None:
        live = self.live_cost
        if live is None or (live.version == self._cost_version and not force):
            return
        self._cost_version = live.version
        setter = getattr(self.drafter_server, "set_cost_model", None)
        if setter is not None and live.num_samples:
            setter(live)
        summary = live.summary()
        self.cost_summary = summary
        self.metrics.cost_samples.set(summary["live_samples"])
        for b, costs in summary["step_cost"].items():
            for n, c in costs.items():
                self.metrics.step_cost.labels(b, n).set(c)

    def settings(self) -> dict[str, Any]:
        c = self.config
        return {
            "model": self.model_name,
            "drafter": c.drafter,
            "threads": c.threads,
            "n_ctx": self.n_ctx if hasattr(self, "n_ctx") else c.n_ctx,
            "parallel": c.parallel,
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

    # --- queue ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="agspec-decode", daemon=True)
            self._thread.start()

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    def submit(self, job: Job) -> None:
        if not self._accepting:
            raise APIError(
                503, "the server is shutting down", type="server_error", code="shutting_down"
            )
        with self._cond:
            # Under the lock the worker takes to drain the queue when it stops: a job is
            # either refused here or failed by that drain, never left waiting.
            if self.worker_failed:
                raise _worker_stopped()
            if len(self._waiting) >= self.config.max_queue:
                raise QueueFull(self._retry_after())
            self._waiting.append(job)
            self._cond.notify()
        self.metrics.queue_depth.set(len(self._waiting))

    def _retry_after(self) -> int:
        from agspec.serve.batching import retry_after_s

        return retry_after_s(list(self._recent_s), len(self._waiting), self.config.parallel)

    def close(self, *, timeout_s: float = 30.0) -> None:
        """Stop taking jobs, let the queued and running ones finish (up to `timeout_s`;
        then abort the rest), end every session and save the drafter state."""
        self._accepting = False
        if self._thread is not None:
            deadline = time.monotonic() + timeout_s
            with self._cond:
                self._stopping = True
                self._cond.notify_all()
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if self._thread.is_alive():
                self._abort.set()
                with self._cond:
                    self._cond.notify_all()
                self._thread.join(timeout=10.0)
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

    # --- the worker's side of the queue (called by `BatchLoop` on the worker thread) -------

    def _work(self) -> None:
        try:
            self.loop.run()
        except BaseException:
            # Not expected (the loop survives a failing step or admission): no request is
            # left waiting for a worker that is gone, and /health says so.
            log.exception("the decode worker stopped")
            with self._cond:
                self.worker_failed = True
                jobs = list(self._waiting)
                self._waiting.clear()
            jobs += [r.job for r in self.loop.slots if r is not None]
            for job in jobs:
                job.emit(self._failed(_worker_stopped()))
            raise

    def _should_exit(self) -> bool:
        """Nothing runs: the worker may end once the server is closing and the queue is
        empty (or the drain was cut short)."""
        with self._cond:
            return self._stopping and (not self._waiting or self._abort.is_set())

    def _wait_for_work(self, timeout_s: float) -> None:
        with self._cond:
            if not self._waiting and not self._stopping:
                self._cond.wait(timeout_s)

    def _pop_waiting(self) -> Job | None:
        with self._cond:
            job = self._waiting.popleft() if self._waiting else None
        self.metrics.queue_depth.set(len(self._waiting))
        return job

    def _take_expired_waiting(self, now: float) -> list[Job]:
        """Waiting jobs that must leave the queue: cancelled, past their time bound, past
        the queue timeout (no slot came free in time), or the server is aborting."""
        limit = self.config.queue_timeout_s
        with self._cond:
            if not self._waiting:
                return []
            out = [
                j for j in self._waiting
                if j.cancel.is_set() or now > j.deadline or now - j.submitted > limit
                or self._abort.is_set()
            ]  # fmt: skip
            for j in out:
                self._waiting.remove(j)
        if out:
            self.metrics.queue_depth.set(len(self._waiting))
        return out

    def _no_slot_error(self) -> APIError:
        if self._abort.is_set():
            return APIError(503, "the server shut down before the request got a slot",
                            type="server_error", code="shutting_down")  # fmt: skip
        return APIError(
            503,
            f"the server is busy: no slot came free within {self.config.queue_timeout_s:g} s "
            f"(--queue-timeout; {self.config.parallel} slots); retry later",
            type="server_error",
            code="no_free_slot",
            headers={"Retry-After": str(self._retry_after())},
        )

    @staticmethod
    def _finished_empty(job: Job) -> Finished:
        return Finished("", "cancelled", len(job.prompt_ids), 0, {})

    @staticmethod
    def _failed(err: APIError) -> Failed:
        return Failed(err)

    def fail_session(self, sid: str) -> None:
        """A request of session `sid` failed with a server error: forget the session's
        boundaries, so that no later request is joined to it unchecked (it starts a new
        session), and end its drafter session on the worker, before its next job. Safe
        from any thread."""
        self.resolver.forget(sid)
        self._expired.append(sid)

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

    def _complete(
        self,
        job: Job,
        *,
        text: TextStream,
        finish: str,
        sid: str,
        turn: int,
        max_new: int,
        steps: Sequence[tuple[int, int, int]],
        by_source: dict[str, list[int]],
        reused: int,
        tokens: list[int],
        stopped_by: str,
        prefill_ms: float,
        total_ms: float,
        queued_ms: float,
        speculative_decoding: dict[str, Any],
    ) -> None:
        """A job decoded to its end: its answer, the session's memory of it, its trace."""
        stats = {
            "session_id": sid,
            "session_new": job.resolution.is_new,
            "session_known_units": job.resolution.num_known_units,
            "agent": job.agent,
            "turn": turn,
            "steps": len(steps),
            "drafted_tokens": sum(s[0] for s in steps),
            "accepted_tokens": sum(s[1] for s in steps),
            "by_source": by_source,
            "reused_prompt_tokens": reused,
            "queued_ms": round(queued_ms, 2),
            "prefill_ms": round(prefill_ms, 2),
            "decode_ms": round(total_ms - prefill_ms, 2),
            "total_ms": round(total_ms, 2),
        }
        if job.return_ids:
            stats["prompt_ids"] = list(job.prompt_ids)
            stats["output_ids"] = text.tokens[: text.num_tokens]
        done = Finished(text.text, finish, len(job.prompt_ids), text.num_tokens, stats)
        done.speculative_decoding = speculative_decoding
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
                    "reused_prompt_tokens": reused,
                    "output_ids": tokens,
                    "stopped_by": stopped_by,
                    "prefill_ms": round(prefill_ms, 1),
                    "total_ms": round(total_ms, 1),
                    "steps": [list(s) for s in steps],
                },
            )  # fmt: skip
        job.emit(done)


def _worker_stopped() -> APIError:
    return APIError(
        503,
        "the server's decode worker stopped on an error (see the server log): restart the server",
        type="server_error",
        code="worker_stopped",
    )


def _check_batching(cfg: EngineConfig) -> None:
    """The slots' batch must hold every slot's pending token and longest draft."""
    if not 1 <= cfg.parallel <= 64:
        raise ValueError(f"--parallel must be an int in [1, 64], got {cfg.parallel}")
    if cfg.prefill_chunk < 1:
        raise ValueError(f"--prefill-chunk must be an int >= 1, got {cfg.prefill_chunk}")
    need = cfg.parallel * (cfg.num_draft_tokens + 1)
    if need > cfg.n_batch:
        raise ValueError(
            f"--parallel {cfg.parallel} x (--num-draft-tokens {cfg.num_draft_tokens} + 1) = "
            f"{need} tokens per step do not fit --n-batch {cfg.n_batch}"
        )
    if not (math.isfinite(cfg.queue_timeout_s) and cfg.queue_timeout_s > 0):
        raise ValueError(f"--queue-timeout must be a number > 0, got {cfg.queue_timeout_s}")
