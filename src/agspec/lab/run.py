"""A whole replay run: traces in, a run folder out.

The run groups sessions by source (each source is its own experiment: its own split,
its own batches), splits each source's sessions into two folds by a hash of the session
id, and gives every drafter of fold A a global corpus made of fold B's recorded outputs
(and prompts, with `global_prompts=True`), and vice versa. So the global corpus never
holds the session being replayed. Each (source, drafter, batch size) is one
`replay_batched` with fresh servers.

Run folder: `config.json` (every setting, the split stated in words), `steps/` (one
parquet or JSONL file of step records per source, drafter and batch size),
`summary.json` (one entry per source, drafter and batch size, with per-agent and
per-agent-per-turn accept lengths), and `complete.json`, written last: a folder without
it is not a finished run.

Example: sessions `a`, `e`, `b` with `fold_of` 0, 1, 0: sessions `a` and `b` are
replayed with a global corpus of `e`'s outputs, `e` with `a`'s and `b`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import warnings
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agspec._files import atomic_write_text
from agspec.lab.oracle import ORACLE_SCOPES, OracleServer
from agspec.lab.records import ReplayCall, ReplaySession, StepRecorder, write_steps
from agspec.lab.registry import ORACLE_TREE, ORACLES, drafter_names, make_server, preload_drafters
from agspec.lab.simulator import BATCH_COST_RULES, BatchResult, replay_batched
from agspec.policy.caps import ProfiledCap

GLOBAL_SPLITS = ("two-fold", "none")
# Used to turn modelled steps into milliseconds when the cost model has no absolute time.
DEFAULT_DECODE_STEP_MS = 20.0


@dataclass(frozen=True)
class RunConfig:
    """Every setting of a run; written to `config.json`."""

    drafters: tuple[str, ...]
    batch_sizes: tuple[int, ...] = (1, 16)
    cost_model: str = "h200-qwen2.5-32b"
    max_draft_tokens: int = 64
    batch_cost: str = "mean"
    oracle_cap_tokens: int = 64
    oracle_scope: str = "session"
    global_split: str = "two-fold"
    global_prompts: bool = False
    tokenizer: str = "qwen2.5"
    limit_sessions: int | None = None
    decode_step_ms: float | None = None  # None: the cost model's, else DEFAULT_DECODE_STEP_MS
    traces: tuple[str, ...] = ()
    write_steps: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    # B > 1: keep every slot busy until the last session ends, with filler replays that run
    # on servers of their own (`replay_batched(fillers=...)`; docs/replay.md).
    steady_state: bool = False

    def __post_init__(self) -> None:
        if not self.drafters:
            raise ValueError("no drafters given")
        known = drafter_names()
        for name in self.drafters:
            if name not in known:
                raise ValueError(f"unknown drafter {name!r}; known: {', '.join(known)}")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ValueError(f"batch sizes must be >= 1, got {self.batch_sizes}")
        if self.max_draft_tokens < 1 or self.oracle_cap_tokens < 1:
            raise ValueError("max_draft_tokens and oracle_cap_tokens must be >= 1")
        if self.batch_cost not in BATCH_COST_RULES:
            raise ValueError(f"batch_cost must be one of {BATCH_COST_RULES}")
        if self.global_split not in GLOBAL_SPLITS:
            raise ValueError(f"global_split must be one of {GLOBAL_SPLITS}")
        if self.oracle_scope not in ORACLE_SCOPES:
            raise ValueError(f"oracle_scope must be one of {ORACLE_SCOPES}")
        if self.limit_sessions is not None and self.limit_sessions < 1:
            raise ValueError(f"limit_sessions must be >= 1, got {self.limit_sessions}")

    def split_description(self) -> str:
        if self.global_split == "none":
            return "no global corpus: drafters get no text from other sessions"
        what = "outputs and prompts" if self.global_prompts else "outputs"
        return (
            "two-fold disjoint split per source: fold = sha1(session_id) mod 2; the global "
            f"corpus of one fold is the recorded {what} of the other fold's sessions, so it "
            "never holds the session being replayed"
        )


def fold_of(session_id: str) -> int:
    """Fold (0 or 1) of a session: the low bit of sha1 of its id; stable across runs.

    >>> [fold_of(s) for s in ("a", "b", "e", "f")]
    [0, 0, 1, 1]
    """
    return hashlib.sha1(session_id.encode("utf-8")).digest()[-1] & 1


def global_docs_by_fold(
    sessions: Sequence[ReplaySession], *, include_prompts: bool
) -> dict[int, list[list[int]]]:
    """The global corpus each fold sees: every call output (and prompt) of the other fold."""
    docs: dict[int, list[list[int]]] = {0: [], 1: []}
    for s in sessions:
        other = 1 - fold_of(s.session_id)
        for call in s.calls:
            if include_prompts and len(call.prompt_ids):
                docs[other].append(list(call.prompt_ids))
            if len(call.output_ids):
                docs[other].append(list(call.output_ids))
    return docs


def load_sessions(
    paths: Iterable[str | os.PathLike[str]],
    tokenizer: Any,
    *,
    limit_sessions: int | None = None,
    on_session: Callable[[ReplaySession], None] | None = None,
) -> list[ReplaySession]:
    """Read AgSpec-format JSONL traces and tokenize every call (`agspec.traces.render_call`).

    `limit_sessions` keeps the first N sessions of each source (in file order).
    """
    from agspec.traces import read_sessions, render_call

    out: list[ReplaySession] = []
    per_source: dict[str, int] = defaultdict(int)
    for path in paths:
        if not Path(path).is_file():
            raise ValueError(f"trace file not found: {path}")
        for session in read_sessions(path):
            if limit_sessions is not None and per_source[session.source] >= limit_sessions:
                continue
            per_source[session.source] += 1
            calls = []
            for call in session.calls:
                prompt_ids, output_ids = render_call(call, tokenizer)
                calls.append(
                    ReplayCall(
                        agent=call.agent,
                        role=call.role,
                        turn=call.turn,
                        prompt_ids=array("i", prompt_ids),
                        output_ids=list(output_ids),
                        artifacts=tuple((a.path, a.text) for a in call.artifacts),
                    )
                )
            # The scaffold's code-emission format (the first call format other than "none"):
            # a majority vote would pick "none" when the coder makes half the calls.
            emission = session.emission_format
            replay = ReplaySession(
                session_id=session.session_id,
                calls=tuple(calls),
                source=session.source,
                emission_format=emission,
                model=session.model,
            )
            out.append(replay)
            if on_session is not None:
                on_session(replay)
    ids = [s.session_id for s in out]
    if len(set(ids)) != len(ids):
        raise ValueError("session ids repeat across the trace files; each must be unique")
    return out


def resolve_cost_model(spec: str, *, context_tokens: int) -> Any:
    """A cost model by preset name, or from a profile file path (`agspec.policy.costmodel`)."""
    from agspec.policy.costmodel import ProfileCostModel, get_cost_model

    if os.path.exists(spec):
        return ProfileCostModel.load(spec)
    return get_cost_model(spec, context_tokens=context_tokens)


def decode_step_ms_of(cost_model: Any, override: float | None) -> float:
    """ms of one plain decode step, used only with a relative cost model (no `step_time_ms`):
    the override, the model's own attribute, or `DEFAULT_DECODE_STEP_MS`."""
    if override is not None:
        return float(override)
    for attr in ("decode_step_ms", "step_ms"):
        value = getattr(cost_model, attr, None)
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    return DEFAULT_DECODE_STEP_MS


