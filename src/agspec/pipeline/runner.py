"""The turn loop: localizer → coder → executor → coder retries, one recorded session.

Each LLM call is built as a trace `Call` first (agent, role, turn, messages, artifacts,
emission format); its prompt ids are `render_call(call)`, exactly what the replay lab
renders, and the model's greedy output fills `call.output`. With a drafter, the session's
AgSpec drafter gets `open_artifact` for each of the call's artifacts, then
`call(agent, role, turn)` drives speculative decoding.

A fresh drafter server is made per session (`server_factory()`), so a session's live
drafts depend on that session alone: recording can resume anywhere and the replay of one
session sees the same drafter state.

Sequence of a session (turn = the call's index in the session, as `docs/traces.md` says):

    0 localizer  READ lines    (issue + file list)
    1 localizer  EDIT lines    (+ the files it asked for)
    2 coder      diff          (issue + the files to change)
      executor   apply + tests → observation
    3 coder      diff          (+ its previous patch + the observation), ... up to max_turns
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agspec.drafter.protocol import CallDrafter, DrafterServer, greedy_commit
from agspec.pipeline import agents
from agspec.pipeline.executor import ExecResult, run_patch, run_tests
from agspec.pipeline.tasks import Task, TaskError, load_task
from agspec.traces import render_call
from agspec.traces.schema import Artifact, Call, Message, Session

__all__ = [
    "PipelineConfig",
    "Generation",
    "LLM",
    "LlamaLLM",
    "ScriptedLLM",
    "CallLive",
    "SessionResult",
    "run_session",
    "SOURCE",
]

SOURCE = "agspec-pipeline"


@dataclass(frozen=True)
class PipelineConfig:
    """Knobs of one recording run (keyword-only: more than two numbers)."""

    max_turns: int = 3  # coder attempts
    max_new_tokens: int = 384  # per coder call
    localizer_max_new_tokens: int = 64
    num_draft_tokens: int = 16  # the draft budget per step, the same in replay
    test_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens", "localizer_max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_draft_tokens < 0:
            raise ValueError(f"num_draft_tokens must be >= 0, got {self.num_draft_tokens}")
        if self.test_timeout_s <= 0:
            raise ValueError(f"test_timeout_s must be > 0, got {self.test_timeout_s}")


@dataclass
class Generation:
    """One model call's result: output ids (with the final EOS when it stopped there)."""

    tokens: list[int]
    text: str
    stopped_by: str  # "eos", "length" or "context"
    steps: list[tuple[int, int, int]] = field(default_factory=list)  # drafted, accepted, committed
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0
    prefill_ms: float = 0.0
    total_ms: float = 0.0


class LLM(Protocol):
    """A greedy model: prompt ids in, `Generation` out, drafting with `drafter` if given."""

    name: str

    def generate(
        self,
        prompt_ids: Sequence[int],
        drafter: CallDrafter | None,
        max_new_tokens: int,
        num_draft_tokens: int,
    ) -> Generation: ...


class LlamaLLM:
    """Qwen2.5-Coder (or any ChatML GGUF) on llama.cpp, through `agspec.adapters.llama_cpp`.

    One `Llama` for every call, so a call whose prompt extends the previous one (the
    localizer's second call, the coder's retries) reuses the KV cache of that prefix.
    """

    def __init__(
        self,
        model_path: str,
        *,
        name: str = "",
        n_ctx: int = 8192,
        n_threads: int = 1,
        tokenizer: str = "qwen2.5",
    ) -> None:
        from agspec.adapters.llama_cpp import import_llama_cpp
        from agspec.tokenizers import get_tokenizer

        llama_cpp = import_llama_cpp()
        self.name = name or model_path
        self.tokenizer = get_tokenizer(tokenizer)
        self.llm = llama_cpp.Llama(
            model_path=str(model_path),
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_batch=512,
            verbose=False,
        )
        self.eos_ids = {self.tokenizer.im_end_id, self.tokenizer.endoftext_id}

    def generate(
        self,
        prompt_ids: Sequence[int],
        drafter: CallDrafter | None,
        max_new_tokens: int,
        num_draft_tokens: int,
    ) -> Generation:
        from agspec.adapters.llama_cpp import generate

        r = generate(
            self.llm,
            prompt_ids,
            drafter,
            max_new_tokens,
            num_draft_tokens=num_draft_tokens,
            eos_token_ids=sorted(self.eos_ids),
        )
        body = r.tokens[:-1] if r.tokens and r.tokens[-1] in self.eos_ids else r.tokens
        return Generation(
            tokens=list(r.tokens),
            text=self.tokenizer.decode(body),
            stopped_by=r.stopped_by,
            steps=[(s.drafted_tokens, s.accepted_tokens, s.committed_tokens) for s in r.steps],
            prompt_tokens=r.prompt_tokens,
            reused_prompt_tokens=r.reused_prompt_tokens,
            prefill_ms=r.prefill_ms,
            total_ms=r.total_ms,
        )


