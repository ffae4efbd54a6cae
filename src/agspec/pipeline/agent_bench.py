"""A real coding agent (mini-swe-agent) on the bundled tasks, against local servers.

The agent is unmodified mini-swe-agent (its own virtualenv, `scripts/install_agent.sh`),
run the way its docs describe for a local model: the local environment, the text-based
model class and its `mini_textbased.yaml`, litellm pointed at an OpenAI-compatible
server. The same tasks run back to back against, one server at a time, each on a free
port and started and stopped here:

- `agspec`: `agspec serve` (AgSpec drafting in the own llama.cpp loop);
- `agspec-none`: `agspec serve --drafter none` (plain greedy decoding, same code path);
- `llama-cpp`: llama-cpp-python's own server, `python -m llama_cpp.server`;
- `llama-cpp-pld`: the same with its prompt-lookup draft model
  (`--draft_model prompt-lookup-decoding`);
- `llama-server`: llama.cpp's own server, built from the vendored source
  (`scripts/install_llama_server.sh`), one slot;
- `llama-server-ngram-mod`: the same with `--spec-type ngram-mod`, its strongest n-gram
  drafter on these traces (`docs/serve-parallel.md`).

The default is `agspec`, `agspec-none` and the two `llama-server` ones. Same model,
threads and context for all; greedy (`temperature=0`), a step limit and a
per-call `max_tokens` so a 0.5B model cannot loop for ever. Every session runs in a fresh
copy of the task's repo (always at the same path, files with a fixed mtime, so that what
the agent sees does not depend on the server). Between the agent and the server sits a
small forwarding proxy that times each request and keeps request and response, so the
figures come from the HTTP exchange itself: per call the wall time and the response's
`usage.completion_tokens`; the call's role is `agspec.traces.roles.infer_role` of the
action it emitted (`other` when it emitted no single action). Task success is the task's
own tests (the original test files, over the source files as the agent left them).

    flock /tmp/agspec-bench.lock python benchmarks/bench_serve_agent.py \\
        --tasks paginate,leap-years,word-count --step-limit 6 --out /tmp/serve-agent.json

(`python -m agspec.pipeline.agent_bench` is the same; its bookkeeping is tested in
tests/serve/test_agent.py.)

`--quick` runs one task, 3 steps, 2 servers, as a smoke test (a couple of minutes).
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# The source checkout (scripts/install_agent.sh installs the agent when --agent-python is
# not given); the package's own data comes from the package.
REPO = Path(__file__).resolve().parents[3]
DATA = Path(__file__).resolve().parents[1] / "data"
SERVERS = (
    "agspec",
    "agspec-none",
    "llama-cpp",
    "llama-cpp-pld",
    "llama-server",
    "llama-server-ngram-mod",
)
DEFAULT_SERVERS = ("agspec", "agspec-none", "llama-server", "llama-server-ngram-mod")
# mini_textbased.yaml's action format (LitellmTextbasedModelConfig.action_regex).
ACTION = re.compile(r"```mswea_bash_command\s*\n(.*?)\n```", re.S)
DEFAULT_PROFILE = DATA / "costmodels/epyc2t-llamacpp-qwen2.5-coder-0.5b-ctx1024.json"
FIXED_MTIME = 1_700_000_000  # what `ls -l` shows for every file of a fresh task copy


# ---------------------------------------------------------------------------------------
# The proxy: forwards every request to the server, times it, keeps both bodies.


class Exchange(dict):  # type: ignore[type-arg]
    """One proxied request: tag, path, t_start, t_end, status, request, response."""


class RecordingProxy:
    """A forwarding HTTP proxy on 127.0.0.1 for one upstream server at a time."""

    def __init__(self) -> None:
        self.upstream: tuple[str, int] | None = None
        self.tag = ""
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_GET(self) -> None:  # noqa: N802
                self._forward(b"")

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                self._forward(self.rfile.read(n))

            def _forward(self, body: bytes) -> None:
                assert proxy.upstream is not None, "proxy has no upstream"
                headers = {"Content-Type": self.headers.get("Content-Type", "application/json")}
                for name in ("Authorization", "Accept"):
                    if self.headers.get(name):
                        headers[name] = self.headers[name]
                tag = proxy.tag
                t0 = time.perf_counter()
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=3600)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    status, ctype = resp.status, resp.getheader("Content-Type", "")
                except OSError as exc:
                    data = json.dumps({"error": {"message": f"proxy: {exc}"}}).encode()
                    status, ctype = 502, "application/json"
                finally:
                    conn.close()
                t1 = time.perf_counter()
                if self.command == "POST":
                    proxy._record(tag, self.path, t0, t1, status, body, data)
                self.send_response(status)
                self.send_header("Content-Type", ctype or "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _record(
        self, tag: str, path: str, t0: float, t1: float, status: int, body: bytes, data: bytes
    ) -> None:
        def parse(raw: bytes) -> Any:
            try:
                return json.loads(raw)
            except ValueError:
                return raw.decode("utf-8", "replace")

        ex = Exchange(
            tag=tag,
            path=path,
            t_start=t0,
            t_end=t1,
            status=status,
            request=parse(body),
            response=parse(data),
        )
        with self._lock:
            self.exchanges.append(ex)

    def take(self, tag: str) -> list[Exchange]:
        with self._lock:
            mine = [e for e in self.exchanges if e["tag"] == tag]
            self.exchanges = [e for e in self.exchanges if e["tag"] != tag]
        return mine

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


# ---------------------------------------------------------------------------------------
# The servers.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(
    name: str, args: argparse.Namespace, model: Path, port: int, run_dir: Path
) -> list[str]:
    common = ["--host", "127.0.0.1", "--port", str(port)]
    if name in ("agspec", "agspec-none"):
        cmd = [
            args.agspec_python,
            "-m",
            "agspec",
            "serve",
            "--model",
            str(model),
            *common,
            "--threads",
            str(args.threads),
            "--n-ctx",
            str(args.n_ctx),
            "--drafter",
            "agspec" if name == "agspec" else "none",
            "--record",
            str(run_dir / f"{name}.record.jsonl"),
        ]
        if args.cost_profile:
            cmd += ["--cost-profile", args.cost_profile]
        cmd += ["--state-dir", args.state_dir or str(run_dir / f"{name}.state")]
        return cmd
    if name in ("llama-cpp", "llama-cpp-pld"):
        # llama_cpp.server takes its ModelSettings fields as --field_name flags.
        cmd = [
            args.llama_python,
            "-m",
            "llama_cpp.server",
            "--model",
            str(model),
            *common,
            "--n_threads",
            str(args.threads),
            "--n_threads_batch",
            str(args.threads),
            "--n_ctx",
            str(args.n_ctx),
            "--model_alias",
            args.model_alias,
        ]
        if name == "llama-cpp-pld":
            cmd += [
                "--draft_model",
                "prompt-lookup-decoding",
                "--draft_model_num_pred_tokens",
                str(args.pld_num_pred_tokens),
            ]
        return cmd
    if name in ("llama-server", "llama-server-ngram-mod"):
        return [
            *llama_server_command(
                llama_server_binary(args.llama_python),
                str(model),
                threads=args.threads,
                parallel=1,
                slot_ctx_tokens=args.n_ctx,
                spec_type="ngram-mod" if name == "llama-server-ngram-mod" else "none",
            ),
            *common,
            "--alias",
            args.model_alias,
        ]
    raise ValueError(f"unknown server {name!r} (known: {', '.join(SERVERS)})")


def llama_server_command(
    binary: str, model: str, *, threads: int, parallel: int, slot_ctx_tokens: int, spec_type: str
) -> list[str]:
    """`llama-server`'s command line as the benchmarks run it (host and port not included):
    `parallel` slots of `slot_ctx_tokens` each (its `-c` is the context of all slots),
    `threads` for decode and batch, `--spec-type spec_type` unless "none".

    >>> llama_server_command("llama-server", "m.gguf", threads=2, parallel=4,
    ...                      slot_ctx_tokens=8192, spec_type="ngram-mod")[3:]
    ['-t', '2', '-tb', '2', '-np', '4', '-c', '32768', '--no-webui', '--spec-type', 'ngram-mod']
    """
    cmd = [binary, "-m", model, "-t", str(threads), "-tb", str(threads), "-np", str(parallel),
           "-c", str(slot_ctx_tokens * parallel), "--no-webui"]  # fmt: skip
    if spec_type != "none":
        cmd += ["--spec-type", spec_type]
    return cmd


@functools.cache
def llama_server_binary(python: str = sys.executable, repo: Path = REPO) -> str:
    """llama.cpp's `llama-server`, built from the llama-cpp-python sdist's vendored source by
    `repo`'s `scripts/install_llama_server.sh` (cached after the first build: about 20
    minutes; `repo`: the source checkout, this package's own by default); RuntimeError with
    the script's last output when it cannot be built."""
    script = repo / "scripts" / "install_llama_server.sh"
    if not script.is_file():
        raise RuntimeError(f"{script} not found: llama-server is built from a source checkout")
    out = subprocess.run(["bash", str(script), python], capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        tail = (out.stderr or out.stdout).strip()[-2000:]
        raise RuntimeError(f"{script} failed (exit {out.returncode}):\n{tail}")
    return lines[-1]


@dataclass
class RunningServer:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    model_id: str
    startup_s: float
    log_path: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start_server(name: str, args: argparse.Namespace, model: Path, run_dir: Path) -> RunningServer:
    port = free_port()
    cmd = server_command(name, args, model, port, run_dir)
    log_path = run_dir / f"{name}.server.log"
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        log.write((" ".join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = t0 + args.startup_timeout_s
    while True:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"server {name} exited with {proc.returncode}:\n{tail}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/v1/models")
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
            if resp.status == 200:
                models = json.loads(body)["data"]
                return RunningServer(
                    name, proc, port, models[0]["id"], time.perf_counter() - t0, log_path
                )
        except (OSError, ValueError, KeyError, IndexError):
            pass
        if time.perf_counter() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise RuntimeError(f"server {name} not ready after {args.startup_timeout_s} s")
        time.sleep(0.5)


# ---------------------------------------------------------------------------------------
# One agent session.


def fresh_task_copy(task: Any, root: Path) -> Path:
    """The task's files in `root/<task>` (emptied first), every mtime fixed."""
    folder = root / task.name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for rel, text in task.files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        os.utime(path, (FIXED_MTIME, FIXED_MTIME))
    for d in sorted({p.parent for p in folder.rglob("*")} | {folder}, reverse=True):
        os.utime(d, (FIXED_MTIME, FIXED_MTIME))
    os.utime(root, (FIXED_MTIME, FIXED_MTIME))
    return folder


def agent_command(
    args: argparse.Namespace, model_id: str, proxy_port: int, cwd: Path, traj: Path, issue: str
) -> list[str]:
    kw = "model.model_kwargs"
    return [
        args.agent_python,
        "-m",
        "minisweagent.run.mini",
        "--model",
        f"openai/{model_id}",
        "--model-class",
        "litellm_textbased",
        "--environment-class",
        "local",
        "-c",
        "mini_textbased.yaml",
        "-c",
        f"agent.step_limit={args.step_limit}",
        "-c",
        "agent.cost_limit=0",
        "-c",
        f"{kw}.api_base=http://127.0.0.1:{proxy_port}/v1",
        "-c",
        f"{kw}.api_key=EMPTY",
        "-c",
        f"{kw}.temperature=0.0",
        "-c",
        f"{kw}.max_tokens={args.max_tokens}",
        # llama_cpp.server's default repeat_penalty is 1.1, which is not greedy decoding
        # (and penalizes exactly the copying a drafter speeds up); litellm passes
        # extra_body through unchanged.
        *(
            ["-c", f'{kw}.extra_body={{"repeat_penalty": {args.repeat_penalty}}}']
            if args.repeat_penalty is not None
            else []
        ),
        "-c",
        f"environment.cwd={cwd}",
        "-c",
        f"environment.timeout={args.command_timeout_s}",
        "-t",
        issue,
        "-y",
        "--exit-immediately",
        "-o",
        str(traj),
    ]


def agent_env(config_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the agent's commands run the task with a clean python
    env.pop("VIRTUAL_ENV", None)
    env.update(
        MSWEA_CONFIGURED="true",  # no first-run setup prompt
        MSWEA_COST_TRACKING="ignore_errors",  # litellm has no price for a local model
        LITELLM_LOCAL_MODEL_COST_MAP="True",  # no network fetch of the price list
        MSWEA_GLOBAL_CONFIG_DIR=str(config_dir),  # keep ~/.config untouched
        MSWEA_SILENT_STARTUP="1",
        MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT="2",  # a broken server fails the run fast
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


def task_success(task: Any, folder: Path) -> tuple[bool, str]:
    """The task's own tests (original test files) over the agent's source files."""
    from agspec.pipeline.executor import run_tests

    files = {}
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder).as_posix()
        if "__pycache__" in rel or rel in task.test_files:
            continue
        try:
            files[rel] = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
    files.update({rel: task.files[rel] for rel in task.test_files})
    res = run_tests(files, timeout_s=60)
    return res.passed, res.status


def call_records(exchanges: Sequence[Exchange]) -> list[dict[str, Any]]:
    from agspec.traces.roles import infer_role

    calls = []
    for ex in exchanges:
        if not ex["path"].rstrip("/").endswith("/chat/completions"):
            continue
        resp = ex["response"] if isinstance(ex["response"], dict) else {}
        choice = (resp.get("choices") or [{}])[0]
        content = (choice.get("message") or {}).get("content") or ""
        usage = resp.get("usage") or {}
        actions = ACTION.findall(content)
        wall_s = ex["t_end"] - ex["t_start"]
        ntok = int(usage.get("completion_tokens") or 0)
        req = ex["request"] if isinstance(ex["request"], dict) else {}
        calls.append(
            {
                "status": ex["status"],
                "role": infer_role(actions[0]) if len(actions) == 1 else "other",
                # mini-swe-agent runs an output only with exactly one action block.
                "n_actions": len(actions),
                "first_action_role": infer_role(actions[0]) if actions else "other",
                "prompt_tokens": int(usage.get("prompt_tokens") or 0),
                "completion_tokens": ntok,
                "wall_s": wall_s,
                "tokens_per_s": ntok / wall_s if wall_s > 0 else 0.0,
                "finish_reason": choice.get("finish_reason"),
                "content": content,
                "messages": req.get("messages"),
                "params": {k: v for k, v in req.items() if k != "messages"},
            }
        )
    return calls


def run_session(
    task: Any,
    server: RunningServer,
    proxy: RecordingProxy,
    args: argparse.Namespace,
    work: Path,
    run_dir: Path,
) -> dict[str, Any]:
    folder = fresh_task_copy(task, work / "repo")
    traj = run_dir / "trajectories" / server.name / f"{task.name}.traj.json"
    traj.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{server.name}/{task.name}"
    proxy.tag = tag
    cmd = agent_command(args, server.model_id, proxy.port, folder, traj, task.issue)
    log_path = run_dir / "agent-logs" / server.name / f"{task.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=folder,
            env=agent_env(work / "mswea-config"),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc: int | None = proc.wait(timeout=args.session_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    wall_s = time.perf_counter() - t0
    calls = call_records(proxy.take(tag))
    exit_status = ""
    if traj.is_file():
        try:
            exit_status = json.loads(traj.read_text())["info"].get("exit_status", "")
        except (ValueError, KeyError):
            exit_status = "unreadable trajectory"
    passed, test_status = task_success(task, folder)
    return {
        "task": task.name,
        "server": server.name,
        "agent_rc": rc,
        "timed_out": rc is None,
        "exit_status": exit_status,
        "wall_s": wall_s,
        "model_s": sum(c["wall_s"] for c in calls),
        "success": passed,
        "test_status": test_status,
        "trajectory": str(traj),
        "calls": calls,
    }


# ---------------------------------------------------------------------------------------
# Analysis.


def speed(calls: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ntok = sum(c["completion_tokens"] for c in calls)
    secs = sum(c["wall_s"] for c in calls)
    return {
        "calls": len(calls),
        "completion_tokens": ntok,
        "wall_s": secs,
        "tokens_per_s": ntok / secs if secs > 0 else 0.0,
    }


def first_difference(
    a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], tok: Any
) -> dict[str, Any] | None:
    """Where two sessions of one task first part: a request (what the agent sent) or,
    for an identical request, an output (first differing token, by the Qwen tokenizer)."""
    for i, (ca, cb) in enumerate(zip(a, b)):
        if ca["messages"] != cb["messages"]:
            j = next(
                (k for k, (ma, mb) in enumerate(zip(ca["messages"], cb["messages"])) if ma != mb),
                min(len(ca["messages"]), len(cb["messages"])),
            )
            return {"call": i, "kind": "request", "message": j}
        if ca["content"] != cb["content"]:
            ta, tb = tok.encode(ca["content"]), tok.encode(cb["content"])
            k = next((k for k, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
            return {
                "call": i,
                "kind": "output",
                "token": k,
                "of_tokens": [len(ta), len(tb)],
                "a": tok.decode(ta[max(0, k - 4) : k + 6]),
                "b": tok.decode(tb[max(0, k - 4) : k + 6]),
            }
    if len(a) != len(b):
        return {"call": min(len(a), len(b)), "kind": "length", "calls": [len(a), len(b)]}
    return None


def matched_calls(
    sessions: dict[str, dict[str, Any]], names: Sequence[str]
) -> list[list[dict[str, Any]]]:
    """Calls with the same request and the same output on every server (columns per server)."""
    out = []
    per = [sessions[n]["calls"] for n in names]
    for group in zip(*per):
        first = group[0]
        if all(
            c["messages"] == first["messages"] and c["content"] == first["content"] for c in group
        ):
            out.append(list(group))
        else:
            break
    return out


def attach_live_steps(results: list[dict[str, Any]], run_dir: Path) -> None:
    """Add `agspec serve --record`'s per-call live statistics (prefill and decode ms,
    drafted / accepted tokens) to each call of the agspec servers' sessions.

    The server writes one session per start (task-major order restarts it per task), in
    the order the tasks ran; a session is matched to the proxy's calls only when the call
    counts agree, else left without (and said so)."""
    for name in ("agspec", "agspec-none"):
        path = run_dir / f"{name}.record.live.jsonl"
        mine = [r for r in results if r["server"] == name]
        if not mine or not path.is_file():
            continue
        live = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if len(live) != len(mine):
            print(f"note: {path.name} holds {len(live)} sessions for {len(mine)} tasks; "
                  "live statistics not attached")  # fmt: skip
            continue
        for r, rec in zip(mine, live):
            if len(rec["calls"]) != len(r["calls"]):
                print(f"note: {name}/{r['task']}: {len(rec['calls'])} recorded calls for "
                      f"{len(r['calls'])} served; live statistics not attached")  # fmt: skip
                continue
            for c, lc in zip(r["calls"], rec["calls"]):
                steps = lc["steps"]
                c["live"] = {
                    "prefill_ms": lc["prefill_ms"],
                    "total_ms": lc["total_ms"],
                    "reused_prompt_tokens": lc["reused_prompt_tokens"],
                    "steps": len(steps),
                    "drafted": sum(st[0] for st in steps),
                    "accepted": sum(st[1] for st in steps),
                    "committed": sum(st[2] for st in steps),
                }


def decode_speed(calls: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Committed tokens per second of decoding (prefill excluded), from live statistics."""
    live = [c["live"] for c in calls if "live" in c]
    if not live or len(live) != len(calls):
        return None
    ms = sum(x["total_ms"] - x["prefill_ms"] for x in live)
    committed = sum(x["committed"] for x in live)
    steps = sum(x["steps"] for x in live)
    return {"committed_tokens": committed, "decode_s": ms / 1000,
            "tokens_per_s": committed / (ms / 1000) if ms > 0 else 0.0,
            "prefill_s": sum(x["prefill_ms"] for x in live) / 1000,
            "tokens_per_step": committed / steps if steps else 0.0,
            "drafted": sum(x["drafted"] for x in live),
            "accepted": sum(x["accepted"] for x in live)}  # fmt: skip


def analyse(results: list[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    from agspec.tokenizers import get_tokenizer

    tok = get_tokenizer("qwen2.5")
    by_task: dict[str, dict[str, dict[str, Any]]] = {}
    for r in results:
        by_task.setdefault(r["task"], {})[r["server"]] = r
    summary: dict[str, Any] = {"servers": {}, "matched": {}, "differences": {}}
    # Only tasks every server ran (a cut run's last task may be partial).
    complete = {t: s for t, s in by_task.items() if all(n in s for n in names)}
    summary["tasks"] = sorted(complete)
    results = [r for r in results if r["task"] in complete]
    for n in names:
        sess = [r for r in results if r["server"] == n]
        calls = [c for r in sess for c in r["calls"]]
        roles = sorted({c["role"] for c in calls})
        summary["servers"][n] = {
            "sessions": len(sess),
            "successes": sum(r["success"] for r in sess),
            "session_wall_s": sum(r["wall_s"] for r in sess),
            "all": speed(calls),
            "per_role": {role: speed([c for c in calls if c["role"] == role]) for role in roles},
            "decode": decode_speed(calls),
            "decode_per_role": {
                role: decode_speed([c for c in calls if c["role"] == role]) for role in roles
            },
        }
    # Matched calls: the prefix of each task where every server saw the same request and
    # gave the same output: the only calls whose speeds compare like for like.
    cols: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for s in complete.values():
        for group in matched_calls(s, names):
            for n, c in zip(names, group):
                cols[n].append(c)
    for n in names:
        summary["matched"][n] = {
            "all": speed(cols[n]),
            "per_role": {
                role: speed([c for c in cols[n] if c["role"] == role])
                for role in sorted({c["role"] for c in cols[n]})
            },
        }
    ref = "agspec-none" if "agspec-none" in names else names[0]
    for n in names:
        if n == ref:
            continue
        summary["differences"][n] = {
            t: first_difference(s[ref]["calls"], s[n]["calls"], tok) for t, s in complete.items()
        }
    summary["reference"] = ref
    return summary


def add_logit_gaps(summary: dict[str, Any], results: list[dict[str, Any]], model: Path,
                   threads: int, n_ctx: int) -> None:  # fmt: skip
    """For each first difference that is an output (same request, different text), the
    one-token logit gap |logit(a) - logit(b)| of the two tokens at the first differing
    position, by plain one-token decoding: a near-tie flip has a small gap.

    The prompt is the model's chat template over the request's messages, and the two
    outputs are re-encoded from their text (the served ids are not in the exchange)."""
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from agspec.adapters.llama_cpp import logit_gap

    llm = Llama(model_path=str(model), n_ctx=n_ctx, n_threads=threads,
                n_threads_batch=threads, verbose=False)  # fmt: skip
    eos = llm._model.token_get_text(llm.token_eos())
    fmt = Jinja2ChatFormatter(template=llm.metadata["tokenizer.chat_template"],
                              eos_token=eos, bos_token="")  # fmt: skip
    ref = summary["reference"]
    by = {(r["server"], r["task"]): r for r in results}
    for name, per_task in summary["differences"].items():
        for task, d in per_task.items():
            if not d or d["kind"] != "output":
                continue
            ca, cb = by[(ref, task)]["calls"][d["call"]], by[(name, task)]["calls"][d["call"]]
            prompt_text = fmt(messages=ca["messages"]).prompt
            prompt = llm.tokenize(prompt_text.encode(), add_bos=False, special=True)
            ta = llm.tokenize(ca["content"].encode(), add_bos=False, special=False)
            tb = llm.tokenize(cb["content"].encode(), add_bos=False, special=False)
            k = next((k for k, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
            if k is None:
                continue
            d["logit_gap"] = logit_gap(llm, prompt, ta[:k], ta[k], tb[k])
            d["gap_at_token"] = k
    llm.close()


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


def speed_cell(x: dict[str, Any], base: dict[str, Any] | None) -> str:
    """`tok/s (ratio to base, calls)`."""
    b = base["tokens_per_s"] if base else 0.0
    return f"{x['tokens_per_s']:.1f} ({ratio(x['tokens_per_s'], b)}, {x['calls']} calls)"


def print_report(
    summary: dict[str, Any], results: list[dict[str, Any]], names: Sequence[str]
) -> None:
    ref = summary["reference"]
    print("\nper task: wall s (model s) / calls / success")
    tasks = sorted({r["task"] for r in results})
    print("| task | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for t in tasks:
        cells = []
        for n in names:
            r = next((r for r in results if r["task"] == t and r["server"] == n), None)
            cells.append(
                "-"
                if r is None
                else f"{r['wall_s']:.0f} ({r['model_s']:.0f}) / {len(r['calls'])} / "
                f"{'pass' if r['success'] else 'fail'} {r['exit_status']}"
            )
        print(f"| {t} | " + " | ".join(cells) + " |")
    for title, key in (
        ("all calls", "servers"),
        ("matched calls (same request and output on every server)", "matched"),
    ):
        block = summary[key]
        roles = sorted({r for n in names for r in block[n]["per_role"]})
        print(f"\ncompletion tokens/s, {title} (x {ref})")
        print("| server | all | " + " | ".join(roles) + " |")
        print("|---|---|" + "---|" * len(roles))
        base = block[ref]
        for n in names:
            s = block[n]
            cells = [speed_cell(s["all"], base["all"]) + f" tok {s['all']['completion_tokens']}"]
            for role in roles:
                x, b = s["per_role"].get(role), base["per_role"].get(role)
                cells.append(speed_cell(x, b) if x else "-")
            print(f"| {n} | " + " | ".join(cells) + " |")
    dec = {n: summary["servers"][n].get("decode") for n in names}
    if any(dec.values()):
        print("\ndecoding only (prefill excluded; agspec serve --record live statistics)")
        print("| server | tok/s | tokens/step | drafted | accepted | prefill s |")
        print("|---|---|---|---|---|---|")
        for n, d in dec.items():
            if d:
                print(f"| {n} | {d['tokens_per_s']:.1f} | {d['tokens_per_step']:.2f} | "
                      f"{d['drafted']} | {d['accepted']} | {d['prefill_s']:.1f} |")  # fmt: skip
    print(
        "\nsuccess: "
        + ", ".join(
            f"{n} {summary['servers'][n]['successes']}/{summary['servers'][n]['sessions']}"
            for n in names
        )
    )
    print(f"\nfirst difference from {ref}:")
    for n, per_task in summary["differences"].items():
        for t, d in sorted(per_task.items()):
            print(f"  {n} {t}: {'identical' if d is None else json.dumps(d)}")


# ---------------------------------------------------------------------------------------


def write_json(path: str, doc: dict[str, Any]) -> None:
    """Whole or not at all: a temporary file renamed over the old one."""
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="all", help="comma-separated bundled task names, or all")
    ap.add_argument("--max-tasks", type=int, default=0, help="at most N tasks (0: no limit)")
    ap.add_argument("--servers", default=",".join(DEFAULT_SERVERS),
                    help=f"comma-separated of {SERVERS}")  # fmt: skip
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="name or .gguf path")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--step-limit", type=int, default=6, help="agent steps (model calls) per task")
    ap.add_argument("--max-tokens", type=int, default=384, help="max_tokens of every call")
    ap.add_argument(
        "--repeat-penalty",
        type=float,
        default=1.0,
        help="sent with every call (llama_cpp.server's own default is 1.1)",
    )
    ap.add_argument(
        "--pld-num-pred-tokens",
        type=int,
        default=10,
        help="llama_cpp.server --draft_model_num_pred_tokens (its default: 10)",
    )
    ap.add_argument(
        "--cost-profile",
        default=str(DEFAULT_PROFILE),
        help="passed to agspec serve (default: the shipped profile of Qwen2.5-Coder-0.5B on "
        "this project's 2-core EPYC, measured on a quiet machine); '' lets the server "
        "measure (or reuse) its own",
    )
    ap.add_argument(
        "--state-dir", default=None, help="passed to agspec serve (default: one per server)"
    )
    ap.add_argument(
        "--model-alias",
        default=None,
        help="the model id llama_cpp.server and llama-server report (default: the file stem)",
    )
    ap.add_argument(
        "--agent-python",
        default=None,
        help="python of mini-swe-agent's venv (default: scripts/install_agent.sh)",
    )
    ap.add_argument("--agspec-python", default=sys.executable)
    ap.add_argument("--llama-python", default=sys.executable)
    ap.add_argument("--session-timeout-s", type=float, default=900)
    ap.add_argument("--command-timeout-s", type=int, default=30)
    ap.add_argument("--startup-timeout-s", type=float, default=600)
    ap.add_argument("--run-dir", default=None, help="keep logs, trajectories, records here")
    ap.add_argument("--out", default=None, help="write the results JSON here")
    ap.add_argument("--order", choices=("task-major", "server-major"), default="task-major")
    ap.add_argument("--quick", action="store_true", help="1 task, 3 steps, agspec vs agspec-none")
    ap.add_argument(
        "--logit-gaps",
        action="store_true",
        help="at each first differing output token, the one-token logit gap (loads the model)",
    )
    ap.add_argument("--reanalyse", default=None, help="a results JSON: print its tables again")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.reanalyse:
        doc = json.loads(Path(args.reanalyse).read_text())
        names = list(dict.fromkeys(r["server"] for r in doc["sessions"]))
        if "summary" in doc:
            names = list(doc["summary"]["servers"])
        if args.run_dir:
            attach_live_steps(doc["sessions"], Path(args.run_dir))
        summary = analyse(doc["sessions"], names)
        if args.logit_gaps:
            add_logit_gaps(summary, doc["sessions"], Path(doc["model"]), args.threads, args.n_ctx)
        print_report(summary, doc["sessions"], names)
        if args.out:
            doc["summary"] = summary
            write_json(args.out, doc)
        return 0
    from agspec.models import resolve_model
    from agspec.pipeline.tasks import load_task, task_names

    if args.quick:
        args.tasks = "leap-years" if args.tasks == "all" else args.tasks
        args.max_tasks, args.step_limit = 1, min(args.step_limit, 3)
        if args.servers == ",".join(DEFAULT_SERVERS):
            args.servers = "agspec,agspec-none"
    names = [s for s in args.servers.split(",") if s]
    for n in names:
        if n not in SERVERS:
            ap.error(f"unknown server {n!r} (known: {', '.join(SERVERS)})")
    tasks = task_names() if args.tasks == "all" else [t for t in args.tasks.split(",") if t]
    if args.max_tasks > 0:
        tasks = tasks[: args.max_tasks]
    loaded = [load_task(t) for t in tasks]
    model = resolve_model(args.model)
    args.model_alias = args.model_alias or model.stem
    if args.agent_python is None:
        out = subprocess.run(
            ["bash", str(REPO / "scripts" / "install_agent.sh")],
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        ).stdout
        args.agent_python = out.strip().splitlines()[-1]

    work = Path(tempfile.mkdtemp(prefix="agspec-serve-agent-"))
    run_dir = Path(args.run_dir) if args.run_dir else work / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    print(f"load average at start: {load_start}; run dir {run_dir}", flush=True)
    proxy = RecordingProxy()
    results: list[dict[str, Any]] = []
    startup: dict[str, list[float]] = {n: [] for n in names}
    # task-major (the default): the servers take turns on each task, so a change in the
    # machine's load hits all of them alike; the drafter's learned state persists across
    # its restarts (--state-dir). server-major: one server start for all its tasks.
    if args.order == "task-major":
        plan = [(task, n) for task in loaded for n in names]
    else:
        plan = [(task, n) for n in names for task in loaded]
    server: RunningServer | None = None
    t_all = time.perf_counter()
    try:
        for task, n in plan:
            if server is None or server.name != n:
                if server is not None:
                    server.stop()
                    server = None
                server = start_server(n, args, model, run_dir)
                startup[n].append(server.startup_s)
                print(f"[{n}] ready in {server.startup_s:.1f} s on port {server.port}", flush=True)
                proxy.upstream = ("127.0.0.1", server.port)
            r = run_session(task, server, proxy, args, work, run_dir)
            r["load_avg_1m"] = os.getloadavg()[0]
            results.append(r)
            if args.out:  # the sessions so far, so that a cut run still leaves its data
                write_json(args.out, {"command": sys.argv, "model": str(model),
                                      "partial": True, "sessions": results})  # fmt: skip
            s = speed(r["calls"])
            print(
                f"[{n}] {task.name}: {r['wall_s']:.0f} s, {s['calls']} calls, "
                f"{s['completion_tokens']} tok, {s['tokens_per_s']:.1f} tok/s, "
                f"{'pass' if r['success'] else 'fail'} ({r['exit_status']}), "
                f"load {r['load_avg_1m']:.1f}",
                flush=True,
            )
    finally:
        if server is not None:
            server.stop()
        proxy.close()
    load_end = os.getloadavg()
    attach_live_steps(results, run_dir)
    summary = analyse(results, names)
    if args.logit_gaps:
        add_logit_gaps(summary, results, model, args.threads, args.n_ctx)
    print_report(summary, results, names)
    print(
        f"\nload average at start {load_start}, at end {load_end}; "
        f"total {time.perf_counter() - t_all:.0f} s"
    )
    if args.out:
        doc = {
            "command": sys.argv,
            "model": str(model),
            "threads": args.threads,
            "n_ctx": args.n_ctx,
            "step_limit": args.step_limit,
            "max_tokens": args.max_tokens,
            "load_start": load_start,
            "load_end": load_end,
            "startup_s": startup,
            "summary": summary,
            "sessions": results,
        }
        write_json(args.out, doc)
        print(f"wrote {args.out}")
    if not args.run_dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