def _agent_tables(recorder: StepRecorder) -> dict[str, Any]:
    """Per-agent, per-role and per-agent-per-turn step counts, accepted and committed tokens."""
    cols = recorder.columns
    by_agent: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    by_turn: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0, 0])
    by_role: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for agent, role, turn, drafted, accepted, committed in zip(
        cols["agent"],
        cols["role"],
        cols["turn"],
        cols["drafted"],
        cols["accepted"],
        cols["committed"],
        strict=True,
    ):
        a = by_agent[agent]
        a[0] += 1
        a[1] += drafted
        a[2] += accepted
        a[3] += committed
        r = by_role[role]
        r[0] += 1
        r[1] += accepted
        r[2] += committed
        t = by_turn[(agent, turn)]
        t[0] += 1
        t[1] += accepted
        t[2] += committed
    per_agent = {
        agent: {
            "num_steps": s,
            "num_drafted_tokens": d,
            "num_accepted_tokens": acc,
            "num_output_tokens": c,
            "mean_accept_length": acc / s,
            "tokens_per_step": c / s,
        }
        for agent, (s, d, acc, c) in sorted(by_agent.items())
    }
    per_role = {
        role: {"num_steps": n, "mean_accept_length": acc / n, "tokens_per_step": c / n}
        for role, (n, acc, c) in sorted(by_role.items())
    }
    per_turn = [
        {"agent": agent, "turn": turn, "num_steps": s, "mean_accept_length": acc / s}
        for (agent, turn), (s, acc, _c) in sorted(by_turn.items())
    ]
    return {"per_agent": per_agent, "per_role": per_role, "per_agent_turn": per_turn}


