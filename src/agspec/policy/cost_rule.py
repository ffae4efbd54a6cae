"""Variant "cost" of `DraftLengthPolicy` as its own rule: `CostLengthRule`.

The draft length that maximizes expected committed tokens per unit of measured step cost
(`agspec.policy.cost_length`), read off acceptance curves learned online
(`agspec.policy.survival.MatchSurvival`). At batch size > 1 a draft is priced at the
batch's running means of drafted and committed tokens per step (`note_step`).

The rule keeps one table per (agent, match bucket) — the best length for every retrieved
length — and reuses it until something it reads changes: the survival's version, the
step costs (by identity), the batch size or the batch means.

Example: at step costs [1.0, 1.1, 1.2, 1.3, 3.0] and a curve S(k) = (16/17)^k, drafting
3 tokens pays and the 4th does not:

>>> rule = CostLengthRule([1.0, 1.1, 1.2, 1.3, 3.0],
...                       MatchSurvival(max_tokens=4, prior_weight=1.0))
>>> rule.cost_table("coder", 16)
[0, 1, 2, 3, 3]
>>> rule.cost_length("coder", 16, 2)   # only 2 tokens retrieved
2
"""

from __future__ import annotations

from collections.abc import Sequence

from agspec.policy._state import check_int
from agspec.policy.cost_length import (
    MatchSurvival,
    batch_prices,
    best_lengths,
    best_lengths_at_prices,
)
from agspec.policy.survival import MATCH_BUCKETS

__all__ = ["BATCH_EMA", "CostLengthRule"]


BATCH_EMA = 0.01  # weight of one step in the running batch means


