"""The lab times drafters by the replay thread's CPU time, not the wall clock: waiting
(for a core, or asleep) is not drafting."""

from __future__ import annotations

import time

from agspec.lab.records import ReplayCall, ReplaySession
from agspec.lab.simulator import replay_batched, window_bias_ns


class Flat:
    def step_cost(self, n_tokens: int, batch_size: int) -> float:
        return 1.0


class Drafter:
    def __init__(self, mode: str) -> None:
        self.mode = mode

    def begin(self, prompt_ids):
        pass

    def propose(self, max_tokens):
        if self.mode == "sleep":
            time.sleep(0.02)  # waits: wall time, no CPU time
        else:
            end = time.thread_time_ns() + 20_000_000  # works: 20 ms of CPU
            while time.thread_time_ns() < end:
                pass
        return []

    def accept(self, committed_ids):
        pass

    def end(self):
        pass


class Server:
    name = "timed"

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def session(self, session_id, *, emission_format="none"):
        mode = self.mode

        class S:
            def open_artifact(self, path, text):
                pass

            def call(self, agent, role, turn):
                return Drafter(mode)

            def end(self):
                pass

        return S()


SESSION = ReplaySession("s", (ReplayCall("a", "r", 0, [1], [2, 3]),))  # 2 steps


def test_waiting_is_not_drafting_working_is() -> None:
    asleep = replay_batched([(SESSION, Server("sleep"))], batch_size=1, cost_model=Flat())
    assert asleep.draft_ns < 2_000_000  # 40 ms asleep: (almost) no CPU
    assert asleep.draft_wall_ns >= 40_000_000
    busy = replay_batched([(SESSION, Server("busy"))], batch_size=1, cost_model=Flat())
    assert 40_000_000 <= busy.draft_ns < 60_000_000
    assert busy.summary()["draft_clock"] == "thread CPU time"


def test_clock_cost_is_measured_and_small() -> None:
    cpu, wall = window_bias_ns()
    assert 0 <= cpu < 50_000 and 0 <= wall < 50_000
