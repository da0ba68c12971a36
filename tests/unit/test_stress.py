"""The stress run's pure parts: capping a plan keeps turns with their parents, the noise
floor is measured from a clean concurrent run against the same tokens scored alone, and
the run under test is judged within the tolerance that floor gives."""

from __future__ import annotations

import math

from harness.stress import (
    MIN_TOLERANCE,
    StressPlan,
    StressResult,
    cap_requests,
    compared,
    floor_of,
    judge_run,
    timeline,
    tolerance_for,
)
from harness.stress_driver import Outcome
from harness.stress_workload import PlannedRequest, ProfileSettings, plan_profile


def test_capping_keeps_turns_only_with_their_parents():
    plan = plan_profile("multi-turn", ProfileSettings(conversations=2, turns=3, fillers=0), 1000, 0)
    capped = cap_requests(plan, 3)
    ids = {r.id for r in capped}
    assert len(capped) <= 3
    assert all(r.parent is None or r.parent in ids for r in capped)
    assert cap_requests(plan, None) == plan


def scorer(table):
    """A reference that scores position p as ``table.get(p)`` (else the token itself at 0)."""

    def score(prompt, output):
        toks = prompt + output
        return [None] + [table.get(p, {t: 0.0}) for p, t in enumerate(toks) if p > 0]

    return score


def test_the_floor_is_the_largest_stray_of_a_clean_run():
    o = Outcome("a", "x", [1, 2], output=[5, 6], logprobs=[-0.1, -0.2])
    # scored alone: token 5 at -0.1003 (strays 0.0003), token 6 lost a near-tie by 0.002
    table = {2: {5: -0.1003}, 3: {6: -0.2, 9: -0.198}}
    fl = floor_of([o], scorer(table))
    assert math.isclose(fl.stray, 0.002, abs_tol=1e-9) and fl.tokens == 2
    assert math.isclose(fl.resolution, 0.002, abs_tol=1e-9)
    assert math.isclose(tolerance_for(fl.value), 0.004, abs_tol=1e-5)
    assert math.isclose(tolerance_for(0.0), MIN_TOLERANCE, abs_tol=1e-5)


def test_the_floor_is_never_below_the_logprobs_resolution():
    """A floor run that broke no tie still knows the step logits are rounded to: a run
    under test breaking a one-step tie the other way is noise, not a divergence."""
    o = Outcome("a", "x", [1, 2], output=[5], logprobs=[-0.5])
    table = {2: {5: -0.5, 8: -0.50390625}}  # the runner-up one bf16 step behind
    fl = floor_of([o], scorer(table))
    assert fl.stray == 0.0 and fl.value == 0.00390625


def test_the_run_under_test_is_judged_within_the_tolerance():
    plan = StressPlan(None, "x", ProfileSettings(), [], 2, 0)
    res = StressResult(plan, tolerance=0.004)
    res.outcomes = [
        Outcome("near", "x", [1, 2], output=[6]),
        Outcome("far", "x", [1, 2], output=[7]),
        Outcome("cut", "abort", [1, 2], output=[7], aborted=True),
        Outcome("fill", "filler", [1, 2], output=[7], filler=True),
    ]
    table = {2: {6: -0.2, 9: -0.198, 7: -3.0}}
    judge_run(res, scorer(table))
    assert set(res.verdicts) == {"near", "far"}
    assert res.verdicts["near"].divergence is None and res.verdicts["near"].near_ties == 1
    d = res.verdicts["far"].divergence
    assert d is not None and (d.index, d.got, d.want) == (0, 7, 9)
    assert [o.id for o in compared(res.outcomes)] == ["near", "far"]


def test_timeline_counts_requests_in_flight():
    outs = [
        Outcome("a", "x", [], started_s=0.0, ended_s=1.0),
        Outcome("b", "x", [], started_s=0.5, ended_s=1.0),
    ]
    points = dict(timeline(outs, 0.25))
    assert points[0.0] == 1 and points[0.5] == 2 and points[1.0] == 0


def test_planned_requests_describe_themselves_without_tokens():
    r = PlannedRequest("a", "x", 0.0, [1, 2, 3])
    assert r.record()["prompt"] == "<3 token ids>"
