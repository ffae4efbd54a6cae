"""How a drafter server is built: a factory of one `DrafterContext`.

Every pluggable drafter (AgSpec's named variants, `ar`, each baseline family) is a
`DrafterFactory`: `factory(context) -> DrafterServer`, registered by name in
`agspec.lab.registry.DRAFTERS`. The context carries everything of the run a factory may
read (the other fold's documents, the tokenizer, the cost model, the batch size, the
profiled caps), so a factory gives the same server in the process that made the context
and in a worker started by `fork` or `spawn`: no run setting travels in a module global.

>>> ctx = DrafterContext(global_docs=[[1, 2, 3]], batch_size=16)
>>> ctx.batch_size, ctx.caps is None
(16, True)
>>> DrafterContext(batch_size=0)
Traceback (most recent call last):
...
ValueError: batch_size must be an int >= 1, got 0
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agspec.drafter.protocol import DrafterServer
from agspec.policy.caps import ProfiledCap


@dataclass(frozen=True)
class DrafterContext:
    """The run configuration a drafter factory is given, explicitly."""

    # The global corpus as token-id documents (the other fold's outputs in the lab).
    global_docs: Sequence[Sequence[int]] = ()
    tokenizer: Any = None  # `.encode(text) -> list[int]`, for artifacts; None: none given
    cost_model: Any = None  # `agspec.policy.costmodel`; None: the drafter's defaults
    batch_size: int = 1
    caps: ProfiledCap | None = None  # per-agent caps from `agspec profile`; None: built-in

    def __post_init__(self) -> None:
        b = self.batch_size
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {b!r}")
        if isinstance(self.global_docs, (str, bytes)):
            raise TypeError("global_docs must be a list of token-id lists")
        if self.caps is not None and not isinstance(self.caps, ProfiledCap):
            raise TypeError(f"caps must be a ProfiledCap or None, got {type(self.caps).__name__}")


DrafterFactory = Callable[[DrafterContext], DrafterServer]
