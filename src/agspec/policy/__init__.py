"""Retrieval and draft-length policies (layer 3): which corpus, which occurrence, how many.

The draft-length part lives in `agspec.policy.length`; the cost of verification that
decides p* lives in `agspec.costmodel`.
"""

from agspec.policy.length import (
    VARIANTS,
    AcceptanceRecord,
    CapsFileError,
    DraftLengthPolicy,
    LengthDecision,
    OnlineScale,
    OnlineScaleConfig,
    ProfiledCap,
    acceptance_curve,
    cap_from_curve,
)

__all__ = [
    "VARIANTS",
    "AcceptanceRecord",
    "CapsFileError",
    "DraftLengthPolicy",
    "LengthDecision",
    "OnlineScale",
    "OnlineScaleConfig",
    "ProfiledCap",
    "acceptance_curve",
    "cap_from_curve",
]
