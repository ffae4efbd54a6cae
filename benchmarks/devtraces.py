"""The dev traces the benchmarks replay: `../shared/data/traces` beside the checkout.

from devtraces import DIRS, dev_sessions
sessions = dev_sessions("swe-agent")   # agspec.traces.Session objects, in file order
"""

from __future__ import annotations

from pathlib import Path

from agspec.traces import import_traces

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
