"""Prometheus metrics of `agspec serve` (prometheus-client, one registry per server).

Per agent (the `X-AgSpec-Agent` header, or a name derived from the system prompt;
at most `MAX_AGENTS` distinct names, later ones are counted as `other`, so a client that
sends a new system prompt per request cannot grow the registry without bound):

- `agspec_requests_total{endpoint, agent, status}`
- `agspec_prompt_tokens_total{agent}`, `agspec_completion_tokens_total{agent}`
- `agspec_verify_steps_total{agent}` (forward passes of decoding)
- `agspec_drafted_tokens_total{agent, source}`, `agspec_accepted_tokens_total{agent, source}`
  (`source`: the corpus the draft came from: request, session, workspace, history, global;
  `other` for drafters that do not say)
- `agspec_draft_seconds_total{agent}`, `agspec_verify_seconds_total{agent}`,
  `agspec_prefill_seconds_total{agent}`

Server-wide: `agspec_queue_depth`, `agspec_running_requests`, `agspec_sessions`,
`agspec_drafter_sessions`,
`agspec_session_requests_total{kind}` (kind: new, continued, explicit),
`agspec_session_known_messages_total` (messages of requests their session had already
seen), `agspec_cancelled_total{reason}`, `agspec_rejected_total{reason}`,
`agspec_request_seconds` (histogram).
"""

from __future__ import annotations

import threading

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ServeMetrics", "CONTENT_TYPE", "MAX_AGENTS"]

MAX_AGENTS = 64


class ServeMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self._agents: set[str] = set()
        self._lock = threading.Lock()
        self.requests = Counter(
            "agspec_requests", "Requests served", ["endpoint", "agent", "status"], registry=r
        )
        self.prompt_tokens = Counter(
            "agspec_prompt_tokens", "Prompt tokens of served requests", ["agent"], registry=r
        )
        self.completion_tokens = Counter(
            "agspec_completion_tokens", "Completion tokens generated", ["agent"], registry=r
        )
        self.verify_steps = Counter(
            "agspec_verify_steps", "Decoding forward passes (verification steps)", ["agent"],
            registry=r,
        )  # fmt: skip
        self.drafted = Counter(
            "agspec_drafted_tokens", "Draft tokens proposed", ["agent", "source"], registry=r
        )
        self.accepted = Counter(
            "agspec_accepted_tokens", "Draft tokens accepted", ["agent", "source"], registry=r
        )
        self.draft_seconds = Counter(
            "agspec_draft_seconds", "Time spent drafting", ["agent"], registry=r
        )
        self.verify_seconds = Counter(
            "agspec_verify_seconds", "Time spent in verification forward passes", ["agent"],
            registry=r,
        )  # fmt: skip
        self.prefill_seconds = Counter(
            "agspec_prefill_seconds", "Time spent on prompt prefill", ["agent"], registry=r
        )
        self.queue_depth = Gauge("agspec_queue_depth", "Requests waiting", registry=r)
        self.running = Gauge("agspec_running_requests", "Requests decoding now", registry=r)
        self.sessions = Gauge("agspec_sessions", "Live sessions known", registry=r)
        self.drafter_sessions = Gauge(
            "agspec_drafter_sessions", "Sessions with drafter state", registry=r
        )
        self.session_requests = Counter(
            "agspec_session_requests", "Requests by how their session was found", ["kind"],
            registry=r,
        )  # fmt: skip
        self.known_messages = Counter(
            "agspec_session_known_messages",
            "Leading messages of requests that their session had already seen",
            registry=r,
        )
        self.cancelled = Counter(
            "agspec_cancelled", "Generations ended early", ["reason"], registry=r
        )
        self.rejected = Counter(
            "agspec_rejected", "Requests refused before decoding", ["reason"], registry=r
        )
        self.latency = Histogram(
            "agspec_request_seconds",
            "Wall time of served requests",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )

    def agent_label(self, agent: str) -> str:
        with self._lock:
            if agent in self._agents:
                return agent
            if len(self._agents) < MAX_AGENTS:
                self._agents.add(agent)
                return agent
        return "other"

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
