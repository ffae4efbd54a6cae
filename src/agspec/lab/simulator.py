"""Replay recorded sessions against a drafter, token by token, at batch size B.

Greedy decoding is lossless, so the model's output is the recorded output whatever the
drafter proposes; a draft's accept length is the longest common prefix of the draft and
the recorded continuation. Each step commits that prefix plus one bonus token (the token
the model writes itself), or only the prefix when the draft covered the rest of the
output (no EOS is modelled).

Worked example: output `[8, 9, 12, 13]`, a drafter that always proposes `[8, 9, 10]`.
Step 1 at position 0: LCP(`[8, 9, 10]`, `[8, 9, 12, 13]`) = 2, commit `[8, 9, 12]`.
Step 2 at position 3: LCP(`[8, 9, 10]`, `[13]`) = 0, commit `[13]`. Two steps, accept
lengths 2 and 0, four tokens.

Batching (`replay_batched`): B slots; sessions start in order as slots free up (a slot
whose session finished takes the next session in the same step). Every batch step
verifies one step of each active session together and takes
`step_time_ms(n_tokens, num_active)` of the cost model (`StepTimer`).
With `batch_cost="mean"` (default),
`n_tokens = 1 + mean draft length over the active requests`: vLLM v1 flattens the
requests' tokens into one ragged batch without per-request padding, so the verification
work follows the total token count, `num_active * (1 + mean draft)`. `"max"` models a
padded batch (every request padded to the longest draft, as static-shape engines do).
Token trees: a drafter whose calls have `propose_tree(max_nodes)` (a `DraftTree`,
`agspec.drafter.tree`) is verified as a tree: the longest root path the recorded output
follows, plus the bonus token. Its step is priced by its node count (every node is one
token of the verification batch), and the step row records how far the first branch alone
would have got (`first_branch_accepted`), so the share of steps a later branch won is
known. A malformed tree is refused before verification (`check_tree`).
AR is the same schedule with no drafts (`n_tokens = 1`), computed in closed form by
`ar_time_ms`. Speedup = AR time / speculative time: throughput over AR in the same run.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agspec.drafter.protocol import greedy_commit
from agspec.drafter.tree import DraftTree, check_tree, tree_commit
from agspec.lab.records import ReplaySession, StepRecorder

BATCH_COST_RULES = ("mean", "max")


class StepCostModel(Protocol):
    """Cost of one verification step of `n_tokens` per request at `batch_size` requests.

    `step_cost` is relative to one plain decode step; a model that also has
    `step_time_ms(n_tokens, batch_size)` (absolute, as `agspec.policy.costmodel`'s) is timed
    with that instead, so steps at different batch sizes compare.
    """

    def step_cost(self, n_tokens: int, batch_size: int) -> float: ...


class StepTimer:
    """Time of one batch step in ms, with fractional `n_tokens` and a cache.

    Absolute models (`step_time_ms`) give ms directly; relative ones are scaled by
    `decode_step_ms`. A fractional `n` (the mean rule) interpolates linearly between
    its neighbouring integers: the batch's total token count `B * n` is what costs.

    >>> class Linear:
    ...     def step_cost(self, n_tokens, batch_size): return 1.0 + 0.5 * (n_tokens - 1)
    >>> StepTimer(Linear(), decode_step_ms=10.0)(2.5, 1)
    17.5
    """

    def __init__(self, cost_model: StepCostModel, *, decode_step_ms: float = 1.0) -> None:
        absolute = getattr(cost_model, "step_time_ms", None)
        self.absolute = callable(absolute)
        if self.absolute:
            self._fn = absolute
        else:

            def relative(n: int, b: int) -> float:
                return cost_model.step_cost(n, b) * decode_step_ms

            self._fn = relative
        self._cache: dict[tuple[int, int], float] = {}

    def _at(self, n: int, batch_size: int) -> float:
        key = (n, batch_size)
        value = self._cache.get(key)
        if value is None:
            value = self._cache[key] = float(self._fn(n, batch_size))  # type: ignore[misc]
        return value

    def __call__(self, n_tokens: float, batch_size: int) -> float:
        lo = int(n_tokens)
        frac = n_tokens - lo
        t = self._at(lo, batch_size)
        if frac > 1e-12:
            t += frac * (self._at(lo + 1, batch_size) - t)
        return t


@dataclass
class BatchResult:
    """Totals of one replay of a set of sessions at one batch size.

    Times are modelled milliseconds (`StepTimer`): from the cost model's `step_time_ms`
    when it has one, else its relative `step_cost` times `decode_step_ms`.
    """

    batch_size: int
    num_sessions: int
    num_output_tokens: int
    num_steps: int  # request steps (one per verification of one request)
    num_batch_steps: int
    num_drafted_tokens: int  # draft tokens, tree nodes for a tree drafter
    num_accepted_tokens: int
    spec_ms: float
    ar_ms: float
    draft_ns: int  # CPU time in the drafter: propose + accept + begin/end/open_artifact
    absolute_cost_model: bool
    recorder: StepRecorder = field(repr=False)
    # Steps where all B slots were busy (the batch was full), for a drain-free speedup.
    full_batch_tokens: int = 0
    full_batch_ms: float = 0.0
    ar_full_batch_step_ms: float = 0.0  # one AR step with B active requests
    # Of draft_ns, the time outside propose/accept: session, open_artifact, call, begin, end.
    setup_ns: int = 0
    # Wall-clock time of the same drafter calls (draft_ns is CPU time), for comparison.
    draft_wall_ns: int = 0
    # Steady state (`replay_batched(fillers=...)`): tokens and drafting time of the fillers.
    steady: bool = False
    filler_tokens: int = 0
    filler_draft_ns: int = 0
    # Steps whose accepted path left the draft's first branch (a tree beat its own chain),
    # and the accept lengths the first branches alone would have had.
    num_branch_wins: int = 0
    num_first_branch_accepted: int = 0

    @property
    def drafted_per_step(self) -> float:
        """Draft tokens (tree nodes) per request step."""
        return self.num_drafted_tokens / self.num_steps if self.num_steps else 0.0

    @property
    def branch_win_share(self) -> float:
        """Share of request steps won by a branch other than the first."""
        return self.num_branch_wins / self.num_steps if self.num_steps else 0.0

    @property
    def mean_accept_length(self) -> float:
        return self.num_accepted_tokens / self.num_steps if self.num_steps else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.num_output_tokens / self.num_steps if self.num_steps else 0.0

    @property
    def speedup(self) -> float:
        """Modelled throughput over AR in the same run (drafting time not counted)."""
        return self.ar_ms / self.spec_ms if self.spec_ms else 1.0

    @property
    def speedup_with_drafting(self) -> float:
        """Speedup when the measured CPU drafting time is added to the modelled time.

        Drafting of the requests in one batch step is taken as sequential (one CPU thread
        drafts for the whole batch, as vLLM's n-gram proposer does).
        """
        total_ms = self.spec_ms + (self.draft_ns + self.filler_draft_ns) / 1e6
        return self.ar_ms / total_ms if total_ms else 1.0

    @property
    def speedup_full_batch(self) -> float | None:
        """Throughput over AR while the batch was full: (tokens / ms over the full-batch
        steps) / (B / AR step time at B). Leaves out the drain at the end of the run, when
        only the longest sessions are left; None when the batch was never full."""
        if not self.full_batch_ms or not self.ar_full_batch_step_ms:
            return None
        if self.steady:
            return self.speedup  # every step is a full batch
        spec = self.full_batch_tokens / self.full_batch_ms
        return spec / (self.batch_size / self.ar_full_batch_step_ms)

    @property
    def draft_us_per_token(self) -> float:
        return self.draft_ns / 1e3 / self.num_output_tokens if self.num_output_tokens else 0.0

    @property
    def setup_us_per_token(self) -> float:
        """Of `draft_us_per_token`, the part spent outside `propose` and `accept` (building
        per-request state in `begin`, indexing artifacts, `end`)."""
        return self.setup_ns / 1e3 / self.num_output_tokens if self.num_output_tokens else 0.0

    @property
    def full_batch_share(self) -> float:
        """Share of the output tokens committed in steps where all B slots were busy: how
        much of the run `speedup_full_batch` rests on (1.0 at B = 1)."""
        return self.full_batch_tokens / self.num_output_tokens if self.num_output_tokens else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "num_sessions": self.num_sessions,
            "num_output_tokens": self.num_output_tokens,
            "num_steps": self.num_steps,
            "num_batch_steps": self.num_batch_steps,
            "num_drafted_tokens": self.num_drafted_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "mean_accept_length": self.mean_accept_length,
            "drafted_per_step": self.drafted_per_step,
            "num_branch_wins": self.num_branch_wins,
            "branch_win_share": self.branch_win_share,
            "first_branch_accept_length": (
                self.num_first_branch_accepted / self.num_steps if self.num_steps else 0.0
            ),
            "tokens_per_step": self.tokens_per_step,
            "spec_ms": self.spec_ms,
            "ar_ms": self.ar_ms,
            "speedup": self.speedup,
            "speedup_full_batch": self.speedup_full_batch,
            "full_batch_tokens": self.full_batch_tokens,
            "full_batch_share": self.full_batch_share,
            "steady_state": self.steady,
            "filler_tokens": self.filler_tokens,
            "absolute_cost_model": self.absolute_cost_model,
            "draft_ms": self.draft_ns / 1e6,
            "draft_us_per_token": self.draft_us_per_token,
            "draft_setup_us_per_token": self.setup_us_per_token,
            "draft_wall_us_per_token": (
                self.draft_wall_ns / 1e3 / self.num_output_tokens if self.num_output_tokens else 0.0
            ),
            "draft_clock": "thread CPU time",
            "speedup_with_drafting": self.speedup_with_drafting,
            "throughput_tokens_per_s": (
                self.num_output_tokens / (self.spec_ms / 1e3) if self.spec_ms else 0.0
            ),
            "ar_throughput_tokens_per_s": (
                self.num_output_tokens / (self.ar_ms / 1e3) if self.ar_ms else 0.0
            ),
        }


_BIAS: tuple[int, int] | None = None


def window_bias_ns() -> tuple[int, int]:
    """(CPU, wall) ns an empty timing window reads: the cost of the clock calls themselves,
    subtracted from every window (median of 501 empty windows, measured once).

    The CPU clock (`time.thread_time_ns`) is a system call of about 0.3-1.5 µs here, so an
    uncorrected window would charge every drafter about a microsecond per window.
    """
    global _BIAS
    if _BIAS is None:
        cpu, wall = time.thread_time_ns, time.perf_counter_ns
        cpu_d, wall_d = [], []
        for _ in range(501):
            w0 = wall()
            c0 = cpu()
            c1 = cpu()
            w1 = wall()
            cpu_d.append(c1 - c0)
            wall_d.append(w1 - w0)
        _BIAS = (sorted(cpu_d)[250], sorted(wall_d)[250])
    return _BIAS


def _session_steps(
    server: Any,
    session: ReplaySession,
    session_name: str,
    max_draft_tokens: int,
    setup: list[int] | None = None,
) -> Generator[list[Any], None, int]:
    """Replay one session; yield one record row per step (batch fields appended later).

    Returns (as StopIteration value) drafter time spent after the last step (end calls).
    `setup[0]`, when given, accumulates the drafter time spent outside `propose` and
    `accept` (it is also in the rows' and the return value's times); `setup[1]` the
    wall-clock time of every drafter call, for comparison.

    Drafter time is the replay thread's CPU time (`time.thread_time_ns`) inside the
    drafter's calls, less the clocks' own cost (`window_bias_ns`): on a shared machine the
    wall clock also counts the time the process waited for a core, which inflates long
    calls (a suffix tree built over a 10k-token prompt spans several scheduler slices)
    far more than short ones.
    """
    if setup is None:
        setup = [0, 0]
    cpu, wall = time.thread_time_ns, time.perf_counter_ns
    cpu_bias, wall_bias = window_bias_ns()
    w0 = wall()
    c0 = cpu()
    dsession = server.session(session.session_id, emission_format=session.emission_format)
    c1 = cpu()
    w1 = wall()
    overhead_ns = max(0, c1 - c0 - cpu_bias)  # charged to the next step
    setup[0] += overhead_ns
    setup[1] += max(0, w1 - w0 - wall_bias)
    seen_artifacts: set[tuple[str, str]] = set()
    for call_index, call in enumerate(session.calls):
        prompt = call.prompt_ids if isinstance(call.prompt_ids, list) else list(call.prompt_ids)
        out = call.output_ids if isinstance(call.output_ids, list) else list(call.output_ids)
        w0 = wall()
        c0 = cpu()
        for artifact in call.artifacts:
            if artifact not in seen_artifacts:
                seen_artifacts.add(artifact)
                dsession.open_artifact(artifact[0], artifact[1])
        drafter = dsession.call(call.agent, call.role, call.turn)
        drafter.begin(prompt)
        c1 = cpu()
        w1 = wall()
        dt = max(0, c1 - c0 - cpu_bias)
        overhead_ns += dt
        setup[0] += dt
        setup[1] += max(0, w1 - w0 - wall_bias)
        num_out = len(out)
        pos = 0
        step = 0
        propose_tree = getattr(drafter, "propose_tree", None)
        while pos < num_out:
            w0 = wall()
            c0 = cpu()
            if propose_tree is not None:
                tree = propose_tree(max_draft_tokens)
                c1 = cpu()
                w1 = wall()
                if not isinstance(tree, DraftTree):
                    raise TypeError(
                        f"drafter {getattr(server, 'name', server)!r}: propose_tree must "
                        f"return a DraftTree, got {type(tree).__name__}"
                    )
                check_tree(
                    tree.token_ids,
                    tree.parents,
                    what=f"drafter {getattr(server, 'name', server)!r}'s tree",
                )
                num_drafted = len(tree.token_ids)
            else:
                draft = drafter.propose(max_draft_tokens)
                c1 = cpu()
                w1 = wall()
                num_drafted = len(draft)
            if num_drafted > max_draft_tokens:
                raise ValueError(
                    f"drafter {getattr(server, 'name', server)!r} proposed {num_drafted} "
                    f"tokens, more than the {max_draft_tokens} asked for"
                )
            if propose_tree is not None:
                accepted, committed_ids, first = tree_commit(tree, out, pos)
            else:
                accepted, committed_ids = greedy_commit(draft, out, pos)
                first = accepted
            committed = len(committed_ids)
            match_length = getattr(drafter, "last_match_length", None)
            source = getattr(drafter, "last_source", None)
            w2 = wall()
            c2 = cpu()
            drafter.accept(committed_ids)
            c3 = cpu()
            w3 = wall()
            setup[1] += max(0, w1 - w0 - wall_bias) + max(0, w3 - w2 - wall_bias)
            yield [
                session_name,
                call_index,
                call.agent,
                call.role,
                call.turn,
                step,
                pos,
                num_drafted,
                accepted,
                committed,
                match_length,
                source,
                max(0, c1 - c0 - cpu_bias) + max(0, c3 - c2 - cpu_bias) + overhead_ns,
                first,
            ]
            overhead_ns = 0
            pos += committed
            step += 1
        w0 = wall()
        c0 = cpu()
        drafter.end()
        c1 = cpu()
        w1 = wall()
        dt = max(0, c1 - c0 - cpu_bias)
        overhead_ns += dt
        setup[0] += dt
        setup[1] += max(0, w1 - w0 - wall_bias)
    w0 = wall()
    c0 = cpu()
    dsession.end()
    c1 = cpu()
    w1 = wall()
    dt = max(0, c1 - c0 - cpu_bias)
    setup[0] += dt
    setup[1] += max(0, w1 - w0 - wall_bias)
    return overhead_ns + dt


def ar_time_ms(
    session_tokens: Sequence[int], *, batch_size: int, timer: StepTimer
) -> tuple[float, int]:
    """Modelled time (ms) and batch-step count of AR decoding under the same slot schedule.

    Each session occupies a slot for as many steps as it has output tokens; sessions
    start in order in the slot that frees first (lowest index on ties), which is what
    `replay_batched` does with a drafter that proposes nothing.

    >>> class Flat:
    ...     def step_cost(self, n_tokens, batch_size): return 1.0
    >>> ar_time_ms([3, 1, 2], batch_size=2, timer=StepTimer(Flat()))  # slots: 3 | 1 then 2
    (3.0, 3)
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    free: list[tuple[int, int]] = [(0, i) for i in range(batch_size)]
    deltas: dict[int, int] = {}
    for tokens in session_tokens:
        if tokens <= 0:
            continue
        start, slot = heapq.heappop(free)
        end = start + tokens
        deltas[start] = deltas.get(start, 0) + 1
        deltas[end] = deltas.get(end, 0) - 1
        heapq.heappush(free, (end, slot))
    cost = 0.0
    active = 0
    steps = 0
    times = sorted(deltas)
    for t, t_next in zip(times, times[1:], strict=False):
        active += deltas[t]
        if active > 0:
            cost += (t_next - t) * timer(1, active)
            steps += t_next - t
    return cost, steps


def replay_batched(
    sessions: Sequence[tuple[ReplaySession, Any]],
    *,
    batch_size: int,
    cost_model: StepCostModel,
    max_draft_tokens: int = 64,
    batch_cost: str = "mean",
    decode_step_ms: float = 1.0,
    on_progress: Callable[[int], None] | None = None,
    fillers: Iterator[tuple[ReplaySession, Any]] | None = None,
) -> BatchResult:
    """Replay `(session, drafter server)` pairs B at a time; see the module docstring.

    Each session is replayed with its own server (servers differ per fold of the global
    corpus split). Record rows are kept in `BatchResult.recorder`.

    Steady state (`fillers` given): once every session has started, a slot that frees
    takes the next `(session, server)` of `fillers` instead of staying empty, until the
    last measured session ends, so every measured step runs with all B slots busy. A
    filler's steps are priced in the batch (its draft length counts in `n_tokens`, its
    drafting time in the step's) but its tokens, steps and records are not measured.
    Fillers must come with servers of their own (the caller's job) so that they never
    change what a measured session's drafter knows. The speedups then compare the
    throughput of all B requests (measured and fillers) over the run with AR's at a full
    batch; `draft_us_per_token` stays the measured sessions' own.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_draft_tokens < 0:
        raise ValueError(f"max_draft_tokens must be >= 0, got {max_draft_tokens}")
    if batch_cost not in BATCH_COST_RULES:
        raise ValueError(f"batch_cost must be one of {BATCH_COST_RULES}, got {batch_cost!r}")
    recorder = StepRecorder()
    append = recorder.append_row
    pending = iter(enumerate(sessions))
    slots: list[Iterator[list[Any]] | None] = [None] * batch_size
    exhausted = False
    draft_ns = 0
    spec = 0.0
    batch_step = 0
    num_steps = num_drafted = num_accepted = num_tokens = 0
    num_first = num_wins = 0
    use_max = batch_cost == "max"
    timer = StepTimer(cost_model, decode_step_ms=decode_step_ms)
    full_tokens = 0
    full_ms = 0.0
    setup = [0, 0]  # CPU ns outside propose/accept, wall ns of every drafter call
    filler = [False] * batch_size  # slot i runs a filler (steady state)
    filler_setup = [0, 0]
    filler_ns = 0
    filler_tokens = 0
    while True:
        rows: list[list[Any]] = []
        filler_rows: list[list[Any]] = []
        for i in range(batch_size):
            while True:
                gen = slots[i]
                if gen is None:
                    nxt = None if exhausted else next(pending, None)
                    if nxt is not None:
                        session, server = nxt[1]
                        gen = _session_steps(
                            server, session, session.session_id, max_draft_tokens, setup
                        )
                        filler[i] = False
                    else:
                        exhausted = True
                        spare = None if fillers is None else next(fillers, None)
                        if spare is None:
                            break
                        session, server = spare
                        gen = _session_steps(
                            server, session, session.session_id, max_draft_tokens, filler_setup
                        )
                        filler[i] = True
                    slots[i] = gen
                try:
                    (filler_rows if filler[i] else rows).append(next(gen))
                    break
                except StopIteration as stop:
                    if filler[i]:
                        filler_ns += int(stop.value or 0)
                    else:
                        draft_ns += int(stop.value or 0)
                    slots[i] = None
        if not rows:
            break  # no measured session left: fillers still running are dropped
        num_active = len(rows) + len(filler_rows)
        total_drafted = 0
        longest = 0
        step_tokens = 0
        for row in filler_rows:
            total_drafted += row[7]
            longest = max(longest, row[7])
            filler_tokens += row[9]
            filler_ns += row[12]
        for row in rows:
            drafted = row[7]
            total_drafted += drafted
            if drafted > longest:
                longest = drafted
            num_accepted += row[8]
            num_first += row[13]
            if row[8] > row[13]:
                num_wins += 1
            step_tokens += row[9]
            draft_ns += row[12]
            row.append(batch_step)
            row.append(num_active)
            append(row)
        n_tokens = 1 + (longest if use_max else total_drafted / num_active)
        step_ms = timer(n_tokens, num_active)
        spec += step_ms
        if num_active == batch_size:
            full_tokens += step_tokens
            full_ms += step_ms
        num_drafted += total_drafted - sum(row[7] for row in filler_rows)
        num_steps += len(rows)
        num_tokens += step_tokens
        batch_step += 1
        if on_progress is not None:
            on_progress(step_tokens)
    ar, _ = ar_time_ms(
        [s.num_output_tokens for s, _ in sessions], batch_size=batch_size, timer=timer
    )
    if fillers is not None:
        # Steady state: the run's work is every request's tokens; AR would decode them
        # with the batch full, B tokens per step.
        ar = (num_tokens + filler_tokens) * timer(1, batch_size) / batch_size
    return BatchResult(
        batch_size=batch_size,
        num_sessions=len(sessions),
        num_output_tokens=num_tokens,
        num_steps=num_steps,
        num_batch_steps=batch_step,
        num_drafted_tokens=num_drafted,
        num_accepted_tokens=num_accepted,
        spec_ms=spec,
        ar_ms=ar,
        draft_ns=draft_ns,
        absolute_cost_model=timer.absolute,
        recorder=recorder,
        full_batch_tokens=full_tokens,
        full_batch_ms=full_ms,
        ar_full_batch_step_ms=timer(1, batch_size),
        setup_ns=setup[0],
        draft_wall_ns=setup[1],
        steady=fillers is not None,
        filler_tokens=filler_tokens,
        filler_draft_ns=filler_ns,
        num_branch_wins=num_wins,
        num_first_branch_accepted=num_first,
    )
