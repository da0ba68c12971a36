"""Planning a stress run without a launch: scenario tables merge into a profile's
settings, the CPU tier is sized from the plan, decode offloading is switched on in the
connector's config, and plans that cannot run are refused with one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.commands.stress.plan import plan_stress, prompt_bounds, settings_for
from harness.commands.stress.workload import PlannedRequest
from harness.errors import BadInput
from harness.scenario.stress import load_stress

SCENARIO = Path(__file__).resolve().parents[4] / "scenarios" / "stress.toml"


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(f'name = "t"\nroundtrip = "{SCENARIO.parent / "roundtrip-cpu.toml"}"\n' + body)
    return path


def test_the_shipped_scenario_loads_and_mixed_takes_every_profile_table():
    scen = load_stress(SCENARIO)
    s, args = settings_for(scen, "mixed")
    assert s.turn_max_tokens == 300 and s.long_requests == 6 and s.max_tokens == 48
    assert "--num-gpu-blocks-override" in args
    one, _ = settings_for(scen, "shared-prefix")
    assert one.prefix_tokens == (300, 517, 700)


def test_unknown_keys_and_profiles_are_refused_at_load(tmp_path):
    with pytest.raises(BadInput, match=r"profiles\.preemption\.long_reqs"):
        load_stress(write(tmp_path, "[profiles.preemption]\nlong_reqs = 3\n"))
    with pytest.raises(BadInput, match="unknown profile 'storm'"):
        load_stress(write(tmp_path, 'profile = "storm"\n'))
    with pytest.raises(BadInput, match="colour"):
        load_stress(write(tmp_path, 'colour = "red"\n'))


def test_the_plan_sizes_the_tier_and_turns_decode_offloading_on(tmp_path):
    plan = plan_stress(load_stress(SCENARIO))
    assert plan.offloads_decode
    extra = plan.base.server.kv_transfer["kv_connector_extra_config"]
    assert extra["offload_prompt_only"] is False
    assert extra["cpu_bytes_to_use"] >= plan.storable_tokens * 1024
    assert "--enable-prompt-tokens-details" in plan.base.server.argv()
    assert plan.base.server.without_offload().kv_transfer is None
    off = plan_stress(load_stress(write(tmp_path, "offload_decode = false\n")))
    assert not off.offloads_decode


def test_cli_choices_override_the_scenario():
    plan = plan_stress(load_stress(SCENARIO), profile="abort", requests=2, concurrency=2, seed=5)
    assert plan.profile == "abort" and len(plan.requests) == 2
    assert plan.concurrency == 2 and plan.seed == 5
    assert all(r.profile == "abort" for r in plan.requests)


def test_a_conversation_longer_than_the_model_is_refused(tmp_path):
    body = "[profiles.multi-turn]\nturns = 9\n"
    with pytest.raises(BadInput, match="exceed max_model_len 2048"):
        plan_stress(load_stress(write(tmp_path, body)), profile="multi-turn")


def test_prompt_bounds_hold_every_earlier_turn_and_answer():
    a = PlannedRequest("a", "multi-turn", 0, [1] * 10, max_tokens=5)
    b = PlannedRequest("b", "multi-turn", 0, [2] * 3, parent="a", max_tokens=5)
    c = PlannedRequest("c", "multi-turn", 0, [3] * 4, parent="b", max_tokens=5)
    assert prompt_bounds([a, b, c]) == {"a": 10, "b": 18, "c": 27}


def test_duration_rounds_reseed_and_keep_parents_inside_their_round():
    plan = plan_stress(load_stress(SCENARIO), profile="multi-turn", duration_s=60)
    r1 = plan.round(1)
    assert all(r.id.startswith("round1/") for r in r1)
    assert all(r.parent is None or r.parent.startswith("round1/") for r in r1)
    assert [r.prompt for r in r1] != [r.prompt for r in plan.round(0)]


def test_the_reference_has_no_connector_and_a_pool_that_evicts_nothing():
    from harness.commands.stress.plan import REFERENCE_POOL_FACTOR, reference_spec

    plan = plan_stress(load_stress(SCENARIO))
    ref = reference_spec(plan).argv()
    assert "--kv-transfer-config" not in ref
    overrides = [ref[i + 1] for i, a in enumerate(ref) if a == "--num-gpu-blocks-override"]
    want = -(-plan.storable_tokens * REFERENCE_POOL_FACTOR // plan.base.kv_block_size)
    assert overrides and all(int(v) == want for v in overrides)
    ours = plan.base.server.argv()
    assert "48" in [ours[i + 1] for i, a in enumerate(ours) if a == "--num-gpu-blocks-override"]


def test_prefix_reuse_is_judged_only_where_the_harness_can_state_it():
    """Sliding-window layers keep only what a hit at a prompt boundary reaches (vLLM's
    retention rule), so the reuse a later request must get is not stated there."""
    from harness.commands.stress.evaluate import reuse_is_modelled

    models = SCENARIO.parent / "models"
    assert reuse_is_modelled(plan_stress(load_stress(SCENARIO)))
    gemma = plan_stress(load_stress(SCENARIO), config=str(models / "gemma3-interleaved.json"))
    assert not reuse_is_modelled(gemma)


def test_an_engine_argument_given_twice_keeps_the_later_value_once():
    """The round trip's scenario sets --num-gpu-blocks-override 96, the stress scenario's
    engine_args 48 after it: the server's argv has one, 48 (the reference's raised pool
    starts from it), and the other arguments keep their order."""
    plan = plan_stress(load_stress(SCENARIO), profile="mixed")
    for argv in (plan.base.server.argv(), plan.describe()["reference_argv"]):
        assert argv.count("--num-gpu-blocks-override") == 1, argv
    argv = plan.base.server.argv()
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == "48"
    assert argv.index("--enforce-eager") < argv.index("--max-num-batched-tokens")


def test_later_wins_reads_flags_values_and_negations():
    from harness.commands.roundtrip.plan import later_wins

    args = ["--enforce-eager", "--num-gpu-blocks-override", "96", "--x=1", "--middleware", "a"]
    args += ["--num-gpu-blocks-override=48", "--no-enforce-eager", "--x", "2", "--middleware", "b"]
    assert later_wins(args) == [
        "--middleware", "a", "--num-gpu-blocks-override=48", "--no-enforce-eager",
        "--x", "2", "--middleware", "b",
    ]  # fmt: skip
    assert later_wins(["--a", "1", "--b", "--a", "-3"]) == ["--b", "--a", "-3"]


def test_under_pressure_the_tier_holds_its_fraction_and_the_policy_is_set(tmp_path):
    """``--tier``: the tier is that fraction of every byte the plan can store
    (not the round trip's larger default), with the chosen eviction policy; the scenario
    can say the same."""
    import math

    plan = plan_stress(load_stress(SCENARIO), tier_fraction=0.3, eviction_policy="arc")
    extra = plan.base.server.kv_transfer["kv_connector_extra_config"]
    assert extra["cpu_bytes_to_use"] == math.ceil(plan.storable_tokens * 1024 * 0.3)
    assert extra["eviction_policy"] == "arc" and plan.under_pressure
    assert plan.describe()["cpu_tier_fraction"] == 0.3
    scn = load_stress(write(tmp_path, 'cpu_tier_fraction = 0.5\neviction_policy = "lru"\n'))
    assert plan_stress(scn).connector_config["eviction_policy"] == "lru"
    assert not plan_stress(load_stress(SCENARIO)).under_pressure
    with pytest.raises(BadInput, match="cpu_tier_fraction"):
        load_stress(write(tmp_path, "cpu_tier_fraction = 1.5\n"))


def test_under_pressure_reuse_and_store_counts_give_way_to_a_tier_evicted_check():
    from harness.commands.stress.evaluate import check_tier_evicted
    from harness.commands.stress.run import StressResult

    plan = plan_stress(load_stress(SCENARIO), tier_fraction=0.3)
    tier = plan.connector_config["cpu_bytes_to_use"]
    result = StressResult(plan)
    result.counters = {"stored_bytes": float(tier + 1)}
    assert check_tier_evicted(result).passed
    result.counters = {"stored_bytes": float(tier)}
    assert not check_tier_evicted(result).passed
