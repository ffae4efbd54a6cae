"""The dev traces the benchmarks replay: `../shared/data/traces` beside the checkout.

from devtraces import DIRS, dev_sessions, global_docs, begin_call
sessions = dev_sessions("swe-agent")   # agspec.traces.Session objects, in file order
docs = global_docs(sessions[20:], tok, max_tokens=10_000_000)  # for GlobalCorpus.build
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from agspec.traces import import_traces, render_call

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"
# Source name (the importer) -> its folder under TRACES.
DIRS = {"swe-agent": "swe-agent-java", "chatdev": "chatdev", "mini-swe-agent": "mini-swe-agent"}


def dev_sessions(source: str) -> list:
    """Every session of one dev source; a clear error when the traces are not there."""
    folder = TRACES / DIRS[source]
    if not folder.is_dir():
        raise SystemExit(f"no dev traces at {folder}: put ../shared beside the checkout")
    sessions, _ = import_traces(source, [folder])
    return sessions


def global_docs(sessions: list, tok: Any, *, max_tokens: int | None = None) -> list[np.ndarray]:
    """Each call's prompt and recorded output as one int32 document, in order: the global
    corpus the benchmarks draft from. With `max_tokens`, the sessions are repeated until
    the documents hold that many tokens (the last one ends the list as soon as they do)."""
    docs: list[np.ndarray] = []
    n = 0
    while sessions and (max_tokens is None or n < max_tokens):
        for s in sessions:
            for c in s.calls:
                p, o = render_call(c, tok)
                docs.append(np.asarray(p + o, dtype=np.int32))
                n += docs[-1].size
                if max_tokens is not None and n >= max_tokens:
                    return docs
        if max_tokens is None or n == 0:  # one pass, or sessions without calls
            break
    return docs


def begin_call(server: Any, session_id: str, call: Any, prompt: list[int]) -> Any:
    """A recorded call begun as the engine would: its session (created on first use),
    the artifacts it opened, then `begin` with its rendered prompt."""
    sess = server.session(session_id, emission_format=call.emission_format)
    for a in call.artifacts:
        if a.text:
            sess.open_artifact(a.path, a.text)
    d = sess.call(call.agent, call.role, call.turn)
    d.begin(prompt)
    return d