class ScriptedLLM:
    """A fake model for tests: its greedy output is the next scripted reply.

    `replies` maps an agent name to its replies in order (a callable gets the prompt ids
    and returns the text). Drafting runs the real loop: each step's accepted tokens are
    the draft's longest common prefix with the scripted output (which ends with the EOS
    id `im_end`, like a model that stops), plus one bonus token, as in the live loop.
    """

    def __init__(
        self,
        replies: dict[str, list[str]],
        *,
        tokenizer: str = "qwen2.5",
        name: str = "scripted",
    ) -> None:
        from agspec.tokenizers import get_tokenizer

        self.name = name
        self.tokenizer = get_tokenizer(tokenizer)
        self.replies = {k: list(v) for k, v in replies.items()}
        self.next_agent = ""  # set by run_session before each call
        self.prompts: list[list[int]] = []

    def generate(
        self,
        prompt_ids: Sequence[int],
        drafter: CallDrafter | None,
        max_new_tokens: int,
        num_draft_tokens: int,
    ) -> Generation:
        self.prompts.append(list(prompt_ids))
        queue = self.replies.get(self.next_agent, [])
        text = queue.pop(0) if queue else ""
        target = [*self.tokenizer.encode(text), self.tokenizer.im_end_id]
        out: list[int] = []
        steps = []
        if drafter is not None:
            drafter.begin(prompt_ids)
        stopped = "length"
        while len(out) < max_new_tokens:
            want = min(num_draft_tokens, max_new_tokens - len(out) - 1)
            draft = drafter.propose(want)[:want] if drafter is not None and want > 0 else []
            acc, committed = greedy_commit(draft, target, len(out))
            steps.append((len(draft), acc, len(committed)))
            out.extend(committed)
            if drafter is not None:
                drafter.accept(committed)
            if len(out) == len(target):
                stopped = "eos"
                break
        if drafter is not None:
            drafter.end()
        body = out[:-1] if stopped == "eos" else out
        return Generation(out, self.tokenizer.decode(body), stopped, steps, len(prompt_ids))


@dataclass
class CallLive:
    """Live statistics of one call (the sidecar record)."""

    index: int
    agent: str
    turn: int
    max_new_tokens: int
    output_ids: list[int]
    stopped_by: str
    steps: list[tuple[int, int, int]]
    prompt_tokens: int
    reused_prompt_tokens: int
    prefill_ms: float
    total_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "agent": self.agent,
            "turn": self.turn,
            "max_new_tokens": self.max_new_tokens,
            "prompt_tokens": self.prompt_tokens,
            "reused_prompt_tokens": self.reused_prompt_tokens,
            "output_ids": self.output_ids,
            "stopped_by": self.stopped_by,
            "prefill_ms": round(self.prefill_ms, 1),
            "total_ms": round(self.total_ms, 1),
            "steps": [list(s) for s in self.steps],
        }


@dataclass
class SessionResult:
    """A finished session: the trace, its live stats, and how it ended.

    `status`: `passed` (tests pass), `failed` (turn limit), `error` (broken task, model
    error); `detail` says why; `observations` are the executor results in order.
    """

    session: Session
    live: list[CallLive]
    status: str
    detail: str = ""
    observations: list[ExecResult] = field(default_factory=list)
    wall_s: float = 0.0


class _SessionState:
    """Calls so far and the artifacts already shown (path → text)."""

    def __init__(
        self,
        session: Session,
        llm: LLM,
        drafter_session: Any,
        config: PipelineConfig,
        tokenizer: str,
        on_call: Callable[[CallLive], None] | None = None,
    ) -> None:
        self.on_call = on_call
        self.session = session
        self.llm = llm
        self.drafter_session = drafter_session
        self.config = config
        self.tokenizer = tokenizer
        self.shown: dict[str, str] = {}
        self.live: list[CallLive] = []

    def call(
        self,
        agent: str,
        role: str,
        messages: list[Message],
        shown: dict[str, str],
        *,
        emission_format: str,
        phase: str,
        max_new_tokens: int,
    ) -> str:
        """Make one LLM call and record it; returns the output text."""
        artifacts = [
            Artifact(path, text, True)
            for path, text in shown.items()
            if self.shown.get(path) != text
        ]
        self.shown.update(shown)
        turn = len(self.session.calls)
        call = Call(agent, role, turn, list(messages), "", artifacts, emission_format, phase)
        prompt_ids, _ = render_call(call, self.tokenizer)
        drafter = None
        if self.drafter_session is not None:
            for a in artifacts:
                self.drafter_session.open_artifact(a.path, a.text)
            drafter = self.drafter_session.call(agent, role, turn)
        if isinstance(self.llm, ScriptedLLM):
            self.llm.next_agent = agent
        gen = self.llm.generate(prompt_ids, drafter, max_new_tokens, self.config.num_draft_tokens)
        call.output = gen.text
        self.session.calls.append(call)
        self.live.append(
            CallLive(
                turn,
                agent,
                turn,
                max_new_tokens,
                gen.tokens,
                gen.stopped_by,
                gen.steps,
                gen.prompt_tokens or len(prompt_ids),
                gen.reused_prompt_tokens,
                gen.prefill_ms,
                gen.total_ms,
            )
        )
        if self.on_call is not None:
            self.on_call(self.live[-1])
        return gen.text


