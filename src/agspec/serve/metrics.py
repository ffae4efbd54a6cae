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
- `agspec_tree_steps_total{agent}` (verification steps whose draft was a token tree of
  more than one branch)
- `agspec_draft_seconds_total{agent}`, `agspec_verify_seconds_total{agent}`,
  `agspec_prefill_seconds_total{agent}`

Server-wide: `agspec_queue_depth`, `agspec_running_requests`, `agspec_sessions`,
`agspec_drafter_sessions`,
`agspec_session_requests_total{kind}` (kind: new, continued, explicit),
`agspec_session_known_messages_total` (messages of requests their session had already
seen), `agspec_cancelled_total{reason}`, `agspec_rejected_total{reason}`,
`agspec_request_seconds` (histogram), `agspec_cost_profile_live_samples`,
`agspec_step_cost{batch_size, n_tokens}` (the live cost profile, `agspec.serve.cost_online`),
`agspec_kv_prefix_copies_total`, `agspec_kv_saves_total`, `agspec_kv_restores_total{result}`,
`agspec_kv_store_bytes`, `agspec_kv_store_entries` (prefixes shared across slots and the
saved-KV store, docs/serve-parallel.md).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ServeMetrics", "CONTENT_TYPE", "MAX_AGENTS", "speculative_decoding_metrics"]

MAX_AGENTS = 64


def speculative_decoding_metrics(
    steps: Sequence[tuple[int, int]], *, num_draft_tokens: int
) -> dict[str, Any]:
    """One request's speculation figures in vLLM's per-request schema (the
    `metrics.speculative_decoding` object of a response), from its verification steps
    `(drafted tokens, accepted tokens)`.

    As vLLM counts them: a *spec step* is a verification step whose draft was not empty
    (vLLM's `num_drafts`); `draft_acceptance_rate` = accepted / drafted tokens (a fraction,
    null without drafts); `mean_acceptance_length` = 1 + accepted / spec steps, so it
    *includes* the bonus token, vLLM's convention (AgSpec's own "accept length" elsewhere
    excludes it: this is accept length + 1); `acceptance_histogram[k]` = spec steps that
    accepted exactly k draft tokens, k = 0..`num_draft_tokens` (the server's longest draft).

    >>> m = speculative_decoding_metrics([(4, 2), (0, 0), (3, 3)], num_draft_tokens=4)
    >>> m["num_spec_steps"], m["mean_acceptance_length"], m["acceptance_histogram"]
    (2, 3.5, [0, 0, 1, 1, 0])
    """
    spec = [(d, a) for d, a in steps if d > 0]
    drafted = sum(d for d, _ in spec)
    accepted = sum(a for _, a in spec)
    histogram = [0] * (max(num_draft_tokens, max((a for _, a in spec), default=0)) + 1)
    for _, a in spec:
        histogram[a] += 1
    return {
        "num_spec_steps": len(spec),
        "num_draft_tokens": drafted,
        "num_accepted_draft_tokens": accepted,
        "mean_acceptance_length": round(1.0 + accepted / len(spec), 4) if spec else None,
        "draft_acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        "acceptance_histogram": histogram,
    }


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
        self.tree_steps = Counter(
            "agspec_tree_steps", "Verification steps of a token tree (more than one branch)",
            ["agent"], registry=r,
        )  # fmt: skip
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
        self.cost_samples = Gauge(
            "agspec_cost_profile_live_samples",
            "Timed decoding steps the live cost profile holds",
            registry=r,
        )
        self.step_cost = Gauge(
            "agspec_step_cost",
            "Cost of a step of n_tokens per request, in plain steps, as the drafter prices it",
            ["batch_size", "n_tokens"],
            registry=r,
        )
        self.kv_copies = Counter(
            "agspec_kv_prefix_copies",
            "Requests that started from another slot's cells for their prompt's prefix",
            registry=r,
        )
        self.kv_saves = Counter(
            "agspec_kv_saves", "Slot caches saved to the KV store before being cut", registry=r
        )
        self.kv_restores = Counter(
            "agspec_kv_restores",
            "Requests that started from a saved KV entry (result: ok, failed)",
            ["result"],
            registry=r,
        )
        self.kv_store_bytes = Gauge("agspec_kv_store_bytes", "Bytes the KV store holds", registry=r)
        self.kv_store_entries = Gauge(
            "agspec_kv_store_entries", "Entries the KV store holds", registry=r
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
