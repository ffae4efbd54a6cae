"""How much of a run a B > 1 figure covers: the share of output tokens committed in steps
with every slot busy, against batch schedules computed by hand, and the report's flag."""

from __future__ import annotations

import pytest

from agspec.lab.records import ReplayCall, ReplaySession
from agspec.lab.registry import ARServer
from agspec.lab.report import FLAG, FLAG_NOTE, format_markdown, format_table
from agspec.lab.simulator import replay_batched


class Flat:
    def step_cost(self, n_tokens: int, batch_size: int) -> float:
        return 1.0


class _NextTwo:
    """Proposes the next two recorded tokens: every step commits 3 (or the rest)."""

    def __init__(self, out: list[int]) -> None:
        self.out, self.pos = out, 0

    def begin(self, prompt_ids):
        pass

    def propose(self, max_tokens):
        return self.out[self.pos : self.pos + 2]

    def accept(self, committed_ids):
        self.pos += len(committed_ids)

    def end(self):
        pass


class NextTwoServer:
    name = "next-two"

    def __init__(self, outputs: dict[str, list[int]]) -> None:
        self.outputs = outputs

    def session(self, session_id, *, emission_format="none"):
        server = self

        class S:
            def open_artifact(self, path, text):
                pass

            def call(self, agent, role, turn):
                return _NextTwo(server.outputs[session_id])

            def end(self):
                pass

        return S()


def sessions_of(lengths: list[int]) -> list[ReplaySession]:
    return [
        ReplaySession(f"s{i}", (ReplayCall("a", "r", 0, [1], list(range(10, 10 + n))),))
        for i, n in enumerate(lengths)
    ]


def test_coverage_of_an_ar_schedule() -> None:
    # B = 2, outputs of 4, 1, 1 tokens, one token per step:
    # step 0: s0 s1 | step 1: s0 s2 | steps 2, 3: s0 alone. Full steps 0 and 1: 4 of 6 tokens.
    sessions = sessions_of([4, 1, 1])
    r = replay_batched([(s, ARServer()) for s in sessions], batch_size=2, cost_model=Flat())
    assert (r.num_batch_steps, r.full_batch_tokens, r.num_output_tokens) == (4, 4, 6)
    assert r.full_batch_share == pytest.approx(4 / 6)
    assert r.summary()["full_batch_share"] == pytest.approx(4 / 6)


def test_coverage_of_a_drafting_schedule() -> None:
    # B = 2, outputs of 7, 3, 3 tokens; each step commits 3 (2 accepted + bonus) or the rest.
    # step 0: s0 +3, s1 +3 (s1 done) | step 1: s0 +3, s2 +3 (s2 done) | step 2: s0 +1 alone.
    # Full steps 0 and 1 hold 12 of the 13 tokens.
    sessions = sessions_of([7, 3, 3])
    server = NextTwoServer({s.session_id: list(s.calls[0].output_ids) for s in sessions})
    r = replay_batched([(s, server) for s in sessions], batch_size=2, cost_model=Flat())
    assert r.num_batch_steps == 3
    assert r.full_batch_tokens == 12
    assert r.full_batch_share == pytest.approx(12 / 13)
    # At B = 1 every step is a full batch.
    r1 = replay_batched([(s, server) for s in sessions], batch_size=1, cost_model=Flat())
    assert r1.full_batch_share == 1.0


def test_report_flags_figures_resting_on_less_than_half_the_run() -> None:
    sessions = sessions_of([10, 1, 1])  # B = 2: full steps 0 and 1 hold 4 of 12 tokens
    r = replay_batched([(s, ARServer()) for s in sessions], batch_size=2, cost_model=Flat())
    assert r.full_batch_share == pytest.approx(4 / 12)
    entry = {"source": "x", "drafter": "ar", **r.summary()}
    low = format_markdown([entry])
    assert "B=2 coverage" in low and "| 33% |" in low
    assert f"1.00x{FLAG}" in low and FLAG_NOTE in low
    assert FLAG_NOTE in format_table([entry])
    # Coverage of 4 / 6 is not flagged.
    sessions = sessions_of([4, 1, 1])
    r = replay_batched([(s, ARServer()) for s in sessions], batch_size=2, cost_model=Flat())
    ok = format_markdown([{"source": "x", "drafter": "ar", **r.summary()}])
    assert "| 67% |" in ok and FLAG not in ok
    # An old run folder without the share: recomputed from the full-batch token count.
    old = {k: v for k, v in entry.items() if k != "full_batch_share"}
    assert "| 33% |" in format_markdown([old])


class LoggingNextTwo(NextTwoServer):
    def __init__(self, outputs: dict[str, list[int]]) -> None:
        super().__init__(outputs)
        self.opened: list[str] = []

    def session(self, session_id, *, emission_format="none"):
        self.opened.append(session_id)
        return super().session(session_id, emission_format=emission_format)


def test_steady_state_keeps_the_batch_full_with_fillers_on_their_own_servers() -> None:
    # B = 2, outputs of 7, 3, 3 tokens, 3 tokens a step, every step costs 1:
    # step 0: s0 +3, s1 +3 | step 1: s0 +3, s2 +3 | step 2: s0 +1, filler (s0 again) +3.
    # The last measured session ends at step 2: 3 steps, all full; 13 measured tokens and
    # 3 filler tokens. AR at a full batch decodes 2 tokens a step: 16 / 2 = 8 steps.
    sessions = sessions_of([7, 3, 3])
    outputs = {s.session_id: list(s.calls[0].output_ids) for s in sessions}
    measured, spare = LoggingNextTwo(outputs), LoggingNextTwo(outputs)
    fillers = iter([(s, spare) for s in sessions] * 3)
    r = replay_batched(
        [(s, measured) for s in sessions], batch_size=2, cost_model=Flat(), fillers=fillers
    )
    assert measured.opened == ["s0", "s1", "s2"] and spare.opened[0] == "s0"
    assert (r.num_batch_steps, r.num_output_tokens, r.filler_tokens) == (3, 13, 3)
    assert r.num_steps == 5 and len(r.recorder) == 5  # filler steps are not recorded
    assert r.full_batch_share == 1.0
    assert r.spec_ms == 3.0 and r.ar_ms == 8.0
    assert r.speedup == pytest.approx(8 / 3) == r.speedup_full_batch
    # The same run with the drain: AR needs 7 steps (s0 alone decides), speculation 3.
    drain = replay_batched([(s, measured) for s in sessions], batch_size=2, cost_model=Flat())
    assert drain.speedup == pytest.approx(7 / 3)
    assert drain.full_batch_share == pytest.approx(12 / 13)
