"""The stress driver's scheduling, with a recording ``send`` in place of a server:
concurrency is bounded, turns wait for their parents and carry their answers, a failed
parent's turns are not sent, the result is in plan order."""

from __future__ import annotations

import threading
import time

import pytest

from harness.commands.stress.driver import Reply, drive
from harness.commands.stress.workload import PlannedRequest, plan_profile
from harness.scenario.stress_profiles import ProfileSettings


class Recorder:
    def __init__(self, delay: float = 0.01, fail: set[str] | None = None) -> None:
        self.delay, self.fail = delay, fail or set()
        self.live = 0
        self.peak = 0
        self.order: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, req: PlannedRequest, prompt: list[int]) -> Reply:
        with self.lock:
            self.live += 1
            self.peak = max(self.peak, self.live)
            self.order.append(req.id)
        time.sleep(self.delay)
        with self.lock:
            self.live -= 1
        if req.id in self.fail:
            raise RuntimeError("HTTP 500: engine dead")
        return Reply([len(prompt) % 97, 7], "ab", [-0.1, -0.2])


def test_concurrency_is_bounded_and_results_keep_plan_order():
    plan = [PlannedRequest(f"r{i}", "x", 0.0, [1] * (i + 1)) for i in range(12)]
    rec = Recorder()
    out = drive(plan, rec, 3)
    assert rec.peak == 3 and [o.id for o in out] == [r.id for r in plan]
    assert all(o.output and not o.error for o in out)


def test_a_turn_is_its_parents_prompt_answer_and_new_text():
    plan = plan_profile(
        "multi-turn", ProfileSettings(conversations=2, turns=3, fillers=0, spread_s=0.0), 1000, 0
    )
    rec = Recorder()
    out = {o.id: o for o in drive(plan, rec, 4)}
    for c in range(2):
        t0, t1, t2 = (out[f"multi-turn/c{c}/t{t}"] for t in range(3))
        assert t1.prompt[: len(t0.prompt)] == t0.prompt
        assert t1.prompt[len(t0.prompt) : len(t0.prompt) + 2] == t0.output
        assert t2.prompt[: len(t1.prompt) + 2] == t1.prompt + t1.output
        assert (t0.turn, t2.turn) == (0, 2)
        assert rec.order.index(t1.id) > rec.order.index(t0.id)


def test_a_failed_parent_stops_its_chat_not_the_run():
    plan = plan_profile(
        "multi-turn", ProfileSettings(conversations=2, turns=3, fillers=0, spread_s=0.0), 1000, 0
    )
    out = {o.id: o for o in drive(plan, Recorder(fail={"multi-turn/c0/t0"}), 2)}
    assert out["multi-turn/c0/t0"].error.startswith("RuntimeError: HTTP 500")
    assert out["multi-turn/c0/t1"].error == "not sent: its parent multi-turn/c0/t0 did not finish"
    assert out["multi-turn/c0/t2"].error.startswith("not sent")
    assert not out["multi-turn/c1/t2"].error


def test_arrivals_are_waited_for():
    plan = [PlannedRequest("late", "x", 0.2, [1]), PlannedRequest("early", "x", 0.0, [2])]
    rec = Recorder(delay=0.0)
    out = drive(plan, rec, 2)
    assert rec.order == ["early", "late"] and out[0].started_s >= 0.19


def test_bad_plans_are_refused():
    with pytest.raises(ValueError, match="unique"):
        drive([PlannedRequest("a", "x", 0, [1]), PlannedRequest("a", "x", 0, [1])], Recorder(), 1)
    with pytest.raises(ValueError, match="parent b is not in the plan"):
        drive([PlannedRequest("a", "x", 0, [1], parent="b")], Recorder(), 1)
    with pytest.raises(ValueError, match="at least 1"):
        drive([], Recorder(), 0)


def test_served_top_choices_are_read_by_token_id():
    """``return_tokens_as_token_ids`` renders each top choice ``token_id:N``; a position's
    choices come back keyed by id (a key of another shape is left out, not guessed)."""
    from harness.commands.stress.driver import _top_logprobs

    choice = {
        "logprobs": {
            "token_logprobs": [-0.5, -0.25],
            "top_logprobs": [
                {"token_id:5": -0.5, "token_id:8": -0.50390625},
                {"token_id:7": -0.25, " t9": -0.3},
                None,
            ],
        }
    }
    assert _top_logprobs(choice) == [{5: -0.5, 8: -0.50390625}, {7: -0.25}, {}]
    assert _top_logprobs({}) == []


def test_the_served_top_choices_reach_the_outcome():
    plan = [PlannedRequest("a", "x", 0.0, [1, 2])]

    def send(req: PlannedRequest, prompt: list[int]) -> Reply:
        return Reply([5], "t5", [-0.5], 0, [{5: -0.5, 8: -0.51}])

    (o,) = drive(plan, send, 1)
    assert o.top == [{5: -0.5, 8: -0.51}]
    assert o.record()["top_logprobs"] == [{"5": -0.5, "8": -0.51}]
