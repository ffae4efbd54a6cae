"""The named drafter configurations of the replay lab: the default and its ablations."""

from __future__ import annotations

from agspec.drafter.config import AgSpecConfig

# The ablation ladder of the replay lab, by name.
VARIANTS: dict[str, AgSpecConfig] = {
    "agspec": AgSpecConfig(),
    "agspec-request-only": AgSpecConfig(
        use_request=True, use_session=False, use_workspace=False, use_global=False
    ),
    "agspec-session": AgSpecConfig(use_workspace=False, use_global=False),
    "agspec-session+workspace": AgSpecConfig(use_emission_forms=False, use_global=False),
    "agspec-session+workspace+forms": AgSpecConfig(use_global=False),
    "agspec-static": AgSpecConfig(length_mode="static"),
    "agspec-match": AgSpecConfig(length_mode="match"),
    "agspec-cap": AgSpecConfig(length_mode="cap"),
    "agspec-on-suffix-tree": AgSpecConfig(engine="suffix-tree"),
    # Beyond the paper, each measured in the replay lab (docs/results.md).
    "agspec-recent": AgSpecConfig(session_rule="recent", global_rule="recent"),
    "agspec-history": AgSpecConfig(use_history=True),
    "agspec-gated": AgSpecConfig(min_match_tokens=8),
    # Length from the cost profile and learned acceptance curves (no cap, no α, no gate):
    # drafts only where the expected tokens per unit of step cost beat plain decoding.
    "agspec-cost": AgSpecConfig(length_mode="cost"),
    "agspec-cost-plus": AgSpecConfig(
        length_mode="cost",
        session_rule="recent",
        global_rule="recent",
        history_rule="recent",
        use_history=True,
    ),
    "agspec-plus": AgSpecConfig(
        session_rule="recent",
        global_rule="recent",
        history_rule="recent",
        use_history=True,
        default_cap_tokens=32,
        scale_max=16.0,
    ),
}
