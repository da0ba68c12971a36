"""Portability across CPUs: the AMX fix, pools as token intents, cross-process tolerance.

Nothing here assumes the CPU it runs on: AMX and non-AMX hosts are both simulated
from recorded ``/proc/cpuinfo`` text (tests/fixtures/amx-host/cpuinfo.txt was read on
a Xeon with AMX), and the evidence recorded there is judged the same way everywhere.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.commands import crash_repro, roundtrip
from harness.commands.matrix import plan_matrix
from harness.commands.roundtrip.plan import CPU_CAPACITY_SAFETY
from harness.engine import amx
from harness.errors import BadInput
from harness.scenario.crash_repro import load_crash_repro
from harness.scenario.matrix import load_matrix
from harness.scenario.roundtrip import load_roundtrip
from harness.server import engine_log
from harness.server.metrics import CacheConfig
from harness.server.workload import Completion, within_tolerance

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures"
AMX_CPUINFO = (FIXTURES / "amx-host" / "cpuinfo.txt").read_text()
NO_AMX_CPUINFO = "model name\t: Some CPU\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
AMX = amx.cpu_flags(AMX_CPUINFO)
NO_AMX = amx.cpu_flags(NO_AMX_CPUINFO)


def test_recorded_amx_host_is_recognised_and_plain_avx512_is_not():
    assert amx.has_amx(AMX) and {"amx_bf16", "amx_int8"} <= AMX
    assert not amx.has_amx(NO_AMX)
    assert amx.cpu_flags("no flags line here") == frozenset()


@pytest.mark.parametrize(
    ("flags", "env", "state"),
    [
        (AMX, {}, "requested"),
        (AMX, {"OFFLOAD_CHECK_AMX": "off"}, "off"),
        (AMX, {"OFFLOAD_CHECK_AMX": "on"}, "requested"),
        (NO_AMX, {}, "not-needed"),
        (NO_AMX, {"OFFLOAD_CHECK_AMX": "off"}, "not-needed"),
    ],
)
def test_planned_state(monkeypatch, flags, env, state):
    monkeypatch.setattr(amx.platform, "machine", lambda: "x86_64")
    assert amx.planned_state(flags, env) == state


def test_engine_side_fix_acts_only_in_harness_launched_processes(monkeypatch, capsys):
    calls: list[str] = []
    monkeypatch.setattr(amx, "cpu_flags", lambda cpuinfo=None: AMX)
    monkeypatch.setattr(amx.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(amx, "request_permission", lambda: calls.append("req") or True)
    monkeypatch.delenv("OFFLOAD_CHECK_AMX", raising=False)
    assert amx.apply_in_process() is None and calls == []
    monkeypatch.setenv("OFFLOAD_CHECK_AMX", "on")
    line = amx.apply_in_process()
    assert calls == ["req"] and line is not None and "requested granted=True" in line
    assert "offload-check amx: requested granted=True" in capsys.readouterr().err
    monkeypatch.setenv("OFFLOAD_CHECK_AMX", "off")
    monkeypatch.setattr(amx, "permission_granted", lambda: False)
    line = amx.apply_in_process()
    assert calls == ["req"] and line is not None and "off granted=False" in line


def test_request_permission_runs_for_real_on_this_host():
    """True only where the CPU has AMX tiles; never raises on any x86 CPU."""
    granted = amx.request_permission()
    assert granted is amx.has_amx() or (granted is False and not amx.has_amx())


def crash_plan(monkeypatch, flags):
    monkeypatch.setattr(crash_repro, "cpu_flags", lambda: flags)
    return crash_repro.plan_run(load_crash_repro(ROOT / "scenarios" / "crash-repro.toml"))


def test_amx_sigill_row_is_planned_on_amx_hosts_and_skipped_elsewhere(monkeypatch):
    rows = [r for r in crash_plan(monkeypatch, AMX).rows if r.variant == "current-no-amx"]
    assert [(r.model, r.connector) for r in rows] == [
        ("llama4-small-chunk", True),
        ("llama4-small-chunk", False),
    ]
    for r in rows:
        assert not r.skip_reason
        assert (r.expected, r.expected_known) == ("crashed-on-first-request", "amx-sigill")
        assert r.plan.env["OFFLOAD_CHECK_AMX"] == "off"
        assert r.plan.env["PYTHONFAULTHANDLER"] == "1"
    rows = [r for r in crash_plan(monkeypatch, NO_AMX).rows if r.variant == "current-no-amx"]
    assert len(rows) == 2 and all("needs a CPU with amx_tile" in r.skip_reason for r in rows)


def test_every_other_row_gets_the_fix_unless_the_user_switches_it_off(monkeypatch):
    plan = crash_plan(monkeypatch, AMX)
    assert {
        r.plan.env["OFFLOAD_CHECK_AMX"] for r in plan.rows if r.variant != "current-no-amx"
    } == {"on"}
    monkeypatch.setenv("OFFLOAD_CHECK_AMX", "off")
    plan = crash_plan(monkeypatch, AMX)
    assert {r.plan.env["OFFLOAD_CHECK_AMX"] for r in plan.rows} == {"off"}


MLA_BYTES_PER_TOKEN = 4608  # 4 layers x (512 latent + 64 rope) x 2 B


def mla_plan():
    scn = load_matrix(ROOT / "scenarios" / "matrix.toml")
    plan = plan_matrix(scn, geometries=["deepseek-mla"], variants=["current"], tiers=["roomy"])
    (cell,) = plan.cells
    assert cell.plan is not None
    return cell.plan


def test_mla_pool_is_a_token_intent_not_a_block_count():
    plan = mla_plan()
    assert plan.server is not None
    argv, env = plan.server.argv(), plan.server.env
    assert "--num-gpu-blocks-override" not in argv
    i = argv.index("--kv-cache-memory-bytes")
    assert int(argv[i + 1]) == 2560 * MLA_BYTES_PER_TOKEN
    # vLLM's CPU platform lets this variable override the flag: it must be absent.
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    tier = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    tier_bytes = tier["kv_connector_extra_config"]["cpu_bytes_to_use"]
    assert isinstance(tier_bytes, int) and plan.cpu_capacity_tokens is not None
    assert plan.cpu_capacity_tokens >= 1280 + 3200  # targets' stored tokens + filler


@pytest.mark.parametrize("block", [16, 128])
def test_mla_plan_holds_for_the_reference_and_the_amx_block_size(block):
    """The same bytes make 160 blocks of 16 (reference MLA) or 20 of 128 (AMX MLA)."""
    plan = mla_plan()
    blocks = 2560 * MLA_BYTES_PER_TOKEN // (block * MLA_BYTES_PER_TOKEN)
    filler = roundtrip.size_filler(plan, CacheConfig(blocks, block, {}))
    assert filler.pool_tokens == 2560 and not filler.note


def test_old_block_count_on_an_amx_host_was_an_impossible_plan():
    """What the AMX host saw: 160 blocks of 128 tokens behind a fixed 64 MiB tier."""
    plan = dataclasses.replace(
        mla_plan(), cpu_capacity_tokens=int(67108864 * CPU_CAPACITY_SAFETY) // 5120
    )
    with pytest.raises(BadInput, match="impossible eviction plan"):
        roundtrip.size_filler(plan, CacheConfig(160, 128, {}))


def roundtrip_scenario(tmp_path, **server):
    scn = load_roundtrip(ROOT / "scenarios" / "roundtrip-cpu.toml")
    for k, v in server.items():
        setattr(scn.server, k, v)
    return scn


def test_pool_tokens_refuses_conflicts_and_impossible_plans_before_launch(tmp_path):
    scn = roundtrip_scenario(tmp_path, pool_tokens=4096)
    with pytest.raises(BadInput, match="both size the pool"):
        roundtrip.plan_roundtrip(scn)
    scn = roundtrip_scenario(tmp_path, pool_tokens=1024, extra_args=["--enforce-eager"])
    with pytest.raises(BadInput, match="below max_model_len"):
        roundtrip.plan_roundtrip(scn)
    scn = roundtrip_scenario(tmp_path, pool_tokens=200_000, extra_args=["--enforce-eager"])
    with pytest.raises(BadInput, match=r"impossible eviction plan.*lower server\.pool_tokens"):
        roundtrip.plan_roundtrip(scn)
    scn = roundtrip_scenario(tmp_path, pool_tokens=200_000, extra_args=["--enforce-eager"])
    scn.offload.cpu_bytes_to_use = "auto"
    plan = roundtrip.plan_roundtrip(scn)
    assert plan.cpu_capacity_tokens is not None and plan.cpu_capacity_tokens > 250_000


def test_auto_tier_needs_a_pool_intent(tmp_path):
    scn = roundtrip_scenario(tmp_path)
    scn.offload.cpu_bytes_to_use = "auto"
    with pytest.raises(BadInput, match=r"needs server\.pool_tokens"):
        roundtrip.plan_roundtrip(scn)


def recorded_pairs() -> dict[str, tuple[Completion, Completion]]:
    """Cold pass (connector on) vs baseline server (connector off), recorded on AMX."""
    recs = [
        json.loads(line)
        for line in (FIXTURES / "amx-host" / "roundtrip-clean-with-baseline.requests.jsonl").open()
    ]
    by = {(r["phase"], r["prompt"]): r for r in recs}

    def comp(r: dict) -> Completion:
        c = Completion(r["phase"], r["prompt"], r["prompt_tokens"], {})
        c.text, c.token_ids, c.logprobs = r["text"], r["token_ids"], r["logprobs"]
        return c

    return {p: (comp(by[("cold", p)]), comp(by[("baseline", p)])) for p in ("target-0", "target-1")}


def test_recorded_cross_server_difference_is_within_the_measured_tolerance():
    pairs = recorded_pairs()
    c0 = within_tolerance(*pairs["target-0"], tol=0.008)
    assert c0.divergence is None and c0.near_tie is None
    assert 0.003 < c0.max_delta < 0.004  # the floor measured on the AMX host
    c1 = within_tolerance(*pairs["target-1"], tol=0.008)
    # Token 9: the baseline saw an exact tie between t22 and t984 and picked t22.
    assert c1.divergence is None and c1.near_tie == 9


def test_tolerance_zero_is_exact_and_real_differences_fail():
    pairs = recorded_pairs()
    assert within_tolerance(*pairs["target-0"], tol=0.0).divergence is not None
    a, b = pairs["target-0"]
    assert within_tolerance(a, a, tol=0.0).divergence is None
    b.logprobs["token_logprobs"][3] += 0.05  # type: ignore[index]
    div = within_tolerance(a, b, tol=0.008).divergence
    assert div is not None and (div.field, div.position) == ("logprobs", 3)
    a, b = pairs["target-1"]
    b.token_ids[2] += 1  # a different token where nothing was tied
    div = within_tolerance(a, b, tol=0.008).divergence
    assert div is not None and (div.field, div.position) == ("token_ids", 2)


def test_engine_report_is_read_back_from_a_recorded_server_log():
    lines = (FIXTURES / "signals" / "server-sigsegv-worker.log").read_text().splitlines()
    assert engine_log.kernels(lines) == {
        "attention_backend": "CPUAttentionBackend",
        "attention_isa": "vec",
    }
    assert engine_log.describe(lines) == "CPUAttentionBackend/vec"
    assert engine_log.amx_permission(lines) == "not-needed"
    assert engine_log.amx_permission(["offload-check amx: requested granted=True pid=3"]) == (
        "requested"
    )


def test_python_fault_handler_survives_native_handlers():
    """A native library (tvm_ffi, via xgrammar) replaces the SIGSEGV handler; re-arming
    puts Python's back, so a dying vLLM process still prints its Python stack."""
    code = (
        "import ctypes, importlib.util\n"
        "if importlib.util.find_spec('tvm_ffi'): import tvm_ffi\n"
        "from harness.engine.crash_handler import rearm\n"
        "assert rearm()\n"
        "ctypes.string_at(0)\n"
    )
    env = {"PYTHONFAULTHANDLER": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120
    )
    assert proc.returncode == -11
    assert "Fatal Python error: Segmentation fault" in proc.stderr
    assert 'File "<string>", line 5' in proc.stderr


@pytest.mark.parametrize(
    "name",
    [
        "amx-host/crash-repro-small-chunk-current-connector-on.server.log",
        "amx-host/crash-repro-small-chunk-current-connector-off.server.log",
        "signals/server-sigsegv-worker.log",
    ],
)
def test_recorded_first_request_deaths_are_crashes_not_slow_answers(name):
    """The AMX host's recorded rows said "started but did not answer"; read again, their
    logs show a dead engine, which crash-repro now reports as crashed-on-first-request."""
    assert crash_repro._engine_died(FIXTURES / name)


def test_a_refused_request_on_a_live_engine_is_not_a_death(tmp_path):
    log = tmp_path / "server.log"
    log.write_text('INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 400 Bad Request\n')
    assert not crash_repro._engine_died(log)


def test_auto_tier_in_a_crash_repro_is_refused_at_load(tmp_path):
    text = (ROOT / "scenarios" / "crash-repro.toml").read_text()
    bad = tmp_path / "auto.toml"
    bad.write_text(text.replace("cpu_bytes_to_use = 268435456", 'cpu_bytes_to_use = "auto"'))
    with pytest.raises(BadInput, match="needs a round trip"):
        load_crash_repro(bad)