def make_servers(
    name: str,
    sessions: Sequence[ReplaySession],
    config: RunConfig,
    *,
    tokenizer: Any,
    cost_model: Any,
    batch_size: int,
    caps: ProfiledCap | None = None,
) -> dict[int, Any]:
    """One fresh server per fold (the same server for both folds when there is no split)."""
    if config.global_split == "none":
        folds: dict[int, list[list[int]]] = {0: [], 1: []}
    else:
        folds = global_docs_by_fold(sessions, include_prompts=config.global_prompts)
    servers: dict[int, Any] = {}
    for fold in (0, 1):
        if name in ORACLES:
            tokenize = tokenizer.encode if tokenizer is not None else None
            servers[fold] = OracleServer(
                {s.session_id: [c.output_ids for c in s.calls] for s in sessions},
                global_docs=folds[fold],
                cap_tokens=config.oracle_cap_tokens,
                scope=config.oracle_scope,
                tokenize=tokenize,
                name=name,
                anchored=name == ORACLE_TREE,
            )
        else:
            servers[fold] = make_server(
                name,
                global_docs=folds[fold],
                tokenizer=tokenizer,
                cost_model=cost_model,
                batch_size=batch_size,
                caps=caps,
            )
        if config.global_split == "none":
            servers[1] = servers[0]
            break
    return servers


def run_replay(
    sessions: Sequence[ReplaySession],
    config: RunConfig,
    out_dir: str | os.PathLike[str],
    *,
    tokenizer: Any,
    cost_model_for: Callable[[int], Any] | None = None,
    progress: bool = True,
    jobs: int = 1,
    mark_complete: bool = True,
    caps: ProfiledCap | None = None,
    start_method: str = "fork",
) -> list[dict[str, Any]]:
    """Replay every source x drafter x batch size; write the run folder; return summaries.

    The folder's `complete.json` is written last (`mark_run_complete`; with
    `mark_complete=False` the caller writes it after its own outputs): a folder without it
    is an interrupted, failed or running run, and `agspec report` refuses it.

    `cost_model_for(context_tokens)` gives the cost model of one source (default:
    `resolve_cost_model(config.cost_model, ...)`); `context_tokens` is the source's mean
    prompt length. `caps` (from `agspec profile`) go to every AgSpec server. `jobs > 1`
    runs the replays in that many worker processes, started by `start_method` ("fork":
    the workers inherit the tokenized sessions instead of unpickling them; "spawn" and
    "forkserver" work too, only slower to start): drafting times then share the CPU, so
    compare them only within one run. Every setting reaches a worker in its `RunState`,
    none through a module global, so each start method gives the same replay.
    """
    if start_method not in ("fork", "spawn", "forkserver"):
        raise ValueError(f"start_method must be fork, spawn or forkserver, got {start_method!r}")
    if not sessions:
        raise ValueError("no sessions to replay")
    out = Path(out_dir)
    start_run_folder(out, inputs=config.traces)
    if cost_model_for is None:

        def cost_model_for(context_tokens: int) -> Any:
            return resolve_cost_model(config.cost_model, context_tokens=context_tokens)

    by_source: dict[str, list[ReplaySession]] = defaultdict(list)
    for s in sessions:
        by_source[s.source].append(s)
    sources_info = {}
    cost_models: dict[str, tuple[Any, float]] = {}
    for source, group in by_source.items():
        num_calls = sum(len(s.calls) for s in group)
        context_tokens = int(
            sum(len(c.prompt_ids) for s in group for c in s.calls) / max(num_calls, 1)
        )
        cost_model = cost_model_for(context_tokens)
        measured = getattr(cost_model, "batch_sizes", None)
        if isinstance(measured, tuple) and measured:
            for b in config.batch_sizes:
                if b not in measured:
                    near = min(measured, key=lambda m: (abs(m - b), m))
                    msg = (
                        f"{source}: the cost profile has no curve for batch size {b} "
                        f"(measured: {list(measured)}); batch size {b} is priced by "
                        f"interpolating or by the nearest curve ({near}), which is a guess"
                    )
                    warnings.warn(msg, RuntimeWarning, stacklevel=2)
        step_ms = decode_step_ms_of(cost_model, config.decode_step_ms)
        cost_models[source] = (cost_model, step_ms)
        sources_info[source] = {
            "num_sessions": len(group),
            "num_calls": num_calls,
            "num_output_tokens": sum(s.num_output_tokens for s in group),
            "mean_prompt_tokens": context_tokens,
            "fold_sizes": [sum(1 for s in group if fold_of(s.session_id) == f) for f in (0, 1)],
            "cost_model": repr(cost_model),
            "decode_step_ms": step_ms,
            "absolute_cost_model": callable(getattr(cost_model, "step_time_ms", None)),
        }
    config_json = asdict(config)
    config_json["split"] = config.split_description()
    config_json["jobs"] = jobs
    config_json["sources"] = sources_info
    _write_json(out / "config.json", config_json)

    # Every drafter resolved and its modules imported before the first replay (issue 15).
    first_model = next(iter(cost_models.values()))[0]
    preload_drafters(
        config.drafters,
        tokenizer=tokenizer,
        cost_model=first_model,
        batch_size=max(config.batch_sizes),
    )
    tasks = [
        (source, name, batch_size)
        for source in by_source
        for name in config.drafters
        for batch_size in config.batch_sizes
    ]
    state = RunState(
        by_source=dict(by_source),
        config=config,
        tokenizer=tokenizer,
        cost_models=cost_models,
        out=out,
        caps=caps,
    )
    entries: list[dict[str, Any]] = []
    if jobs <= 1 or len(tasks) <= 1:
        for task in tasks:
            entries.append(_run_task(state, task, progress=progress))
            _write_json(out / "summary.json", {"entries": entries})
    else:
        import multiprocessing

        ctx = multiprocessing.get_context(start_method)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(tasks), desc="replays", unit="replay")
        # The state goes to each worker once, as the initializer's argument (inherited
        # under fork, pickled under spawn), not once per task.
        with ctx.Pool(jobs, initializer=_init_worker, initargs=(state,)) as pool:
            for entry in pool.imap_unordered(_run_task_in_worker, tasks):
                entries.append(entry)
                _write_json(out / "summary.json", {"entries": entries})
                if bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        order = {task: i for i, task in enumerate(tasks)}
        entries.sort(key=lambda e: order[(e["source"], e["drafter"], e["batch_size"])])
    _write_json(out / "summary.json", {"split": config.split_description(), "entries": entries})
    if mark_complete:
        mark_run_complete(out)
    return entries


