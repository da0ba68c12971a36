"""The pressure command's plan and judgement, without a launch: the tier sized from the
geometry, the prompts, the scenario's rules per release, and each check failing on the
figure it is for (its live counterpart: tests/integration/test_pressure_engine.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.commands.pressure.checks import Observed, judge_request, judge_server
from harness.commands.pressure.oracle import predict
from harness.commands.pressure.plan import (
    PlannedRequest,
    ServerPlan,
    prompts_for,
    rules_for,
    tier_geometry,
)
from harness.errors import BadInput
from harness.names import REPO_ROOT
from harness.scenario.kinds import scenario_kind
from harness.scenario.pressure import load_pressure
from harness.scenario.schema import load_model_config, read_toml
from harness.server.metrics import Snapshot
from harness.server.workload import Completion

MODELS = REPO_ROOT / "scenarios" / "models"
SCENARIO = REPO_ROOT / "scenarios" / "pressure.toml"


def test_the_tier_is_sized_as_vllm_sizes_it():
    """llama4-no-chunk: one group of 4 layers x 2 KV heads x 32 dims x K,V x bf16 =
    1024 B/token; a 256-token slot is 262,144 B (already page-aligned), the figure the
    engine's start line printed ("8 host chunks x 262144 B")."""
    tier = tier_geometry(load_model_config(MODELS / "llama4-no-chunk.json"), 256, 8, "x")
    assert (tier.bytes_per_token, tier.slot_bytes, tier.cpu_bytes) == (1024, 262_144, 2_097_152)


def test_a_hybrid_model_is_refused_with_one_line():
    with pytest.raises(BadInput, match=r"all full attention.*chunked-local"):
        tier_geometry(load_model_config(MODELS / "llama4-roundtrip.json"), 256, 8, "x")


def test_a_repeated_request_is_the_same_tokens_and_an_extension_shares_the_head():
    seq = [("A", 4), ("B", 4), ("A", 4), ("A", 6)]
    p = prompts_for(seq, 256, 100, 1024, 0, "lru")
    assert p[0].token_ids == p[2].token_ids and len(p[0].token_ids) == 1124
    assert p[3].token_ids[:1024] == p[0].token_ids[:1024] and len(p[3].token_ids) == 1636
    assert p[1].token_ids[:256] != p[0].token_ids[:256]
    assert prompts_for(seq, 256, 100, 1024, 0, "arc")[0].token_ids != p[0].token_ids


@pytest.mark.parametrize(
    ("version", "policy", "threshold", "deviations", "failing"),
    [
        ("0.27.1", "arc", 0, {"arc-no-t1-fallback", "touch-twice"}, set()),
        (
            "0.28.0",
            "lru",
            2,
            {"threshold-at-lookup", "touch-twice"},
            {"hit-tokens", "loaded-bytes"},
        ),
        ("0.30.0", "arc", 0, {"touch-twice"}, set()),
        ("0.30.0", "lru", 0, {"touch-twice"}, {"hit-tokens"}),
        ("0.32.0", "lru", 2, {"access-at-finish"}, set()),
        ("0.33.0", "lru", 0, set(), set()),
        ("0.33.0", "arc", 0, {"access-at-finish"}, set()),
    ],
)
def test_every_matching_rule_applies(version, policy, threshold, deviations, failing):
    from harness.scenario.pressure import PressureServer

    scn = load_pressure(SCENARIO)
    srv = PressureServer(name="s", policy=policy, store_threshold=threshold, requests="A4")
    rules = rules_for(scn, srv, version, "cpu", set())
    assert rules.deviations == deviations
    assert failing <= rules.failing_checks and (not failing) == (not rules.failing_checks)


def test_a_deviation_the_sequence_never_reaches_leaves_the_cell_a_plain_pass():
    """The threshold servers never hit and store in one request, so 0.32's
    access-at-finish changes nothing there: the sweep expects ``pass``; the LRU server's
    D4 after E1 shows it: ``deviates self-eviction``."""
    scn = load_pressure(SCENARIO)
    by = {s.name: s for s in scn.servers}
    for name, want in (("threshold-2", "pass"), ("lru", "deviates self-eviction")):
        assert rules_for(scn, by[name], "0.32.0", "cpu", set()).expected() == want


def test_the_shipped_scenario_is_a_pressure_file():
    assert scenario_kind(read_toml(SCENARIO)) == "pressure"


