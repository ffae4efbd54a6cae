"""What the replay lab replays and what it writes down, one row per verification step.

A `ReplaySession` is a list of `ReplayCall`s already tokenized: the prompt the model
received and the output it produced. The simulator turns each call into steps; a
`StepRecorder` keeps one row per step in columns (plain Python lists, cheap to append)
and writes them as parquet (pyarrow) or JSONL.

Example: a call with output `[8, 9, 12]` whose drafter proposes `[8, 9, 10]` at the first
step is one step: drafted 3, accepted 2, committed 3 (`8, 9` plus the bonus token `12`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ReplayCall:
    """One recorded model call, tokenized.

    `artifacts` are the `(path, text)` files this call shows; the simulator opens each one
    (`DrafterSession.open_artifact`) the first time the session shows that exact text,
    before the call begins.

    >>> ReplayCall("coder", "coding", 0, prompt_ids=[5, 6, 7], output_ids=[8, 9, 12]).agent
    'coder'
    """

    agent: str
    role: str
    turn: int
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    artifacts: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ReplaySession:
    """A recorded session: its calls, in the order they ran."""

    session_id: str
    calls: tuple[ReplayCall, ...]
    source: str = "unknown"
    emission_format: str = "none"
    model: str = ""

    @property
    def num_output_tokens(self) -> int:
        return sum(len(c.output_ids) for c in self.calls)


# Columns of a step record, in the order they are written. `drafted` counts tree nodes
# for a tree draft; `first_branch_accepted` is the accept length its first branch alone
# would have had (= `accepted` for a chain). `batch_step` is the index of the batched
# verification step this row belonged to; `num_active` the requests in it.
STEP_COLUMNS: tuple[str, ...] = (
    "session",
    "call_index",
    "agent",
    "role",
    "turn",
    "step",
    "position",
    "drafted",
    "accepted",
    "committed",
    "match_length",
    "source_corpus",
    "draft_ns",
    "first_branch_accepted",
    "batch_step",
    "num_active",
)


@dataclass
class StepRecorder:
    """Column store of step records; `append` takes one value per column in `STEP_COLUMNS`."""

    columns: dict[str, list[Any]] = field(
        default_factory=lambda: {name: [] for name in STEP_COLUMNS}
    )

    def __len__(self) -> int:
        return len(self.columns["session"])

    def append_row(self, row: Sequence[Any]) -> None:
        for name, value in zip(STEP_COLUMNS, row, strict=True):
            self.columns[name].append(value)

    def rows(self) -> list[dict[str, Any]]:
        cols = [self.columns[name] for name in STEP_COLUMNS]
        return [dict(zip(STEP_COLUMNS, values, strict=True)) for values in zip(*cols, strict=True)]


def write_steps(recorder: StepRecorder, path_stem: Path, *, extra: dict[str, Any]) -> Path:
    """Write the steps as `<stem>.parquet` (pyarrow present) or `<stem>.jsonl`.

    `extra` holds constant columns (drafter name, batch size) added to every row.
    Returns the path written.
    """
    n = len(recorder)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        out = path_stem.with_suffix(".jsonl")
        with out.open("w", encoding="utf-8") as fh:
            for row in recorder.rows():
                row.update(extra)
                fh.write(json.dumps(row) + "\n")
        return out
    arrays: dict[str, Any] = {}
    for name in STEP_COLUMNS:
        values = recorder.columns[name]
        if name in ("session", "agent", "role", "source_corpus"):
            arrays[name] = pa.array(values, type=pa.string()).dictionary_encode()
        else:
            arrays[name] = pa.array(values, type=pa.int64())
    for name, value in extra.items():
        arrays[name] = pa.array([value] * n).dictionary_encode()
    out = path_stem.with_suffix(".parquet")
    pq.write_table(pa.table(arrays), out)
    return out


def read_steps(path: Path) -> list[dict[str, Any]]:
    """Read step rows written by `write_steps` (either format)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.read_table(path).to_pylist())
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
