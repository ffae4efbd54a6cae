"""`agspec serve` under many clients for a long time: memory and disconnects.

Eight clients (`--clients`) talk to one server (`--parallel 4` by default, so half of
them wait for a slot and sessions outnumber slots: the saved-KV store, the session
corpora and the resolver all grow) for `--minutes` minutes. Each client replays the
bundled sessions' calls (messages as recorded, greedy), every pass under a new session
id (`user`), so the number of sessions the server has seen keeps growing. One request in
`--disconnect-every` is streamed and dropped by its client after its first chunks.

Every `--sample-s` seconds it records the server's resident memory (VmRSS), /health
(sessions, running, queue, the KV store's bytes) and the counters. Reports: RSS at the
end of the first minute, its peak and its last value; its growth over the second half of
the run in MiB per minute (bounded memory reads about 0); and for every disconnect the
time until the server counted it cancelled (its slot freed), beside the median time of a
decoding step (each answer's `agspec.decode_ms / agspec.steps`).

    python benchmarks/bench_serve_soak.py --minutes 10 -o runs/soak.json
    python benchmarks/bench_serve_soak.py --model smollm2-135m-instruct --minutes 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any

try:
    import httpx
except ImportError:  # newer openai clients bring the fork httpx2 (the same API)
    import httpx2 as httpx  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "src" / "agspec" / "data" / "traces" / "default.jsonl.gz"
CANCELLED = 'agspec_cancelled_total{reason="disconnected"}'


def load_sessions() -> list[list[list[dict[str, str]]]]:
    """Each bundled session as its calls' message lists."""
    from agspec.traces.io import read_sessions

    return [
        [[{"role": m.role, "content": m.content} for m in c.messages] for c in s.calls]
        for s in read_sessions(TRACES)
    ]


