"""Tables from one or several run folders (`summary.json`).

`load_entries(dirs)` reads the entries; `format_table(entries)` prints one row per source
and drafter with, per batch size, the modelled speedup over AR, tokens per step, mean
accept length (bonus token excluded), the speedup once measured CPU drafting time is
added, and drafting microseconds per output token.

Example row (B = 1 only): `swe-agent  pld-hf   2.05x  2.14  1.14  2.01x  3.2`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

# A B > 1 figure is flagged when fewer than this share of the run's output tokens were
# committed in steps with all B slots busy (`full_batch_share`).
LOW_COVERAGE = 0.5
FLAG = "†"
FLAG_NOTE = (
    f"{FLAG} less than half of the run's output tokens were decoded with the batch full: the "
    "full-batch figure rests on that share only, and the whole-run figure is mostly the "
    "drain at a smaller batch (docs/replay.md, 'Reading B > 1 figures')."
)


def coverage_of(entry: dict[str, Any]) -> float | None:
    """Share of output tokens in full-batch steps, or None for B = 1 or an old run folder
    (recomputed from `full_batch_tokens` when `full_batch_share` is missing)."""
    if entry.get("batch_size", 1) <= 1:
        return None
    share = entry.get("full_batch_share")
    if share is None and entry.get("num_output_tokens") and "full_batch_tokens" in entry:
        share = entry["full_batch_tokens"] / entry["num_output_tokens"]
    return None if share is None else float(share)


def _flag(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return ""
    share = coverage_of(entry)
    return FLAG if share is not None and share < LOW_COVERAGE else ""


def load_entries(
    dirs: Iterable[str | os.PathLike[str]], *, allow_incomplete: bool = False
) -> list[dict[str, Any]]:
    """Every summary entry of the given run folders, each tagged with its `run` folder.

    A folder without a valid `complete.json` (`agspec.lab.run.run_incomplete_reason`)
    is an error, or with `allow_incomplete` its entries are tagged `incomplete: True`.
    """
    from agspec.lab.run import run_incomplete_reason

    entries: list[dict[str, Any]] = []
    for d in dirs:
        path = Path(d) / "summary.json"
        if not path.is_file():
            raise ValueError(f"{d}: not a replay run folder (no summary.json)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from exc
        found = data.get("entries", [])
        why = run_incomplete_reason(d)
        if why is not None and not allow_incomplete:
            raise ValueError(
                f"{d}: incomplete run ({why}; {len(found)} entries so far): re-run it, or "
                "pass --allow-incomplete to see its partial figures, flagged"
            )
        for entry in found:
            entries.append({**entry, "run": str(d), **({"incomplete": True} if why else {})})
    return entries


def format_table(entries: Sequence[dict[str, Any]]) -> str:
    """A plain-text comparison table: rows source x drafter, column groups per batch size."""
    if not entries:
        return "(no entries)"
    batch_sizes = sorted({e["batch_size"] for e in entries})
    rows: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for e in entries:
        rows.setdefault((e["source"], e["drafter"]), {})[e["batch_size"]] = e
    header = ["source", "drafter"]
    for b in batch_sizes:
        header += [f"B={b} speedup", "tok/step", "accept", "w/ draft", "draft us/tok"]
        if b > 1:
            header.append("coverage")
    lines = [header]
    flagged = False
    for (source, drafter), by_b in rows.items():
        line = [source, drafter]
        for b in batch_sizes:
            found = by_b.get(b)
            if found is None:
                line += ["-"] * (6 if b > 1 else 5)
                continue
            e = found
            mark = _flag(e)
            flagged = flagged or bool(mark)
            line += [
                f"{e['speedup']:.2f}x{mark}",
                f"{e['tokens_per_step']:.2f}",
                f"{e['mean_accept_length']:.2f}",
                f"{e['speedup_with_drafting']:.2f}x{mark}",
                f"{e['draft_us_per_token']:.1f}",
            ]
            if b > 1:
                share = coverage_of(e)
                line.append("-" if share is None else f"{share:.0%}")
        lines.append(line)
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    out = []
    for i, row in enumerate(lines):
        cells = [
            cell.ljust(widths[j]) if j < 2 else cell.rjust(widths[j]) for j, cell in enumerate(row)
        ]
        out.append("  ".join(cells).rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    if flagged:
        out.append(FLAG_NOTE)
    return "\n".join(out)


def format_agent_table(entries: Sequence[dict[str, Any]], *, batch_size: int = 1) -> str:
    """Mean accept length per agent (rows) and drafter (columns) at one batch size."""
    chosen = [e for e in entries if e["batch_size"] == batch_size]
    if not chosen:
        return f"(no entries at B={batch_size})"
    drafters = list(dict.fromkeys(e["drafter"] for e in chosen))
    keys = sorted({(e["source"], a) for e in chosen for a in e.get("per_agent", {})})
    by = {(e["source"], e["drafter"]): e for e in chosen}
    header = ["source", "agent", *drafters]
    lines = [header]
    for source, agent in keys:
        line = [source, agent]
        for d in drafters:
            stats = by.get((source, d), {}).get("per_agent", {}).get(agent)
            line.append(f"{stats['mean_accept_length']:.2f}" if stats else "-")
        lines.append(line)
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in lines
    )


def format_markdown(entries: Sequence[dict[str, Any]]) -> str:
    """Markdown tables, one per source: rows drafters, columns per batch size.

    Example row: `| pld-hf | 2.84x | 1.84 | 2.80x | 3.37x | ... |`.
    """
    if not entries:
        return "(no entries)"
    batch_sizes = sorted({e["batch_size"] for e in entries})
    out: list[str] = []
    for source in dict.fromkeys(e["source"] for e in entries):
        rows: dict[str, dict[int, dict[str, Any]]] = {}
        for e in entries:
            if e["source"] == source:
                rows.setdefault(e["drafter"], {})[e["batch_size"]] = e
        header = ["drafter", "tok/step", "accept"]
        for b in batch_sizes:
            header += [f"B={b} speedup", f"B={b} w/ drafting"]
            if b > 1:
                header += [f"B={b} full batch", f"B={b} coverage"]
        header.append("draft us/tok")
        flagged = False
        out.append(f"**{source}**")
        out.append("")
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        for drafter, by_b in rows.items():
            first = by_b[min(by_b)]
            cells = [
                drafter,
                f"{first['tokens_per_step']:.2f}",
                f"{first['mean_accept_length']:.2f}",
            ]
            for b in batch_sizes:
                at_b = by_b.get(b)
                mark = _flag(at_b)
                flagged = flagged or bool(mark)
                cells += (
                    [
                        f"{at_b['speedup']:.2f}x{mark}",
                        f"{at_b['speedup_with_drafting']:.2f}x{mark}",
                    ]
                    if at_b
                    else ["-", "-"]
                )
                if b > 1:
                    full = at_b.get("speedup_full_batch") if at_b else None
                    share = coverage_of(at_b) if at_b else None
                    cells.append(f"{full:.2f}x{mark}" if full else "-")
                    cells.append("-" if share is None else f"{share:.0%}")
            cells.append(f"{first['draft_us_per_token']:.0f}")
            out.append("| " + " | ".join(cells) + " |")
        if flagged:
            out += ["", FLAG_NOTE]
        out.append("")
    return "\n".join(out)


def format_tree_table(entries: Sequence[dict[str, Any]]) -> str:
    """Markdown, per source and batch size: tokens per step, tree nodes per step, the
    accepted path length (bonus excluded), the first branch's own accept length and the
    share of steps a later branch won (`BatchResult.branch_win_share`); a chain drafter
    has wins 0 and first = accept.

    Example row: `| chatdev | 1 | agspec | 4.80 | 40.1 | 3.81 | 3.14 | 12.3% |`.
    """
    if not entries:
        return "(no entries)"
    out = [
        "| source | B | drafter | tok/step | nodes/step | accept | first branch "
        "| later branch won |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in sorted(entries, key=lambda e: (e["source"], e["batch_size"])):
        nodes = e.get("drafted_per_step")
        if nodes is None and e.get("num_steps"):
            nodes = e["num_drafted_tokens"] / e["num_steps"]
        first = e.get("first_branch_accept_length", e["mean_accept_length"])
        wins = e.get("branch_win_share", 0.0)
        out.append(
            f"| {e['source']} | {e['batch_size']} | {e['drafter']} | "
            f"{e['tokens_per_step']:.2f} | {nodes or 0.0:.1f} | "
            f"{e['mean_accept_length']:.2f} | {first:.2f} | {wins:.1%} |"
        )
    return "\n".join(out)
