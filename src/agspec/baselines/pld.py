"""Prompt-lookup decoding (PLD): draft by copying what followed an earlier occurrence of
the request's last n tokens in the request's own tokens (prompt + output so far).

Both published engines use the same rule, with different knobs:

- try n-gram sizes from `max_ngram_tokens` down to `min_ngram_tokens`; the first size
  with an earlier occurrence wins;
- among the occurrences of that n-gram, take the earliest (leftmost) one that has at
  least one token after it (the trailing n-gram itself never counts);
- draft the up to `num_draft_tokens` tokens that follow it (fewer near the end).

`PLD_HF` is HF transformers' `PromptLookupCandidateGenerator` as selected by
`generate(prompt_lookup_num_tokens=10)` (`max_matching_ngram_size=2`, n from 2 down to 1);
it also cuts the draft before the first EOS token. `PLD_VLLM` is vLLM's `ngram` method
with its defaults (`prompt_lookup_min = prompt_lookup_max = 5`) and
`num_speculative_tokens=5`.

Example with concrete tokens (PLD_HF, n = 2 first):

    >>> d = PromptLookupDrafter(PLD_HF)
    >>> d.begin([5, 6, 7, 8, 9, 5, 6])      # "5 6" occurred at 0, followed by 7 8 9 5 6
    >>> d.propose(4)
    [7, 8, 9, 5]
    >>> d.accept([7, 8, 1])                 # model kept 7, 8 and wrote 1
    >>> d.propose(4)                        # "8 1" and "1" never occurred before
    []
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agspec.drafter.protocol import CallDrafter


@dataclass(frozen=True)
class PromptLookupConfig:
    """Knobs of one prompt-lookup variant (see the module docstring for the rule)."""

    name: str
    min_ngram_tokens: int
    max_ngram_tokens: int
    num_draft_tokens: int
    eos_token_ids: tuple[int, ...] = ()  # the draft stops before the first of these

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram_tokens <= self.max_ngram_tokens:
            raise ValueError(
                f"{self.name}: need 1 <= min_ngram_tokens <= max_ngram_tokens, got "
                f"{self.min_ngram_tokens} and {self.max_ngram_tokens}"
            )
        if self.num_draft_tokens < 1:
            raise ValueError(
                f"{self.name}: num_draft_tokens must be >= 1, got {self.num_draft_tokens}"
            )


PLD_HF = PromptLookupConfig("pld-hf", min_ngram_tokens=1, max_ngram_tokens=2, num_draft_tokens=10)
PLD_VLLM = PromptLookupConfig(
    "pld-vllm", min_ngram_tokens=5, max_ngram_tokens=5, num_draft_tokens=5
)


def prompt_lookup(
    tokens: np.ndarray, config: PromptLookupConfig, max_tokens: int | None = None
) -> list[int]:
    """The PLD draft for the token sequence `tokens` (1-D int array), at most `max_tokens`.

    >>> prompt_lookup(np.array([1, 2, 3, 1, 2]), PLD_HF)
    [3, 1, 2]
    """
    num_tokens = int(tokens.shape[0])
    want = (
        config.num_draft_tokens if max_tokens is None else min(max_tokens, config.num_draft_tokens)
    )
    if want <= 0 or num_tokens < 2:
        return []
    last = tokens[-1]
    for n in range(min(config.max_ngram_tokens, num_tokens - 1), config.min_ngram_tokens - 1, -1):
        # Occurrences must end at index <= num_tokens - 2 so a token follows them; an
        # occurrence starting at s ends at s + n - 1, so s ranges over [0, num_tokens - 1 - n].
        # One pass over the context for the last token (the rescan both engines do every
        # step), then the other n - 1 tokens are checked on the candidates only, vectorized.
        starts = np.flatnonzero(tokens[n - 1 : num_tokens - 1] == last)  # candidate s values
        for j in range(n - 1):
            if starts.size == 0:
                break
            starts = starts[tokens[starts + j] == tokens[num_tokens - n + j]]
        if starts.size == 0:
            continue
        s = int(starts[0])  # the leftmost occurrence
        draft = tokens[s + n : s + n + want].tolist()
        return _cut_at_eos(draft, config.eos_token_ids)
    return []


def _cut_at_eos(draft: list[int], eos_token_ids: tuple[int, ...]) -> list[int]:
    for i, token in enumerate(draft):
        if token in eos_token_ids:
            return draft[:i]
    return draft


class PromptLookupDrafter(CallDrafter):
    """One model call's PLD drafter: keeps prompt + committed tokens, searches them."""

    def __init__(self, config: PromptLookupConfig = PLD_HF) -> None:
        self.config = config
        self._tokens = np.zeros(0, dtype=np.int64)  # [capacity]; valid prefix: _num_tokens
        self._num_tokens = 0

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._tokens = np.asarray(list(prompt_ids), dtype=np.int64)
        self._num_tokens = int(self._tokens.shape[0])

    def propose(self, max_tokens: int) -> list[int]:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        return prompt_lookup(self._tokens[: self._num_tokens], self.config, max_tokens)

    def accept(self, committed_ids: Sequence[int]) -> None:
        new = np.asarray(list(committed_ids), dtype=np.int64)
        need = self._num_tokens + new.shape[0]
        if need > self._tokens.shape[0]:  # amortized doubling
            grown = np.zeros(max(need, 2 * self._tokens.shape[0], 64), dtype=np.int64)
            grown[: self._num_tokens] = self._tokens[: self._num_tokens]
            self._tokens = grown
        self._tokens[self._num_tokens : need] = new
        self._num_tokens = need

    def end(self) -> None:
        self._tokens = np.zeros(0, dtype=np.int64)
        self._num_tokens = 0


class _PLDSession:
    def __init__(self, config: PromptLookupConfig) -> None:
        self._config = config

    def open_artifact(self, path: str, text: str) -> None:
        pass  # PLD sees only the request's own tokens

    def call(self, agent: str, role: str, turn: int) -> PromptLookupDrafter:
        return PromptLookupDrafter(self._config)

    def end(self) -> None:
        pass


class PLDServer:
    """`DrafterServer` shape for the replay lab: every call gets a fresh PLD drafter."""

    def __init__(self, config: PromptLookupConfig = PLD_HF) -> None:
        self.config = config
        self.name = config.name

    def session(self, session_id: str, *, emission_format: str = "none") -> _PLDSession:
        return _PLDSession(self.config)
