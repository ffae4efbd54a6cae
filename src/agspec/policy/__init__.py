"""Retrieval and draft-length policies (layer 3): which corpus, which occurrence, how many.

The draft-length part lives in `agspec.policy.length`; the cost of verification that
decides p* lives in `agspec.policy.costmodel`.
"""

from agspec.policy.caps import (
    AcceptanceRecord,
    CapsFileError,
    ProfiledCap,
    acceptance_curve,
    cap_from_curve,
)
from agspec.policy.length import VARIANTS, DraftLengthPolicy, LengthDecision
from agspec.policy.scale import OnlineScale, OnlineScaleConfig

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