def _server(policy="lru", threshold=0, failing=()):
    seq = [("A", 4), ("B", 4), ("A", 4), ("C", 4), ("D", 4), ("A", 4)]
    steps = predict(seq, 8, policy, threshold)
    prompts = prompts_for(seq, 256, 100, 1024, 0, "s")
    reqs = [
        PlannedRequest(i, p, n, st)
        for i, (p, (_, n), st) in enumerate(zip(prompts, seq, steps, strict=True))
    ]
    from harness.commands.pressure.plan import Rules
    from harness.scenario.pressure import PressureRule, PressureServer

    srv = PressureServer(name="s", policy=policy, store_threshold=threshold, requests="A4")
    matched = (PressureRule(failing_checks=list(failing), issue=51787),) if failing else ()
    rules = Rules(load_pressure(SCENARIO), srv, matched)
    return ServerPlan("s", policy, threshold, None, rules, reqs, None)  # type: ignore[arg-type]


TIER = tier_geometry(load_model_config(MODELS / "llama4-no-chunk.json"), 256, 8, "x")


def _observe(req, hit=None, stored=None, loaded=None, gpu=0, failures=0, cached="same"):
    hit = req.expected.hit if hit is None else hit
    delta = Snapshot(
        ext_hits=hit * 256,
        gpu_hits=gpu,
        stored_bytes=(len(req.expected.stored) if stored is None else stored) * 262_144,
        loaded_bytes=(hit if loaded is None else loaded) * 262_144,
        store_failures=failures,
    )
    comp = Completion("s", req.prompt.name, len(req.prompt.token_ids), {})
    comp.cached_tokens = hit * 256 if cached == "same" else cached
    return Observed(comp, delta)


def test_a_request_as_the_oracle_says_fails_nothing():
    s = _server()
    assert [judge_request(s, TIER, r, _observe(r)).failing for r in s.requests] == [[]] * 6


@pytest.mark.parametrize(
    ("change", "failing"),
    [
        ({"hit": 3, "loaded": 3}, ["hit-tokens", "loaded-bytes"]),  # a wrong victim
        ({"loaded": 5}, ["loaded-bytes"]),  # an evicted chunk's bytes loaded too
        ({"stored": 0}, ["stored-bytes"]),
        ({"gpu": 256}, ["gpu-tier-silent"]),
        ({"failures": 1}, ["no-store-failure"]),
        ({"cached": 0}, ["hit-tokens"]),  # the usage disagrees with the counter
    ],
)
def test_each_per_request_check_fails_on_its_own_figure(change, failing):
    s = _server()
    req = s.requests[2]  # A4 again: hit 4, store nothing
    if "stored" in change:
        req = s.requests[3]  # C4: stores 4
    assert judge_request(s, TIER, req, _observe(req, **change)).failing == failing


def test_a_check_a_rule_expects_to_fail_is_matched_and_names_the_issue():
    s = _server(failing=("hit-tokens", "loaded-bytes"))
    rows = [judge_request(s, TIER, r, _observe(r)).row for r in s.requests]
    rows[2] = judge_request(s, TIER, s.requests[2], _observe(s.requests[2], hit=2)).row
    whole = Snapshot(
        stored_bytes=sum(r.stored_bytes for r in rows),
        loaded_bytes=sum(r.loaded_bytes for r in rows),
        ext_hits=sum(r.ext_hits for r in rows),
    )
    comps = [_observe(r).completion for r in s.requests]
    checks = {c.check: c for c in judge_server(s, TIER, rows, comps, whole, (8, 262_144), 0.008)}
    assert not checks["hit-tokens"].passed and checks["hit-tokens"].matched
    assert checks["hit-tokens"].known == "51787"
    assert "request 2 (A4): hit 512 tokens" in checks["hit-tokens"].detail
    assert checks["ledger"].passed and checks["evictions"].passed


def test_the_run_checks_catch_a_wrong_tier_and_a_ledger_gap():
    s = _server()
    rows = [judge_request(s, TIER, r, _observe(r)).row for r in s.requests]
    comps = [_observe(r).completion for r in s.requests]
    whole = Snapshot(stored_bytes=1.0, loaded_bytes=0.0, ext_hits=0.0)
    checks = {c.check: c for c in judge_server(s, TIER, rows, comps, whole, (2, 1_048_576), 0.008)}
    assert not checks["capacity"].matched and not checks["ledger"].matched
    assert "stored bytes: requests" in checks["ledger"].detail