def run_session(
    task_name: str,
    llm: LLM,
    *,
    server_factory: Callable[[], DrafterServer] | None = None,
    config: PipelineConfig | None = None,
    tokenizer: str = "qwen2.5",
    on_call: Callable[[CallLive], None] | None = None,
) -> SessionResult:
    """Run the pipeline on one task; every failure is recorded, never raised.

    `on_call` sees each call's live stats as soon as it is made (progress display).

    >>> from agspec.pipeline.runner import ScriptedLLM
    >>> llm = ScriptedLLM({"localizer": ["READ pages.py", "EDIT pages.py"], "coder": [
    ...     "--- a/pages.py\\n+++ b/pages.py\\n@@ -5 +5 @@\\n"
    ...     "-    return total // per_page\\n+    return -(-total // per_page)\\n"]})
    >>> r = run_session("paginate", llm)
    >>> r.status, [c.agent for c in r.session.calls]
    ('passed', ['localizer', 'localizer', 'coder'])
    """
    cfg = config or PipelineConfig()
    t0 = time.perf_counter()
    session = Session(f"{SOURCE}/{task_name}", SOURCE, llm.name, task_name, [])
    result = SessionResult(session, [], "error")
    try:
        task = load_task(task_name)
    except (TaskError, OSError) as exc:
        result.detail = f"broken task: {exc}"
        result.wall_s = time.perf_counter() - t0
        return result
    server = server_factory() if server_factory is not None else None
    dsession = (
        server.session(session.session_id, emission_format="unified_diff") if server else None
    )
    state = _SessionState(session, llm, dsession, cfg, tokenizer, on_call)
    try:
        _turns(task, state, result)
    except Exception as exc:  # a model or drafter error ends this session, not the run
        result.status, result.detail = "error", f"{type(exc).__name__}: {exc}"
    finally:
        if dsession is not None:
            dsession.end()
    result.live = state.live
    result.wall_s = time.perf_counter() - t0
    return result


def _turns(task: Task, state: _SessionState, result: SessionResult) -> None:
    cfg = state.config
    paths = list(task.files)
    loc_tokens = min(cfg.localizer_max_new_tokens, cfg.max_new_tokens)
    messages = agents.localizer_read_messages(task.issue, paths)
    reply = state.call(
        agents.LOCALIZER,
        "localize",
        messages,
        {},
        emission_format="none",
        phase="read",
        max_new_tokens=loc_tokens,
    )
    to_read = agents.parse_paths(reply, paths) or task.source_files
    messages = [
        *messages,
        Message("assistant", reply),
        agents.localizer_edit_message(task.files, to_read),
    ]
    reply = state.call(
        agents.LOCALIZER,
        "localize",
        messages,
        {p: task.files[p] for p in to_read},
        emission_format="none",
        phase="choose",
        max_new_tokens=loc_tokens,
    )
    to_edit = [p for p in agents.parse_paths(reply, paths) if p not in task.test_files]
    if not to_edit:
        to_edit = [p for p in to_read if p not in task.test_files] or task.source_files[:1]
    shown = {p: task.files[p] for p in to_edit}
    messages = agents.coder_messages(task.issue, task.files, to_edit)
    for attempt in range(1, cfg.max_turns + 1):
        patch = state.call(
            agents.CODER,
            "code",
            messages,
            shown,
            emission_format="unified_diff",
            phase=f"attempt {attempt}",
            max_new_tokens=cfg.max_new_tokens,
        )
        obs = run_patch(patch, task.files, default_path=to_edit[0], timeout_s=cfg.test_timeout_s)
        result.observations.append(obs)
        if obs.passed:
            result.status, result.detail = "passed", f"tests pass after attempt {attempt}"
            return
        messages = [
            *messages,
            Message("assistant", patch),
            agents.coder_retry_message(obs.observation()),
        ]
    last = result.observations[-1].status
    result.status, result.detail = "failed", f"turn limit {cfg.max_turns} ({last})"


def baseline_check(task: Task, *, timeout_s: float = 30.0) -> tuple[ExecResult, ExecResult]:
    """The task's tests before any patch and after its reference patch (for tests)."""
    before = run_tests(task.files, timeout_s=timeout_s)
    after = run_patch(task.reference_patch, task.files, timeout_s=timeout_s)
    return before, after