class CostLengthRule:
    """The cost-aware draft length: tables of best lengths per (agent, match bucket).

    `step_costs` are relative to verifying one token (see
    `DraftLengthPolicy.normalized_costs`); `step_costs`, `batch_size`, `mean_draft` and
    `mean_committed` may be reassigned (a live batch size, a new cost profile, means set
    by hand): the tables follow. A rule with fewer than two step costs is the idle rule
    of the other variants, which only keeps the survival.
    """

    def __init__(
        self,
        step_costs: Sequence[float],
        survival: MatchSurvival | None = None,
        *,
        batch_size: int = 1,
    ) -> None:
        self.step_costs: list[float] = list(step_costs)
        if survival is None:
            survival = (
                MatchSurvival(max_tokens=len(self.step_costs) - 1)
                if len(self.step_costs) >= 2
                else MatchSurvival()
            )
        self.survival = survival
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        # Running batch state for `best_length_in_batch` (start: no drafts, 1 token).
        self.mean_draft, self.mean_committed = 0.0, 1.0
        # (agent, match bucket) -> `cost_table`, valid while `_tables_at` holds: the
        # (survival version, step costs, batch size, batch means) they were computed at.
        self._tables: dict[tuple[str, int], list[int]] = {}
        self._tables_at: tuple[int, list[float], int, float, float] | None = None
        # id(step costs) -> (mean draft, mean committed, batch size, those step costs,
        # their `batch_prices`); the costs are held, so an id is never reused meanwhile.
        self._prices_at: dict[int, tuple[float, float, int, list[float], list[float]]] = {}

    @property
    def bound_tokens(self) -> int:
        """The longest draft the rule considers."""
        return min(self.survival.max_tokens, len(self.step_costs) - 1)

    @property
    def tables(self) -> dict[tuple[str, int], list[int]]:
        """A copy of the tables kept now, by (agent, match bucket) (read-only view for
        tests and diagnostics; some may be stale until the next `cost_table`)."""
        return dict(self._tables)

    def forget_tables(self) -> None:
        """Drops the kept tables (the next ask computes them afresh; no answer changes)."""
        self._tables, self._tables_at = {}, None

    def cost_length(self, agent: str, match_tokens: int, retrieved_tokens: int) -> int:
        """How many of the `retrieved_tokens` to draft (0: none), read off `cost_table`.

        Batch size 1: `best_length`. Larger batches: `best_length_in_batch`, priced at the
        batch's running mean draft and committed tokens per step (`note_step`).
        """
        table = self.cost_table(agent, match_tokens, retrieved_tokens)
        if retrieved_tokens < len(table):
            return table[retrieved_tokens]
        return table[-1]

    def cost_table(
        self, agent: str, match_tokens: int, upto_tokens: int | None = None
    ) -> list[int]:
        """[`cost_length(agent, match_tokens, r)` for r in 0 .. R], R = `bound_tokens`,
        or at least min(`upto_tokens`, R) when given (a retrieval longer than R drafts as
        entry R does).

        The best length over [0, r] is the running argmax of one scan over the curve
        (`best_lengths`), so one table answers every retrieved length of an (agent, match
        bucket): the planned length (r = the bound, or fewer tokens available) and the
        length once the index retrieved fewer. Requests of one batch step share agents and
        buckets, and nothing the rule reads changes between two verifications: each table
        is kept until a curve may have changed (the survival's version moves at every
        `observe`), the batch means move (`note_step`, or set by hand) or the step costs
        or batch size are swapped.
        """
        tables = self._tables
        survival = self.survival
        if not self._tables_valid():
            tables.clear()
            self._tables_at = (
                survival.version,
                self.step_costs,
                self.batch_size,
                self.mean_draft,
                self.mean_committed,
            )
        bucket = match_tokens.bit_length()
        top = MATCH_BUCKETS - 1
        key = (agent, bucket if bucket < top else top)
        table = tables.get(key)
        bound = self.bound_tokens
        if upto_tokens is not None and upto_tokens < bound:
            bound = upto_tokens
        if table is None or len(table) <= bound:
            # Only as far as asked: a draft of at most 16 tokens reads 16 of 32 entries.
            curve = survival.curve(agent, match_tokens, bound)
            if self.batch_size == 1:
                table = best_lengths(curve, self.step_costs, bound)
            else:
                # `best_length_in_batch`, its prices computed once per batch state.
                table = best_lengths_at_prices(curve, self.batch_prices(bound), bound)
            tables[key] = table
        return table

    def _tables_valid(self) -> bool:
        """Whether the tables were computed at the rule's current inputs."""
        at = self._tables_at
        return (
            at is not None
            and at[0] == self.survival.version
            and at[1] is self.step_costs
            and at[2] == self.batch_size
            and at[3] == self.mean_draft
            and at[4] == self.mean_committed
        )

    def refresh_tables(self) -> None:
        """The tables of the last state (the (agent, match bucket) keys a batch step used,
        each as far as it went) computed again at the current one, when it moved.
        `step_batch` calls it while the native advance runs on helper threads, so that the
        next plan mostly finds its tables ready; it changes no answer.

        >>> rule = CostLengthRule([1.0, 1.1, 1.2, 1.3, 3.0],
        ...                       MatchSurvival(max_tokens=4, prior_weight=1.0))
        >>> rule.cost_table("coder", 16)
        [0, 1, 2, 3, 3]
        >>> for _ in range(10):     # ten drafts rejected at their first token
        ...     rule.survival.observe("coder", 16, drafted_tokens=3, accepted_tokens=0)
        >>> rule.refresh_tables(); rule.tables
        {('coder', 5): [0, 0, 0, 0, 0]}
        """
        if not self._tables or self._tables_valid():
            return
        for (agent, bucket), table in list(self._tables.items()):
            # Any match length of the bucket stands for it (bucket b: b-bit lengths).
            self.cost_table(agent, 1 << (bucket - 1) if bucket else 0, len(table) - 1)

    def cost_tables(
        self, agents: Sequence[str], match_tokens: Sequence[int], available_tokens: Sequence[int]
    ) -> list[list[int]]:
        """`cost_table` of each request of one batch step (matches >= 1), at least as far
        as the largest of `available_tokens`, each (agent, match bucket)'s table computed
        once: a request's draft length is table[min(retrieved, R)], before the
        continuation is copied and after.
        """
        if not agents:
            return []
        upto = max(available_tokens)
        self.cost_table(agents[0], match_tokens[0], upto)  # the tables of this state
        tables = self._tables
        top = MATCH_BUCKETS - 1
        # `cost_table` of each, without its state check per request: a table found long
        # enough is the one it would return.
        need = min(upto, self.bound_tokens)
        out = []
        for agent, m in zip(agents, match_tokens):
            bucket = m.bit_length()
            table = tables.get((agent, bucket if bucket < top else top))
            if table is None or len(table) <= need:
                table = self.cost_table(agent, m, upto)
            out.append(table)
        return out

    def batch_prices(self, max_tokens: int, step_costs: list[float] | None = None) -> list[float]:
        """`cost_length.batch_prices` at the current batch state, up to at least
        `max_tokens` or all the step costs have: of the rule's own step costs, or of
        `step_costs` (a token tree's, which go further than a chain's). The one place a
        step's prices are computed; each list of costs' prices are remembered (by
        identity) until the batch state changes.

        >>> rule = CostLengthRule([1.0, 1.5, 2.0], MatchSurvival(max_tokens=2), batch_size=2)
        >>> [round(p, 3) for p in rule.batch_prices(2)]   # ρ = 2, Δ(L) = L / 4
        [0.0, 0.5, 1.0]
        >>> rule.batch_prices(2) is rule.batch_prices(1)   # remembered
        True
        """
        costs = self.step_costs if step_costs is None else step_costs
        at = self._prices_at.get(id(costs))
        if (
            at is not None
            and at[3] is costs
            and len(at[4]) > min(max_tokens, len(costs) - 1)
            and at[0] == self.mean_draft
            and at[1] == self.mean_committed
            and at[2] == self.batch_size
        ):
            return at[4]
        prices = batch_prices(
            costs,
            batch_size=self.batch_size,
            mean_draft=self.mean_draft,
            mean_committed=self.mean_committed,
            max_tokens=max_tokens,
        )
        if len(self._prices_at) >= 4 and id(costs) not in self._prices_at:
            self._prices_at.clear()  # costs swapped (a new profile, other batch sizes)
        self._prices_at[id(costs)] = (
            self.mean_draft,
            self.mean_committed,
            self.batch_size,
            costs,
            prices,
        )
        return prices

    def note_step(self, drafted_tokens: int, committed_tokens: int) -> None:
        """One verification step of one request, drafted or not: the running means of
        the draft length and committed tokens (an exponential average over the last
        ~1/`BATCH_EMA` steps)."""
        w = BATCH_EMA
        self.mean_draft += w * (drafted_tokens - self.mean_draft)
        self.mean_committed += w * (committed_tokens - self.mean_committed)

    def note_steps(self, drafted_tokens: Sequence[int], committed_tokens: Sequence[int]) -> None:
        """`note_step` for many requests' verification steps, in order: the same running
        means (each step's float operations as `note_step`'s)."""
        if not drafted_tokens:
            return
        w = BATCH_EMA
        mean_draft, mean_committed = self.mean_draft, self.mean_committed
        for d, c in zip(drafted_tokens, committed_tokens):
            mean_draft += w * (d - mean_draft)
            mean_committed += w * (c - mean_committed)
        self.mean_draft, self.mean_committed = mean_draft, mean_committed
