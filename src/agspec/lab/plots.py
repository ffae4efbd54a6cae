"""Plots of one or several runs (matplotlib, Agg backend, PNG files).

- `accept_by_turn.png`: mean accept length per agent across turns, one panel per source
  and drafter chosen (default: every drafter at the smallest batch size);
- `speedup.png`: modelled speedup over AR by drafter, one bar group per source and batch;
- `ablation-<ladder>.png`: an ablation ladder, its drafters in order, speedup per source
  and batch size. Default ladders (`LADDERS`): the corpora (request only, + session,
  + workspace, + emission forms, + global = full AgSpec) and the draft length (static,
  match-scaled, + profiled cap, + online scale = full AgSpec). `--ladder` adds one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LADDERS: dict[str, tuple[str, ...]] = {
    "corpora": (
        "agspec-paper-request-only",
        "agspec-paper-session",
        "agspec-paper-session+workspace",
        "agspec-paper-session+workspace+forms",
        "agspec-paper",
    ),
    "length": ("agspec-paper-static", "agspec-paper-match", "agspec-paper-cap", "agspec-paper"),
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# Drafters shown in the accept-by-turn panels when present (else the first four run).
TURN_PANEL_DRAFTERS = ("agspec", "suffix-64", "pld-hf", "oracle")


def plot_accept_by_turn(
    entries: Sequence[dict[str, Any]], path: str | os.PathLike[str], *, max_agents: int = 8
) -> Path:
    plt = _pyplot()
    b = min(e["batch_size"] for e in entries)
    chosen = [e for e in entries if e["batch_size"] == b]
    sources = list(dict.fromkeys(e["source"] for e in chosen))
    ran = list(dict.fromkeys(e["drafter"] for e in chosen))
    drafters = [d for d in TURN_PANEL_DRAFTERS if d in ran] or ran[:4]
    fig, axes = plt.subplots(
        len(sources),
        len(drafters),
        figsize=(3.2 * len(drafters), 2.6 * len(sources)),
        squeeze=False,
        sharey=True,
    )
    for i, source in enumerate(sources):
        for j, drafter in enumerate(drafters):
            ax = axes[i][j]
            entry = next(
                (e for e in chosen if e["source"] == source and e["drafter"] == drafter), None
            )
            if entry is None:
                ax.set_visible(False)
                continue
            per_turn = entry.get("per_agent_turn", [])
            steps_by_agent: dict[str, int] = {}
            for row in per_turn:
                steps_by_agent[row["agent"]] = (
                    steps_by_agent.get(row["agent"], 0) + row["num_steps"]
                )
            top = sorted(steps_by_agent, key=lambda a: -steps_by_agent[a])[:max_agents]
            for agent in top:
                rows = [r for r in per_turn if r["agent"] == agent]
                ax.plot(
                    [r["turn"] for r in rows],
                    [r["mean_accept_length"] for r in rows],
                    marker=".",
                    linewidth=1,
                    label=agent,
                )
            ax.set_title(f"{source} / {drafter}", fontsize=8)
            ax.set_xlabel("turn", fontsize=7)
            if j == 0:
                ax.set_ylabel(f"mean accept length (B={b})", fontsize=7)
            ax.tick_params(labelsize=6)
            if top:
                ax.legend(fontsize=5)
    fig.tight_layout()
    out = Path(path)
    _save(fig, out)
    plt.close(fig)
    return out


def plot_speedup(
    entries: Sequence[dict[str, Any]],
    path: str | os.PathLike[str],
    *,
    drafters: Sequence[str] | None = None,
    title: str = "modelled speedup over AR",
) -> Path:
    plt = _pyplot()
    names = list(drafters) if drafters else list(dict.fromkeys(e["drafter"] for e in entries))
    groups = sorted({(e["source"], e["batch_size"]) for e in entries})
    by = {(e["source"], e["batch_size"], e["drafter"]): e["speedup"] for e in entries}
    fig, ax = plt.subplots(figsize=(min(16.0, max(6.0, 0.12 * len(names) * len(groups))), 4.2))
    width = 0.8 / max(len(names), 1)
    colors = plt.get_cmap("tab20").colors
    for k, name in enumerate(names):
        xs = [g + k * width for g in range(len(groups))]
        ys = [by.get((s, b, name), 0.0) for s, b in groups]
        ax.bar(xs, ys, width=width, label=name, color=colors[k % len(colors)])
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
    ax.set_xticklabels([f"{s}\nB={b}" for s, b in groups], fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_ylabel("speedup (x)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, ncol=4, loc="upper right")
    fig.tight_layout()
    out = Path(path)
    _save(fig, out)
    plt.close(fig)
    return out


def _save(fig: Any, out: Path) -> None:
    """PNG written whole or not at all (a temporary file renamed when complete)."""
    from agspec._files import atomic_output

    with atomic_output(out) as tmp:
        fig.savefig(tmp, dpi=120, format="png")


def write_plots(
    entries: Sequence[dict[str, Any]],
    out_dir: str | os.PathLike[str],
    *,
    ladder: Sequence[str] | None = None,
) -> list[Path]:
    """Write every plot into `out_dir`; a ladder is drawn when two or more of its drafters
    are in the entries (`ladder`, if given, is drawn as `ablation-custom.png`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not entries:
        return []
    paths = [
        plot_accept_by_turn(entries, out / "accept_by_turn.png"),
        plot_speedup(entries, out / "speedup.png"),
    ]
    present = {e["drafter"] for e in entries}
    ladders = dict(LADDERS)
    if ladder:
        ladders["custom"] = tuple(ladder)
    for key, names in ladders.items():
        steps = [name for name in names if name in present]
        if len(steps) >= 2:
            paths.append(
                plot_speedup(
                    entries,
                    out / f"ablation-{key}.png",
                    drafters=steps,
                    title=f"ablation ladder ({key}): " + " -> ".join(steps),
                )
            )
    return paths