@dataclass(frozen=True)
class RunState:
    """Everything a replay task of one run reads, handed to it explicitly."""

    by_source: dict[str, list[ReplaySession]]
    config: RunConfig
    tokenizer: Any
    cost_models: dict[str, tuple[Any, float]]  # source -> (cost model, ms of a decode step)
    out: Path
    caps: ProfiledCap | None = None


# A worker process's `RunState`, set once by `_init_worker` when the pool starts it
# (whatever the start method); never set in the parent, which passes its state along.
_WORKER_STATE: list[RunState] = []


def _init_worker(state: RunState) -> None:
    _ignore_sigint()
    _WORKER_STATE[:] = [state]


def _run_task_in_worker(task: tuple[str, str, int]) -> dict[str, Any]:
    return _run_task(_WORKER_STATE[0], task, progress=False)


def _run_task(state: RunState, task: tuple[str, str, int], *, progress: bool) -> dict[str, Any]:
    """Replay one (source, drafter, batch size) and write its step records."""
    source, name, batch_size = task
    config = state.config
    group = state.by_source[source]
    cost_model, step_ms = state.cost_models[source]
    out = state.out

    def servers_by_fold() -> dict[int, Any]:
        return make_servers(
            name,
            group,
            config,
            tokenizer=state.tokenizer,
            cost_model=cost_model,
            batch_size=batch_size,
            caps=state.caps,
        )

    servers = servers_by_fold()
    pairs = [(s, servers[fold_of(s.session_id)]) for s in group]
    fillers = None
    if config.steady_state and batch_size > 1:
        import itertools

        # Fresh servers for the fillers (same folds, same global corpora), so the fillers
        # never add to what a measured session's drafter knows.
        spare = servers_by_fold()
        fillers = itertools.cycle([(s, spare[fold_of(s.session_id)]) for s in group])
    t0 = time.perf_counter()
    result = _replay_with_progress(
        pairs,
        config,
        batch_size=batch_size,
        cost_model=cost_model,
        decode_step_ms=step_ms,
        label=f"{source} {name} B={batch_size}",
        progress=progress,
        fillers=fillers,
    )
    wall_s = time.perf_counter() - t0
    entry = _entry(source, name, result, config, wall_s)
    if config.write_steps:
        # Written in a private folder, then renamed into steps/ whole.
        partial = out / "steps" / f"{_PARTIAL_PREFIX}{os.getpid()}"
        partial.mkdir(exist_ok=True)
        stem = partial / f"{_safe(source)}__{_safe(name)}__b{batch_size}"
        written = write_steps(
            result.recorder,
            stem,
            extra={"source": source, "drafter": name, "batch_size": batch_size},
        )
        path = out / "steps" / written.name
        os.replace(written, path)
        with contextlib.suppress(OSError):
            partial.rmdir()
        entry["steps_file"] = str(path.relative_to(out))
    return entry


