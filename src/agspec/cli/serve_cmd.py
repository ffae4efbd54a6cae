"""`agspec serve`: an OpenAI-compatible server with AgSpec drafting (docs/serve.md).

    agspec serve [--model NAME|PATH.gguf] [--host 127.0.0.1] [--port 8000] [--threads N]
                 [--n-ctx N] [--drafter agspec|none|<any registered drafter>]
                 [--cost-profile FILE] [--state-dir DIR] [--record FILE.jsonl]
                 [--memory-budget SIZE] [--parallel N] [--kv-store SIZE]

Needs the `serve` extra (`pip install 'agspec[serve]'`) and llama-cpp-python.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

EXAMPLES = """examples:
  agspec serve                                   # Qwen2.5-Coder-0.5B, AgSpec drafting, :8000
  agspec serve --model path/to/model.gguf --threads 8 --port 9000
  agspec serve --drafter none                    # plain decoding, the same server
  agspec serve --memory-budget 2G --state-dir ~/.agspec-state
then point any OpenAI client at http://127.0.0.1:8000/v1 (docs/serve.md)
"""

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from a size such as `512M`, `2G`, `1.5GiB` or `1048576` (powers of 1024).

    >>> parse_size("2G"), parse_size("512m"), parse_size("1048576")
    (2147483648, 536870912, 1048576)
    """
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(
            f"expected a size such as 512M, 2G or a number of bytes, got {text!r}"
        )
    unit = m.group(2).lower()
    scale = 1024 ** ("kmgt".find(unit) + 1) if unit else 1
    return int(float(m.group(1)) * scale)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="OpenAI-compatible server (llama.cpp) with AgSpec drafting",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        default="qwen2.5-coder-0.5b-instruct",
        help="pinned model name (agspec models list) or a .gguf path "
        "(default qwen2.5-coder-0.5b-instruct)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--threads",
        type=int,
        default=min(os.cpu_count() or 1, 4),
        help="llama.cpp threads, for decoding and prompt batches (default: min(cores, 4))",
    )
    p.add_argument("--n-ctx", type=int, default=8192, help="context length (default 8192)")
    p.add_argument(
        "--drafter",
        default="agspec",
        help="agspec (the default: cost-aware lengths from the measured profile, most recent "
        "occurrences, the history corpus), none (plain decoding), another AgSpec variant "
        "(agspec-paper, agspec-paper+cost, ...; docs/drafter.md) or a baseline of the replay "
        "lab (pld-hf, suffix-64, ...)",
    )
    p.add_argument(
        "--cost-profile",
        default=None,
        help="cost profile from `agspec costmodel measure`; without one a short "
        "profile is measured at start-up and cached per model, CPU and "
        "thread count",
    )
    p.add_argument(
        "--fixed-cost-profile",
        action="store_true",
        help="keep the cost profile as given or measured at start-up; by default it is "
        "corrected online from the server's own timed steps (docs/serve-parallel.md)",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        help="folder for what the drafter learns (scales.json, curves.json), "
        "loaded at start and saved at every session end and at shutdown",
    )
    p.add_argument(
        "--record",
        default=None,
        metavar="FILE.jsonl",
        help="write every served call as an AgSpec trace (+ FILE.live.jsonl)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=32,
        help="requests that may wait for the decoder; past it: 503 (default 32)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        help="seconds a request may take, waiting included (default 600)",
    )
    p.add_argument(
        "--session-ttl",
        type=float,
        default=3600.0,
        help="seconds an idle session is kept (default 3600)",
    )
    p.add_argument(
        "--max-sessions",
        type=int,
        default=256,
        help="live sessions kept; the least recently used go first (default 256)",
    )
    p.add_argument(
        "--num-draft-tokens",
        type=int,
        default=16,
        help="the most draft tokens per step (default 16)",
    )
    p.add_argument(
        "--memory-budget",
        type=parse_size,
        default=0,
        metavar="SIZE",
        help="the most memory the drafter's growing corpora (live sessions, history) may "
        "hold, e.g. 2G; measured on the indexes, the least recently used sessions go first "
        "(default: no byte budget, 20M live tokens)",
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=4,
        help="slots: requests decoded together in one llama.cpp batch; each slot keeps its "
        "last request's KV, so a session's next call prefills only what is new (default 4)",
    )
    p.add_argument(
        "--n-batch",
        type=int,
        default=512,
        help="the most tokens of one decoding step, drafts and prefill chunks together "
        "(default 512)",
    )
    p.add_argument(
        "--prefill-chunk",
        type=int,
        default=256,
        help="prompt tokens prefilled per step while other requests decode (default 256)",
    )
    p.add_argument(
        "--kv-store",
        type=parse_size,
        default=1 << 30,
        metavar="SIZE",
        help="host memory for saved slot KV, e.g. 2G: a slot's cache of one session is saved "
        "before another session's request cuts it, and restored for that session's next "
        "call instead of prefilling it again; 0: off (default 1G)",
    )
    p.add_argument(
        "--queue-timeout",
        type=float,
        default=120.0,
        help="seconds a request may wait for a free slot; past it: 503 with Retry-After "
        "(default 120)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds Ctrl-C / SIGTERM waits for requests in flight (default 30)",
    )
    p.add_argument(
        "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug")
    )
    p.set_defaults(func=_serve)


