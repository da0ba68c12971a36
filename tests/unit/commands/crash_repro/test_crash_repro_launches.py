"""crash-repro launches each distinct server once: rows with one launch key share it."""

from __future__ import annotations

from pathlib import Path

from harness.commands import crash_repro
from harness.scenario.crash_repro import load_crash_repro

ROOT = Path(__file__).resolve().parents[4]
NO_AMX = {"avx2", "avx512f"}
AMX = NO_AMX | {"amx_tile", "amx_bf16", "amx_int8"}


def plan(monkeypatch, flags):
    monkeypatch.setattr(crash_repro, "cpu_flags", lambda: flags)
    return crash_repro.plan_run(load_crash_repro(ROOT / "scenarios" / "crash-repro.toml"))


def by_key(rows):
    return {r.key: r for r in rows}


def test_a_control_carries_no_patch_so_the_two_stock_controls_are_one_server(monkeypatch):
    rows = by_key(plan(monkeypatch, NO_AMX).rows)
    for model in ("llama4-issue-51150", "llama4-small-chunk"):
        stock = rows[f"{model} / stock / connector off"]
        fixed = rows[f"{model} / stock+fix / connector off"]
        assert stock.patch is None and fixed.patch is None
        assert fixed.plan.env["OFFLOAD_CHECK_PATCH"] == "none"
        assert stock.plan.launch_key() == fixed.plan.launch_key()
        # The connector-on rows differ by the patch and stay two launches.
        on = rows[f"{model} / stock+fix / connector on"]
        assert on.patch == "chunked-local-fix"
        assert on.plan.launch_key() != rows[f"{model} / stock / connector on"].plan.launch_key()


def test_the_launch_count_after_merging(monkeypatch):
    no_amx = plan(monkeypatch, NO_AMX)
    # The two small models on four variants (current-no-amx on one), Scout's and
    # Maverick's narrow layouts on stock and current: 22 rows.
    assert len(no_amx.rows) == 22
    # 2 current-no-amx rows skipped, 2 stock+fix controls served by the stock ones.
    assert crash_repro.launch_count(no_amx.rows) == 18
    assert crash_repro.launch_count(plan(monkeypatch, AMX).rows) == 20


def test_execute_launches_each_key_once_and_judges_every_row(monkeypatch, tmp_path):
    run = plan(monkeypatch, NO_AMX)
    launched: list[str] = []

    def fake_run_row(row, scenario, log_dir, on_tick=None, port=None):
        launched.append(row.key)
        row.outcome, row.seconds, row.log = "started", 1.0, f"{row.key}.log"
        row.answered, row.answer = True, "ok"
        return row

    finished = []

    class Rec:
        def row_started(self, row, index, total): ...
        def row_tick(self, row, elapsed): ...
        def row_finished(self, row, index, total):
            finished.append(row)

    monkeypatch.setattr(crash_repro, "run_row", fake_run_row)
    crash_repro.execute_crash_repro(run, tmp_path, Rec())
    assert len(launched) == 18 and len(set(launched)) == 18
    assert len(finished) == 22
    rows = by_key(run.rows)
    shared = rows["llama4-small-chunk / stock+fix / connector off"]
    first = rows["llama4-small-chunk / stock / connector off"]
    assert shared.key not in launched and first.key in launched
    assert shared.launch == first.launch > 0
    assert shared.shared_with == first.key
    assert (shared.outcome, shared.log, shared.answered) == ("started", first.log, True)
    assert shared.matched is True  # judged against its own expectation
    assert sorted({r.launch for r in run.rows if r.launch}) == list(range(1, 19))
    assert {r.launch for r in run.rows if r.skip_reason} == {0}