def _replay_with_progress(
    pairs: list[tuple[ReplaySession, Any]],
    config: RunConfig,
    *,
    batch_size: int,
    cost_model: Any,
    decode_step_ms: float,
    label: str,
    progress: bool,
    fillers: Any = None,
) -> BatchResult:
    total = sum(s.num_output_tokens for s, _ in pairs)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, desc=label, unit="tok", leave=False, mininterval=0.5)
    pending = [0]

    def on_progress(tokens: int) -> None:
        pending[0] += tokens
        if pending[0] >= 4096 and bar is not None:
            bar.update(pending[0])
            pending[0] = 0

    try:
        return replay_batched(
            pairs,
            batch_size=batch_size,
            cost_model=cost_model,
            max_draft_tokens=config.max_draft_tokens,
            batch_cost=config.batch_cost,
            decode_step_ms=decode_step_ms,
            on_progress=on_progress if bar is not None else None,
            fillers=fillers,
        )
    finally:
        if bar is not None:
            bar.close()


def _entry(
    source: str, name: str, result: BatchResult, config: RunConfig, wall_s: float
) -> dict[str, Any]:
    entry: dict[str, Any] = {"source": source, "drafter": name}
    entry.update(result.summary())
    entry["replay_wall_s"] = wall_s
    entry["split"] = config.global_split
    entry.update(_agent_tables(result.recorder))
    return entry


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def _write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=False) + "\n")


# -- run folder completeness ------------------------------------------------------------

RUN_COMPLETE = "complete.json"
_RUN_FORMAT = "agspec-run-complete"
_PARTIAL_PREFIX = ".partial-"
# What a run writes at the top of its folder (plots: agspec.lab.plots).
_RUN_FILES = ("summary.json", "config.json", "accept_by_turn.png", "speedup.png")


def _ignore_sigint() -> None:
    # Ctrl-C reaches every process of the group: the parent alone reports it (one line)
    # and terminates the workers, which would each print a traceback.
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_run_folder(out: Path, *, inputs: Iterable[str | os.PathLike[str]] = ()) -> None:
    """Makes `out` ready for a new run: first removes the completion marker, then what an
    earlier run wrote there (summary, config, step files, plots), so an interrupted re-run
    can never leave old and new files that look like one complete run."""
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"run folder {out} is a file")
    (out / "steps").mkdir(parents=True, exist_ok=True)
    old = [out / RUN_COMPLETE, *(out / n for n in _RUN_FILES), *out.glob("ablation-*.png")]
    old += [p for p in (out / "steps").iterdir() if p.suffix in (".parquet", ".jsonl")]
    inputs_resolved = {Path(p).resolve() for p in inputs}
    for p in old:
        if p.resolve() in inputs_resolved:
            raise ValueError(f"the run folder {out} holds an input ({p}): choose another -o")
    for p in old:  # the marker first
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    for p in (out / "steps").glob(f"{_PARTIAL_PREFIX}*"):
        shutil.rmtree(p, ignore_errors=True)


def mark_run_complete(out: str | os.PathLike[str]) -> Path:
    """Writes `complete.json`, the last file of a run: when it finished and the size of
    each file the run wrote (summary, config, step files), so a later change is seen."""
    folder = Path(out)
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    names = ["summary.json", "config.json"]
    names += [e["steps_file"] for e in summary.get("entries", []) if "steps_file" in e]
    files = {name: (folder / name).stat().st_size for name in names}
    doc = {
        "format": _RUN_FORMAT,
        "version": 1,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "num_entries": len(summary.get("entries", [])),
        "files": files,
    }
    path = folder / RUN_COMPLETE
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
    return path


def run_incomplete_reason(out: str | os.PathLike[str]) -> str | None:
    """None when the run folder is complete, else why not (one phrase)."""
    folder = Path(out)
    path = folder / RUN_COMPLETE
    if not path.is_file():
        return f"no {RUN_COMPLETE}: the run was interrupted, failed or is still running"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        files = doc["files"]
        if doc.get("format") != _RUN_FORMAT or not isinstance(files, dict):
            return f"{RUN_COMPLETE} is not a completion marker"
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return f"{RUN_COMPLETE} is unreadable"
    for name, size in files.items():
        p = folder / name
        if not p.is_file() or p.stat().st_size != size:
            return f"{name} changed after the run completed"
    return None