def _check(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    for name in ("threads", "n_ctx", "max_queue", "max_sessions", "num_draft_tokens",
                 "parallel", "n_batch", "prefill_chunk"):  # fmt: skip
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("request_timeout", "session_ttl", "drain_timeout", "queue_timeout"):
        if not getattr(args, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.memory_budget and args.memory_budget < 1 << 20:
        raise ValueError(f"--memory-budget must be 0 (off) or >= 1M, got {args.memory_budget}")
    if args.kv_store and args.kv_store < 1 << 20:
        raise ValueError(f"--kv-store must be 0 (off) or >= 1M, got {args.kv_store}")
    _check_drafter(args.drafter)
    _check_port(args.host, args.port)


def _check_drafter(name: str) -> None:
    """A misspelt --drafter fails at once, before the profile and the model load."""
    from agspec.baselines.registry import BASELINES
    from agspec.drafter import VARIANTS

    known = ["none", *VARIANTS, "ar", *BASELINES.names()]  # what the engine builds
    if name not in known:
        raise ValueError(f"--drafter: unknown drafter {name!r}; known: {', '.join(known)}")


def _check_port(host: str, port: int) -> None:
    """A busy port fails at once, not after the model loads (nothing stays bound)."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ValueError(
                f"--port {port}: cannot listen on {host}:{port} ({exc.strerror or exc}); "
                "is another server running there? pick another with --port"
            ) from None


def _serve(args: argparse.Namespace) -> int:
    _check(args)
    try:
        import uvicorn

        from agspec.serve.app import create_app
        from agspec.serve.engine import Engine, EngineConfig
    except ImportError as exc:
        raise ValueError(
            f"agspec serve needs the serve extra ({exc}): pip install 'agspec[serve]'"
        ) from None

    def progress(msg: str) -> None:
        print(f"agspec serve: {msg}", file=sys.stderr, flush=True)

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    engine = Engine(
        EngineConfig(
            model=args.model,
            threads=args.threads,
            n_ctx=args.n_ctx,
            drafter=args.drafter,
            cost_profile=args.cost_profile,
            live_cost=not args.fixed_cost_profile,
            state_dir=args.state_dir,
            record=args.record,
            max_queue=args.max_queue,
            request_timeout_s=args.request_timeout,
            session_ttl_s=args.session_ttl,
            max_sessions=args.max_sessions,
            num_draft_tokens=args.num_draft_tokens,
            memory_budget_bytes=args.memory_budget,
            parallel=args.parallel,
            n_batch=args.n_batch,
            prefill_chunk=args.prefill_chunk,
            queue_timeout_s=args.queue_timeout,
            kv_store_bytes=args.kv_store,
        ),
        progress=progress,
    )
    app = create_app(engine, drain_timeout_s=args.drain_timeout)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=int(max(1, args.drain_timeout)),
        access_log=False,  # ours (agspec.serve.access) has tokens and drafting per request
    )
    server = _Server(config)
    progress(
        f"model {engine.model_name}, drafter {args.drafter}, {args.parallel} slots; serving on "
        f"http://{args.host}:{args.port}/v1"
    )
    server.run()
    progress("stopped; state saved" if args.state_dir else "stopped")
    return 0


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):  # type: ignore[misc]
        """uvicorn's server, but Ctrl-C / SIGTERM end with exit status 0 after the drain
        (uvicorn re-raises the signal once it has shut down)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            sigs = (signal.SIGINT, signal.SIGTERM)
            original = {sig: signal.signal(sig, self.handle_exit) for sig in sigs}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    return Server


def _Server(config: Any) -> Any:  # noqa: N802 - reads like the class it makes
    return _server_class()(config)