def test_no_eviction_fails_the_evictions_check():
    s = _server()
    rows = [judge_request(s, TIER, r, _observe(r, stored=0)).row for r in s.requests]
    comps = [_observe(r).completion for r in s.requests]
    checks = {c.check: c for c in judge_server(s, TIER, rows, comps, Snapshot(), None, 0.008)}
    assert not checks["evictions"].passed


def test_an_answer_that_changes_after_a_hit_fails_output_after_hit():
    s = _server()
    comps = []
    for r in s.requests:
        c = _observe(r).completion
        c.token_ids = [5, 6, 7] if r.index != 2 else [5, 9, 7]
        comps.append(c)
    rows = [judge_request(s, TIER, r, _observe(r)).row for r in s.requests]
    checks = {c.check: c for c in judge_server(s, TIER, rows, comps, Snapshot(), None, 0.008)}
    out = checks["output-after-hit"]
    assert not out.passed and "request 2 (A4) vs request 0" in out.detail


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--mutant", "nope"], "unknown mutant 'nope'"),
        (["--server", "nope"], "unknown server 'nope'"),
        (["--fault", "drop-store"], "fault 'drop-store' has no pressure round"),
        (["--fault", "corrupt-load", "--patch", "hits-minus-chunk"], "--patch applies to"),
        (["--fault", "corrupt-load", "--fault", "corrupt-load"], "corrupt-load is given twice"),
        (["--server", "arc", "--mutant", "lru-evicts-newest"], "mutates lru, and no chosen"),
        (["--patch", "nope"], "unknown patch 'nope'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, says):
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "pressure", "--dry-run", *args],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and proc.stderr.strip().count("\n") == 0


def test_a_bad_request_word_is_refused_at_load(tmp_path):
    text = SCENARIO.read_text().replace('requests = "A4 B4 A4', 'requests = "A4 B 4 A4', 1)
    bad = tmp_path / "p.toml"
    bad.write_text(text.replace('geometry = "models/', f'geometry = "{MODELS}/'))
    with pytest.raises(BadInput, match="request 'B' is not NAME then a chunk count"):
        load_pressure(bad)


def _step(hit, stored=0, failed=False, skipped=0, evicted=0):
    from harness.commands.pressure.oracle import Step

    return Step("A", hit, ("x",) * stored, ("y",) * evicted, ("z",) * skipped, failed)


def test_a_mutant_must_fail_what_its_replay_parts_on_and_stops_there():
    """vLLM's manager running the mutant (the replay) against the oracle: the round must
    fail the checks of every figure that parts, and ends at the request by which all of
    them have (the rest of the sequence would cost time and show nothing new)."""
    from harness.commands.pressure.plan import mutant_must_fail

    want = [_step(0, 4), _step(4), _step(0, 4, evicted=4), _step(4)]
    got = [
        {"hit": 0, "stored": [1] * 4, "failed": False, "skipped": 0},
        {"hit": 4, "stored": [], "failed": False, "skipped": 0},
        {"hit": 0, "stored": [], "failed": True, "skipped": 0},  # the store fails
        {"hit": 0, "stored": [1] * 4, "failed": False, "skipped": 0},  # then a miss
    ]
    must, needed = mutant_must_fail(want, got, slots=8)
    # 8 chunks stored into 8 slots: the round no longer proves an eviction either.
    assert must == {"stored-bytes", "no-store-failure", "hit-tokens", "loaded-bytes", "evictions"}
    assert needed == 4
    assert "evictions" not in mutant_must_fail(want, got, slots=7)[0]
    assert mutant_must_fail(want, [*got[:3], got[1]], slots=8)[1] == 3
    assert mutant_must_fail(want, [*got[:2], got[1], got[1]], slots=8) == (
        frozenset({"hit-tokens", "loaded-bytes", "stored-bytes", "evictions"}),
        3,
    )
    same = [
        {"hit": w.hit, "stored": list(w.stored), "failed": w.failed, "skipped": 0} for w in want
    ]
    assert mutant_must_fail(want, same, slots=8) == (frozenset(), 0)


def test_a_fault_round_needs_a_request_that_can_show_it():
    from harness.commands.pressure.plan import fault_must_fail

    s = _server()  # A4 B4 A4 C4 D4 A4: request 2 repeats request 0 and hits
    assert fault_must_fail("corrupt-load", s.requests) == ({"output-after-hit"}, 3)
    assert fault_must_fail("overcount-load", s.requests) == ({"loaded-bytes"}, 3)
    assert fault_must_fail("corrupt-load", s.requests[:2]) == (frozenset(), 0)
