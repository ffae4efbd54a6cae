"""The named drafter configurations: the default `agspec`, the paper's method and ablations.

Every name says what it is: `agspec` is the default (the best configuration measured on
the dev traces across batch sizes, docs/drafter.md "Variants"); `agspec-paper` is the
paper's method exactly; `agspec-paper-X` is a step of the paper's ablation ladder (a part
taken away or a simpler length rule); `agspec-paper+X` adds one thing beyond the paper;
`agspec-no-X` / `agspec-X` change one thing of the default. The dataclass defaults of
`AgSpecConfig` are the paper's values, so `AgSpecConfig(...)` reads as "the paper, but".

>>> default = VARIANTS["agspec"]
>>> default.length_mode, default.session_rule, default.use_history
('cost', 'recent', True)
>>> VARIANTS["agspec-paper"] == AgSpecConfig()
True
"""

from __future__ import annotations

from dataclasses import replace

from agspec.drafter.config import AgSpecConfig

PAPER = AgSpecConfig()
# The default: the cost-aware length (from the backend's measured cost profile and
# acceptance curves learned online; needs a cost model), most-recent occurrences in every
# corpus, and the history corpus of finished calls.
DEFAULT = replace(
    PAPER,
    length_mode="cost",
    session_rule="recent",
    global_rule="recent",
    history_rule="recent",
    use_history=True,
    # Token trees: branches from several occurrences and every corpus, sized by the cost
    # rule (a CPU profile keeps the chain); chain engines (vLLM) get the first branch.
    tree_max_nodes=64,
    # Drafts of up to 64 tokens where verifying them is free (a large model at batch
    # size 1 on a big GPU); 32 elsewhere.
    cost_free_draft_tokens=64,
)

VARIANTS: dict[str, AgSpecConfig] = {
    "agspec": DEFAULT,
    # The default with one thing changed.
    "agspec-no-history": replace(DEFAULT, use_history=False),
    "agspec-chain": replace(DEFAULT, tree_max_nodes=1),
    # Tree candidates from each corpus's most recent, most frequent and first occurrence
    # only (the default's trees before 2026-12-06): what the other recent ones add.
    "agspec-few-branches": replace(DEFAULT, tree_occurrences=1),
    "agspec-frequent": replace(
        DEFAULT, session_rule="frequent", global_rule="frequent", history_rule="frequent"
    ),
    # The paper's method and its ablation ladder (paper §4).
    "agspec-paper": PAPER,
    "agspec-paper-request-only": replace(
        PAPER, use_request=True, use_session=False, use_workspace=False, use_global=False
    ),
    "agspec-paper-session": replace(PAPER, use_workspace=False, use_global=False),
    "agspec-paper-session+workspace": replace(PAPER, use_emission_forms=False, use_global=False),
    "agspec-paper-session+workspace+forms": replace(PAPER, use_global=False),
    "agspec-paper-static": replace(PAPER, length_mode="static"),
    "agspec-paper-match": replace(PAPER, length_mode="match"),
    "agspec-paper-cap": replace(PAPER, length_mode="cap"),
    "agspec-paper-on-suffix-tree": replace(PAPER, engine="suffix-tree"),
    # The paper's method plus one thing beyond it, each measured in the lab (docs/results.md).
    "agspec-paper+recent": replace(PAPER, session_rule="recent", global_rule="recent"),
    "agspec-paper+history": replace(PAPER, use_history=True),
    "agspec-paper+gate8": replace(PAPER, min_match_tokens=8),
    # Length from the cost profile and learned acceptance curves (no cap, no α, no gate):
    # drafts only where the expected tokens per unit of step cost beat plain decoding.
    "agspec-paper+cost": replace(PAPER, length_mode="cost"),
    "agspec-paper+recent+history+cap32": replace(
        PAPER,
        session_rule="recent",
        global_rule="recent",
        history_rule="recent",
        use_history=True,
        default_cap_tokens=32,
        scale_max=16.0,
    ),
}

# Names used before 2026-12-01 (docs/results.md tables and older run folders carry them).
RENAMED: dict[str, str] = {
    "agspec-cost-plus": "agspec",
    "agspec-plus": "agspec-paper+recent+history+cap32",
    "agspec-cost": "agspec-paper+cost",
    "agspec-recent": "agspec-paper+recent",
    "agspec-history": "agspec-paper+history",
    "agspec-gated": "agspec-paper+gate8",
    "agspec-request-only": "agspec-paper-request-only",
    "agspec-session": "agspec-paper-session",
    "agspec-session+workspace": "agspec-paper-session+workspace",
    "agspec-session+workspace+forms": "agspec-paper-session+workspace+forms",
    "agspec-static": "agspec-paper-static",
    "agspec-match": "agspec-paper-match",
    "agspec-cap": "agspec-paper-cap",
    "agspec-on-suffix-tree": "agspec-paper-on-suffix-tree",
}


def renamed_hint(name: str) -> str:
    """' (renamed: now X)' for a name used before the rename, else ''."""
    new = RENAMED.get(name)
    if new is None:
        return ""
    return f" (renamed on 2026-12-01: now {new!r})"
