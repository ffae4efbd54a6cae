"""Agent traces: the AgSpec trace format, importers for real scaffolds, rendering to tokens.

- `Session`, `Call`, `Message`, `Artifact`: the format (`docs/traces.md`, version 1).
- `read_sessions(path)`, `write_sessions(sessions, path)`, `check_file(path)`: JSONL.
- `import_traces(format, paths)`: SWE-agent 0.x, mini-swe-agent, ChatDev 1.0.
- `render_call(call, tokenizer)`: ChatML prompt ids and output ids.
- `recorder.Recorder`: resumable recording, one line per finished session, plus the
  live-stats sidecar (`agspec record`, `agspec serve --record`).

>>> from agspec.traces import Call, Message, render_call
>>> call = Call("agent", "code", 0, [Message("user", "hi")], "ok")
>>> render_call(call, "qwen2.5")
([151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198], [562])
"""

from agspec.traces.importers import IMPORTERS, Skipped, import_traces, iter_import
from agspec.traces.io import check_file, iter_sessions, read_sessions, write_sessions
from agspec.traces.render import Renderer, render_artifacts, render_call
from agspec.traces.schema import (
    FORMAT_VERSION,
    Artifact,
    Call,
    EmissionFormat,
    Message,
    Role,
    Session,
    TraceFormatError,
    UnsupportedLayoutError,
)

__all__ = [
    "FORMAT_VERSION",
    "IMPORTERS",
    "Artifact",
    "Call",
    "EmissionFormat",
    "Message",
    "Renderer",
    "Role",
    "Session",
    "Skipped",
    "TraceFormatError",
    "UnsupportedLayoutError",
    "check_file",
    "import_traces",
    "iter_import",
    "iter_sessions",
    "read_sessions",
    "render_artifacts",
    "render_call",
    "write_sessions",
]