class Soak:
    def __init__(self, srv: Any, args: argparse.Namespace) -> None:
        self.srv, self.args = srv, args
        self.sessions = load_sessions()
        self.stop_at = time.monotonic() + args.minutes * 60
        self.lock = threading.Lock()
        self.completed = 0
        self.completion_tokens = 0
        self.errors: list[str] = []
        self.disconnects: list[float] = []  # seconds from the close to the server's count
        self.samples: list[dict[str, Any]] = []
        self.step_ms: list[float] = []  # each answer's decoding time per step it took
        self.t0 = time.monotonic()

    def client(self, i: int) -> None:
        rng = random.Random(i)
        body_base = {"model": self.args.model, "temperature": 0,
                     "max_tokens": self.args.max_tokens}  # fmt: skip
        passes = 0
        with httpx.Client(timeout=300) as http:  # a server that stops answering is an error
            while time.monotonic() < self.stop_at:
                session = self.sessions[(i + passes) % len(self.sessions)]
                user = f"soak-{i}-{passes}"
                passes += 1
                for msgs in session:
                    if time.monotonic() >= self.stop_at:
                        return
                    body = {**body_base, "messages": msgs, "user": user}
                    try:
                        if rng.randrange(self.args.disconnect_every) == 0:
                            self.disconnect(http, body)
                        else:
                            r = http.post(f"{self.srv.base_url}/chat/completions", json=body)
                            if r.status_code != 200:
                                raise RuntimeError(f"{r.status_code} {r.text[:200]}")
                            j = r.json()
                            with self.lock:
                                self.completed += 1
                                self.completion_tokens += j["usage"]["completion_tokens"]
                                if j["agspec"]["steps"]:
                                    self.step_ms.append(
                                        j["agspec"]["decode_ms"] / j["agspec"]["steps"]
                                    )
                    except Exception as exc:  # a failed request is a finding, not a crash
                        with self.lock:
                            self.errors.append(f"client {i}: {exc!r}"[:300])

    def disconnect(self, http: httpx.Client, body: dict[str, Any]) -> None:
        """Stream the request, read its first chunks, close it; then wait (on the server's
        own counter, not a sleep) until the server has counted it cancelled."""
        before = self.srv.metrics().get(CANCELLED, 0.0)
        with http.stream(
            "POST", f"{self.srv.base_url}/chat/completions", json={**body, "stream": True}
        ) as resp:
            if resp.status_code != 200:
                raise RuntimeError(f"stream {resp.status_code}")
            # Until two chunks with content came: the request holds a slot and decodes
            # (the role chunk may come while it still waits for one).
            seen = 0
            for line in resp.iter_lines():
                if line.startswith("data: ") and '"content":' in line and "[DONE]" not in line:
                    seen += 1
                if seen >= 2 or line == "data: [DONE]":
                    break
            closed = time.monotonic()
        # Leaving the block closed the connection; another client's disconnect may count
        # too, so wait for the counter to pass `before`.
        deadline = closed + 120
        while time.monotonic() < deadline:
            if self.srv.metrics().get(CANCELLED, 0.0) > before:
                with self.lock:
                    self.disconnects.append(time.monotonic() - closed)
                return
            time.sleep(0.02)
        raise RuntimeError("a disconnect was not counted within 120 s")

    def sampler(self) -> None:
        while time.monotonic() < self.stop_at:
            try:
                h = self.srv.get_json("/health")
                m = self.srv.metrics()
                kv = h.get("kv_store") or {}
                self.samples.append({
                    "t_s": round(time.monotonic() - self.t0, 1),
                    "rss_bytes": self.srv.rss_bytes(),
                    "sessions": h["sessions"], "running": h["running"],
                    "queue_depth": h["queue_depth"], "kv_store_bytes": kv.get("bytes", 0),
                    "drafter_sessions": m.get("agspec_drafter_sessions", 0.0),
                })  # fmt: skip
            except Exception as exc:
                self.errors.append(f"sampler: {exc!r}"[:300])
            time.sleep(self.args.sample_s)

    def run(self) -> dict[str, Any]:
        threads = [
            threading.Thread(target=self.client, args=(i,)) for i in range(self.args.clients)
        ]
        threads.append(threading.Thread(target=self.sampler))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        mib = 1 << 20
        s = self.samples
        after_1min = next((x for x in s if x["t_s"] >= 60), s[0])
        half = [x for x in s if x["t_s"] >= s[-1]["t_s"] / 2]
        slope = 0.0
        if len(half) >= 2 and half[-1]["t_s"] > half[0]["t_s"]:
            ts = [x["t_s"] / 60 for x in half]
            rs = [x["rss_bytes"] / mib for x in half]
            slope = statistics.linear_regression(ts, rs).slope
        step_ms = statistics.median(self.step_ms) if self.step_ms else None
        return {
            "minutes": self.args.minutes, "clients": self.args.clients,
            "parallel": self.args.parallel, "model": self.args.model,
            "completed_requests": self.completed, "completion_tokens": self.completion_tokens,
            "errors": self.errors[:20], "num_errors": len(self.errors),
            "rss_mib_after_1min": after_1min["rss_bytes"] / mib,
            "rss_mib_peak": max(x["rss_bytes"] for x in s) / mib,
            "rss_mib_last": s[-1]["rss_bytes"] / mib,
            "rss_mib_per_min_second_half": slope,
            "sessions_seen": s[-1]["sessions"],
            "kv_store_mib_last": s[-1]["kv_store_bytes"] / mib,
            "disconnects": len(self.disconnects),
            "disconnect_freed_s": sorted(round(x, 3) for x in self.disconnects),
            "median_step_ms": step_ms,
            "load_avg_end": os.getloadavg(),
            "samples": s,
        }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--disconnect-every", type=int, default=8,
                    help="one request in N is streamed and dropped (1: every one)")  # fmt: skip
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="one more `agspec serve` argument (repeatable)")  # fmt: skip
    ap.add_argument("-o", "--out", default=None)
    args = ap.parse_args(argv)
    if args.clients < 1 or args.minutes <= 0 or args.disconnect_every < 1:
        ap.error("--clients and --disconnect-every must be >= 1 and --minutes > 0")
    from agspec.serve.launch import ServerProcess

    srv = ServerProcess(["--model", args.model, "--threads", str(args.threads),
                         "--parallel", str(args.parallel), *args.serve_arg]).start()  # fmt: skip
    try:
        print(f"server pid {srv.proc.pid if srv.proc else None}; {args.clients} clients for "
              f"{args.minutes} min", flush=True)  # fmt: skip
        res = Soak(srv, args).run()
    finally:
        rc = srv.stop()
    res["server_exit"] = rc
    d = res["disconnect_freed_s"]
    print(
        f"{res['completed_requests']} answers ({res['completion_tokens']} tokens), "
        f"{res['num_errors']} errors, {res['sessions_seen']} sessions; RSS MiB after 1 min "
        f"{res['rss_mib_after_1min']:.0f}, peak {res['rss_mib_peak']:.0f}, last "
        f"{res['rss_mib_last']:.0f}, second half {res['rss_mib_per_min_second_half']:+.1f}/min; "
        f"{len(d)} disconnects freed in {d[len(d) // 2] if d else 0:.3f} s median, "
        f"{max(d) if d else 0:.3f} s max (median step {res['median_step_ms'] or 0:.0f} ms)"
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(args.out + ".tmp")
        tmp.write_text(json.dumps(res, indent=1) + "\n")
        tmp.replace(args.out)  # written whole or not at all
    return 1 if res["num_errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
