"""The offload speed: vLLM's rate from its counters beside one bulk copy of the same bytes.

The bulk copy runs for real here (the script, by its path, with this interpreter's torch
on the CPU); the arithmetic is checked on phase results built from real snapshots.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from harness.commands import roundtrip as rt
from harness.commands.roundtrip import speed
from harness.commands.roundtrip.files import SPEED_TABLE, roundtrip_report
from harness.errors import RuntimeFailure
from harness.scenario.roundtrip import load_roundtrip
from harness.server import bulk_copy, copy_limit
from harness.server.copy_limit import CopyLimit
from harness.server.metrics import Snapshot

ROOT = Path(__file__).resolve().parents[4]
MiB = 1 << 20


def plan():
    return rt.plan_roundtrip(load_roundtrip(ROOT / "scenarios" / "roundtrip-cpu.toml"))


def result_with(*phases: tuple[str, Snapshot]) -> rt.RoundtripResult:
    return rt.RoundtripResult(plan(), phases=[rt.PhaseResult(n, 1, d, d, 1.0) for n, d in phases])


LIMIT = CopyLimit("cpu", "one host-to-host copy", 100 * MiB, 0.01, 0.02, "2.13.0")


def test_the_bulk_copy_runs_in_the_interpreter_and_reports_both_directions():
    limit = copy_limit.measure(sys.executable, "cpu", 4 * MiB)
    assert limit.device == "cpu" and limit.bytes == 4 * MiB
    assert limit.store_seconds > 0 and limit.load_seconds > 0
    assert limit.torch == torch.__version__ and "host-to-host" in limit.how


def test_a_failed_bulk_copy_is_one_line():
    with pytest.raises(RuntimeFailure, match="CUDA is not available") as err:
        copy_limit.measure(sys.executable, "cuda", MiB)
    assert "\n" not in str(err.value)
    with pytest.raises(RuntimeFailure, match="did not run"):
        copy_limit.measure("/nonexistent/python", "cpu", MiB)


def test_a_short_copy_cannot_pass_for_a_fast_one():
    """The seeded fault: a copy that moves half the bytes is refused, not timed."""
    src = torch.full((1000,), bulk_copy.STORE_BYTE, dtype=torch.uint8)
    dst = torch.zeros(1000, dtype=torch.uint8)
    dst[:500].copy_(src[:500])
    with pytest.raises(RuntimeError, match="500 of 1,000 bytes not copied"):
        bulk_copy.verify(dst, bulk_copy.STORE_BYTE, "half")
    dst.copy_(src)
    bulk_copy.verify(dst, bulk_copy.STORE_BYTE, "whole")


def test_the_copy_is_the_cold_pass_s_bytes_capped():
    seed = speed.moved(
        result_with(
            ("cold", Snapshot(stored_bytes=245_366_784, store_seconds=1.0)),
            ("filler", Snapshot(stored_bytes=754_974_720, store_seconds=3.0)),
            ("replay", Snapshot(loaded_bytes=245_366_784, load_seconds=1.0)),
        )
    )
    assert speed.yardstick_bytes(seed) == 245_366_784  # the seed's, the same bytes
    long = [speed.Moved("cold", "store", 6_392_119_296, 9.0)]
    assert speed.yardstick_bytes(long) == copy_limit.CAP_BYTES
    no_cold = [speed.Moved("replay", "load", 1000, 0.1), speed.Moved("filler", "store", 50, 1)]
    assert speed.yardstick_bytes(no_cold) == 1000


def test_rates_per_phase_set_the_copy_beside_them():
    result = result_with(
        ("cold", Snapshot(stored_bytes=200 * MiB, store_seconds=0.5)),
        ("warm", Snapshot()),
        ("filler", Snapshot(stored_bytes=100 * MiB, store_seconds=0.25)),
        ("replay", Snapshot(loaded_bytes=50 * MiB, load_seconds=0.5)),
    )
    rows = speed.speed_rows(speed.moved(result), LIMIT, tensor_parallel=4)
    assert [(r.phase, r.direction) for r in rows] == [
        ("cold", "store"),
        ("filler", "store"),
        ("replay", "load"),
    ]
    cold, _, replay = rows
    assert cold.bytes == 200 * MiB and cold.seconds == 0.5
    assert cold.gbps == round(200 * MiB / 0.5 / 1e9, 4)
    assert cold.copy_gbps == round(100 * MiB / 0.01 / 1e9, 4)
    assert cold.ratio == round((200 * MiB / 0.5) / (100 * MiB / 0.01), 5)
    assert replay.copy_seconds == 0.02 and replay.tensor_parallel == 4
    assert list(cold.record()) == list(SPEED_TABLE.columns)


def test_a_phase_without_time_has_no_rate():
    result = result_with(("cold", Snapshot(stored_bytes=MiB)))
    (row,) = speed.speed_rows(speed.moved(result), LIMIT, 1)
    assert row.direction == "store" and row.gbps is None and row.ratio is None


def test_what_is_not_measured_says_why(monkeypatch):
    attached = result_with(("cold", Snapshot(stored_bytes=MiB, store_seconds=0.1)))
    attached.plan = dataclasses.replace(attached.plan, env=None)
    speed.measure_speed(attached, lambda _line: None)
    assert attached.offload_speed is None and "attached server" in attached.notes[-1]

    idle = result_with(("cold", Snapshot()))
    speed.measure_speed(idle, lambda _line: None)
    assert idle.offload_speed is None and "nothing was stored or loaded" in idle.notes[-1]

    def fails(*_args, **_kw):
        raise RuntimeFailure("the bulk copy failed: out of memory")

    monkeypatch.setattr(copy_limit, "measure", fails)
    failed = result_with(("cold", Snapshot(stored_bytes=MiB, store_seconds=0.1)))
    speed.measure_speed(failed, lambda _line: None)
    assert failed.offload_speed is None and "out of memory" in failed.notes[-1]


def test_a_measured_speed_reaches_the_report(monkeypatch):
    monkeypatch.setattr(copy_limit, "measure", lambda *_a, **_k: LIMIT)
    result = result_with(
        ("cold", Snapshot(stored_bytes=100 * MiB, store_seconds=1.0)),
        ("replay", Snapshot(loaded_bytes=100 * MiB, load_seconds=2.0)),
    )
    lines: list[str] = []
    speed.measure_speed(result, lines.append)
    assert lines == [f"measuring one bulk copy of {100 * MiB:,} B each way on cpu ..."]
    report = roundtrip_report(result, {})
    assert "## Offload speed" in report
    row = "| cold | store | 104,857,600 | 1.0000 | 0.105 GB/s | 104,857,600 | 10.5 GB/s | 1.0% |"
    assert row in report
