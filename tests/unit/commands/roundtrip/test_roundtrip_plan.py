"""Round-trip planning: expected figures and the refusal of impossible plans."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.commands import roundtrip as rt
from harness.errors import BadInput
from harness.scenario.roundtrip import load_roundtrip
from harness.server.interpreters import probe
from harness.server.metrics import CacheConfig
from harness.server.workload import make_fillers, make_prompts

ROOT = Path(__file__).resolve().parents[4]


def scenario(name: str = "roundtrip-cpu.toml"):
    return load_roundtrip(ROOT / "scenarios" / name)


def test_default_plan_figures():
    plan = rt.plan_roundtrip(scenario())
    exp = plan.expected
    assert exp.kv_bytes_per_token == 1024
    assert (exp.stored_bytes, exp.loaded_bytes, exp.hit_tokens) == (1_310_720, 524_288, 1280)
    assert plan.tokens_per_chunk == 256 and plan.kv_block_size == 128
    assert "HostOffloadingSpec" in " ".join(plan.server.argv())


def test_scout_plan_matches_the_pr(monkeypatch):
    monkeypatch.setenv("OFFLOAD_CHECK_DEVICE", "cuda")
    probe.cache_clear()
    try:
        plan = rt.plan_roundtrip(scenario("scout-fp8-tp4.toml"))
    finally:
        probe.cache_clear()
    exp = plan.expected
    assert exp.kv_bytes_per_token == 196_608
    assert exp.hit_tokens == 1248
    assert exp.stored_bytes == exp.loaded_bytes == 245_366_784
    argv = plan.server.argv()
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    assert "RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic" in argv
    kv = argv[argv.index("--kv-transfer-config") + 1]
    assert "spec_name" not in kv  # vLLM's own CPUOffloadingSpec on GPUs, untouched
    assert not any(k.startswith("VLLM_CPU_") for k in plan.server.env)
    assert "HF_HUB_OFFLINE" not in plan.server.env  # the hub model must download


def test_engine_args_pass_through_for_multinode():
    plan = rt.plan_roundtrip(scenario(), extra_args=["--distributed-executor-backend", "ray"])
    assert plan.server.argv()[-2:] == ["--distributed-executor-backend", "ray"]


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        ([512], "multiple of the offload chunk"),
        ([200], "shorter than one offload chunk"),
        ([2040], "exceeds max_model_len"),
    ],
)
def test_refuses_bad_targets(targets, message):
    scn = scenario()
    scn.workload.target_tokens = targets
    with pytest.raises(BadInput, match=message):
        rt.plan_roundtrip(scn)


def test_refuses_a_cpu_tier_that_cannot_hold_targets_and_filler():
    scn = scenario()
    scn.offload.cpu_bytes_to_use = 4 * 1024 * 1024  # ~3686 tokens
    plan = rt.plan_roundtrip(scn)
    with pytest.raises(BadInput, match="impossible eviction plan"):
        rt.size_filler(plan, CacheConfig(96, 128, {"kv_cache_size_tokens": "3072"}))


def test_filler_is_pool_times_margin_exactly():
    plan = rt.plan_roundtrip(scenario())
    filler = rt.size_filler(plan, CacheConfig(96, 128, {"kv_cache_size_tokens": "3072"}))
    assert filler.pool_tokens == 3072
    assert filler.tokens == 3840 and list(filler.lengths) == [900] * 4 + [240]
    assert plan.describe(filler)["filler_over_pool"] == 1.25
    assert plan.describe()["filler_count"] is None  # the plan itself never learns it


def test_plans_are_frozen_and_observations_go_to_the_result():
    """What only the server can tell lives in the result; the plan stays as planned."""
    import dataclasses

    from harness.commands.roundtrip.evaluate import derive_expected
    from harness.server.metrics import Snapshot

    plan = rt.plan_roundtrip(scenario())
    before = plan.describe()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.fault = "corrupt-load"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.server.model = "elsewhere"  # type: ignore[misc]
    result = rt.RoundtripResult(plan)
    result.filler = rt.size_filler(plan, CacheConfig(96, 128, {"kv_cache_size_tokens": "3072"}))
    result.engine_mamba_state_bytes = 4096  # not this model's, but derivation must use it
    exp = derive_expected(plan, result)
    assert exp.mamba_state_bytes == 4096 and plan.expected.mamba_state_bytes == 0
    assert plan.describe() == before
    described = result.describe_plan()
    assert described["pool_tokens"] == 3072 and described["filler_count"] == 5
    # Attach mode: bytes per token measured from the cold phase, the plan untouched.
    attached = dataclasses.replace(plan, expected=dataclasses.replace(plan.expected))
    attached.expected.exact_load = False
    cold = Snapshot(stored_bytes=2 * 1_310_720)
    result = rt.RoundtripResult(attached, phases=[rt.PhaseResult("cold", 2, cold, cold, 1.0)])
    assert derive_expected(attached, result).kv_bytes_per_token == 2 * 1024
    assert attached.expected.kv_bytes_per_token == 1024


def test_unknown_variant_and_fault_without_host_backend():
    with pytest.raises(BadInput, match="unknown variant"):
        rt.plan_roundtrip(scenario(), variant="nope")
    scn = scenario()
    scn.offload.backend = "vllm"
    with pytest.raises(BadInput, match="host offload backend"):
        rt.plan_roundtrip(scn, fault="corrupt-load")


def test_prompts_are_deterministic_and_fillers_share_no_token_with_targets():
    t1, _ = make_prompts([700, 1000], 1, 0, 1024, seed=0)
    t2, _ = make_prompts([700, 1000], 1, 0, 1024, seed=0)
    assert [p.token_ids for p in t1] == [p.token_ids for p in t2]
    fillers = make_fillers([900, 240], 1024, seed=0)
    target_ids = {i for p in t1 for i in p.token_ids}
    assert not target_ids & {i for p in fillers for i in p.token_ids}
    assert [len(p.token_ids) for p in fillers] == [900, 240]
    assert all(16 <= i < 1024 for i in target_ids)


def test_each_vllm_build_gets_its_own_cache(monkeypatch, tmp_path):
    """vLLM rewrites its model-class cache whenever another version's source differs, so
    stock and current servers sharing one cache re-inspect the model at every launch."""
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.setenv("OFFLOAD_CHECK_CACHE", str(tmp_path))
    plan = rt.plan_roundtrip(scenario())
    env = plan.env
    assert plan.server.env["VLLM_CACHE_ROOT"] == str(
        tmp_path / "vllm" / f"{env.vllm_dist}-{env.vllm_version}"
    )
    stock = rt.plan_roundtrip(scenario(), variant="stock+fix")
    assert stock.server.env["VLLM_CACHE_ROOT"] != plan.server.env["VLLM_CACHE_ROOT"]
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "mine"))
    assert "VLLM_CACHE_ROOT" not in rt.plan_roundtrip(scenario()).server.env


def test_a_round_trip_under_pressure_holds_exactly_its_targets_and_expects_no_hit():
    """``cpu_bytes_to_use = "targets"``: the tier is the targets' stored bytes (whole
    slots: each chunk of each group one), the filler must evict them all, so the plan
    expects no replay hit and no load, and refuses no eviction plan for it; ``--policy``
    sets the tier's policy."""
    scn = load_roundtrip(ROOT / "scenarios" / "roundtrip-pressure.toml")
    plan = rt.plan_roundtrip(scn, policy="lru")
    extra = plan.server.kv_transfer["kv_connector_extra_config"]
    assert extra["cpu_bytes_to_use"] == plan.expected.stored_bytes > 0
    assert extra["eviction_policy"] == "lru"
    with pytest.raises(BadInput, match="ARC keeps the targets"):
        rt.plan_roundtrip(scn, policy="arc")
    assert plan.evicts_targets and plan.expected.hit_tokens == plan.expected.loaded_bytes == 0
    assert plan.cpu_capacity_tokens is None  # the filler may (must) evict the targets
    with pytest.raises(BadInput, match="one rank"):
        rt.plan_roundtrip(scn, tp=2)
    plain = rt.plan_roundtrip(load_roundtrip(ROOT / "scenarios" / "roundtrip-cpu.toml"))
    assert not plain.evicts_targets and plain.expected.hit_tokens > 0


def test_under_pressure_nothing_loaded_is_the_pass_and_a_load_the_failure():
    from harness.commands.roundtrip import checks as ck

    exp = rt.plan_roundtrip(load_roundtrip(ROOT / "scenarios" / "roundtrip-pressure.toml")).expected
    assert ck.check_loaded(exp, 0, evicted=True).passed
    assert not ck.check_loaded(exp, 65536, evicted=True).passed
    assert not ck.check_loaded(exp, 0).passed  # outside pressure, nothing to load proves nothing


def test_under_pressure_the_replay_must_store_every_target_chunk_again():
    from harness.commands.roundtrip import checks as ck

    exp = rt.plan_roundtrip(load_roundtrip(ROOT / "scenarios" / "roundtrip-pressure.toml")).expected
    assert ck.check_replay_restored(exp, exp.stored_bytes).passed
    short = ck.check_replay_restored(exp, exp.stored_bytes - 524_288)
    assert not short.passed and "off by -524,288 B" in short.detail
