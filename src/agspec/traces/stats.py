"""Per-source and per-role counts of trace files: sessions, calls, tokens, artifacts.

Token counts use the ChatML rendering of `agspec.traces.render` (prompt) and the output's
ordinary-text ids. `turns/session` is calls per session (a call's `turn` is its position).

>>> from agspec.traces.schema import Call, Message, Session
>>> s = Session("s", "demo", "m", "t", [Call("a", "code", 0, [Message("user", "hi")], "ok")])
>>> t = TraceStats.of([s], "qwen2.5")
>>> t.by_source["demo"].calls, t.by_source["demo"].prompt_tokens, t.by_source["demo"].output_tokens
(1, 9, 1)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from agspec.tokenizers import Tokenizer
from agspec.traces.render import get_renderer
from agspec.traces.schema import Session

__all__ = ["Counts", "TraceStats"]


@dataclass
class Counts:
    sessions: int = 0
    calls: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    artifacts: int = 0
    artifact_tokens: int = 0

    def turns_per_session(self) -> float:
        return self.calls / self.sessions if self.sessions else 0.0


@dataclass
class TraceStats:
    by_source: dict[str, Counts] = field(default_factory=dict)
    by_source_role: dict[tuple[str, str], Counts] = field(default_factory=dict)

    @classmethod
    def of(cls, sessions: Iterable[Session], tokenizer: Tokenizer | str = "qwen2.5") -> TraceStats:
        stats = cls()
        for s in sessions:
            stats.add(s, tokenizer)
        return stats

    def add(self, session: Session, tokenizer: Tokenizer | str = "qwen2.5") -> None:
        r = get_renderer(tokenizer)
        src = self.by_source.setdefault(session.source, Counts())
        src.sessions += 1
        roles_seen: set[str] = set()
        for call in session.calls:
            n_prompt, n_output = r.count_call(call)
            n_art_tokens = sum(len(r.encode(a.text)) for a in call.artifacts)
            per_role = self.by_source_role.setdefault((session.source, call.role), Counts())
            if call.role not in roles_seen:
                roles_seen.add(call.role)
                per_role.sessions += 1
            for c in (src, per_role):
                c.calls += 1
                c.prompt_tokens += n_prompt
                c.output_tokens += n_output
                c.artifacts += len(call.artifacts)
                c.artifact_tokens += n_art_tokens

    def table(self) -> str:
        """A Markdown table: one row per source, then one per (source, role)."""
        head = (
            "| source | role | sessions | calls | turns/session | prompt tokens "
            "| output tokens | artifacts | artifact tokens |\n"
            "|---|---|--:|--:|--:|--:|--:|--:|--:|\n"
        )
        rows = []
        for src in sorted(self.by_source):
            rows.append(_row(src, "all", self.by_source[src]))
            for (s, role), c in sorted(self.by_source_role.items()):
                if s == src:
                    rows.append(_row(src, role, c))
        return head + "\n".join(rows) + "\n"


def _row(source: str, role: str, c: Counts) -> str:
    return (
        f"| {source} | {role} | {c.sessions} | {c.calls} | {c.turns_per_session():.1f} "
        f"| {c.prompt_tokens:,} | {c.output_tokens:,} | {c.artifacts} | {c.artifact_tokens:,} |"
    )
