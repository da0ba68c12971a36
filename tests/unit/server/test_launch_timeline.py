"""The launch timeline read from recorded server logs of vLLM 0.27.1 and 0.32.0."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from harness.server import launch_timeline as lt

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LOG_0271 = FIXTURES / "stock-0.27.1-51150-crash.log"  # dies in EngineCore after init
LOG_0320 = FIXTURES / "launch" / "current-0.32.0-start-answer-stop.log"
LOG_0320_TP = FIXTURES / "amx-host" / "crash-repro-small-chunk-current-connector-on.server.log"


def wall(text: str) -> float:
    """A local wall-clock time, as the launcher records ``time.time()`` at the spawn."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").timestamp()


def lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines()


def test_points_of_a_0_32_0_launch_that_started_answered_and_stopped():
    # Spawned 56 s before /health, which the harness saw at 13:46:44.
    points = lt.log_points(lines(LOG_0320), wall("2026-12-01 13:45:48"))
    assert points.api_server_s == 10.5  # first (APIServer pid=...) line at 13:45:58
    assert points.engine_core_s == 37.5  # (EngineCore pid=...) at 13:46:25
    assert points.workers_s == [51.5]  # (VllmWorker-0 pid=...) at 13:46:39
    assert points.engine_init_s == 55.5  # "init engine ... took 2.17 s" at 13:46:43
    assert points.resolution_s == 1.0


def test_points_of_a_0_27_1_launch_that_crashed_after_engine_init():
    points = lt.log_points(lines(LOG_0271), wall("2026-11-30 06:53:10"))
    # Unprefixed Triton lines (06:53:20, before any process tag) are nobody's first line.
    assert points.api_server_s == 12.5  # 06:53:22
    assert points.engine_core_s == 35.5  # 06:53:45
    assert points.workers_s == [46.5]  # (Worker pid=4433) at 06:53:56
    assert points.engine_init_s == 48.5  # 06:53:58


def test_phases_are_consecutive_durations_that_add_up_to_the_answer():
    timeline = lt.build(
        lines(LOG_0320),
        log=str(LOG_0320),
        spawned_wall=wall("2026-12-01 13:45:48"),
        ended="stopped",
        health_s=56.04,
        first_answer_s=56.61,
        stopped_s=57.9,
        teardown_s=1.2,
    )
    phases = timeline.phases()
    assert list(phases) == [name for name, _ in lt.LAUNCH_PHASES]
    assert phases == {
        "api_server_start": 10.5,
        "engine_core_start": 27.0,
        "worker_start": 14.0,
        "engine_init": 4.0,
        "api_ready": 0.54,
        "first_answer": 0.57,
    }
    assert round(sum(v for v in phases.values() if v is not None), 2) == 56.61
    rec = timeline.record()
    assert rec["phases"] == phases and rec["ended"] == "stopped" and rec["teardown_s"] == 1.2


def test_a_server_that_died_before_its_worker_spoke_has_no_later_phases():
    head = [ln for ln in lines(LOG_0320) if "VllmWorker" not in ln and "(Worker" not in ln]
    head = [ln for ln in head if "init engine" not in ln]
    timeline = lt.build(
        head,
        log="x.log",
        spawned_wall=wall("2026-12-01 13:45:48"),
        ended="exited",
        health_s=None,
        first_answer_s=None,
        stopped_s=40.0,
        teardown_s=0.1,
    )
    phases = timeline.phases()
    assert phases["api_server_start"] == 10.5 and phases["engine_core_start"] == 27.0
    assert [phases[k] for k in ("worker_start", "engine_init", "api_ready", "first_answer")] == [
        None
    ] * 4


def test_workers_are_ordered_by_the_rank_they_log():
    log = [
        "(Worker_TP1 pid=12) INFO 12-01 10:00:20 [parallel_state.py:1906] world_size=2 rank=1 ",
        "(Worker_TP0 pid=11) INFO 12-01 10:00:21 [parallel_state.py:1906] world_size=2 rank=0 ",
        "(APIServer pid=10) INFO 12-01 10:00:05.250 [api_utils.py:1] x",
    ]
    points = lt.log_points(log, wall("2026-12-01 10:00:00"))
    assert points.workers_s == [21.5, 20.5]  # rank 0 first, whenever it spoke
    assert points.api_server_s == 5.25 and points.resolution_s == 0.0  # a fraction is kept


def test_a_launch_across_new_year_reads_the_log_in_the_next_year():
    log = ["(APIServer pid=1) INFO 01-01 00:00:09 [api_utils.py:1] x"]
    assert lt.log_points(log, wall("2026-12-31 23:59:59")).api_server_s == 10.5


def test_the_end_of_run_line_names_the_launches_and_where_their_time_went():
    timeline = lt.build(
        lines(LOG_0320),
        log="a.log",
        spawned_wall=wall("2026-12-01 13:45:48"),
        ended="stopped",
        health_s=56.04,
        first_answer_s=56.61,
        stopped_s=57.9,
        teardown_s=1.2,
    ).record()
    line = lt.summary_line([timeline, timeline])
    assert line.startswith("2 launches, median 56s to /health (api server start 19%, ")
    assert "engine core start 48%" in line and "engine init 7%" in line
    assert lt.summary_line([]) == ""


def test_report_shows_a_runs_launches(tmp_path):
    import json

    from harness.ui.terminal import run_tables

    timeline = lt.build(
        lines(LOG_0320),
        log="x/a.log",
        spawned_wall=wall("2026-12-01 13:45:48"),
        ended="stopped",
        health_s=56.04,
        first_answer_s=None,
        stopped_s=57.9,
        teardown_s=1.2,
    ).record()
    (tmp_path / "run.json").write_text(
        json.dumps({"command": "crash-repro", "launches": [timeline]})
    )
    (table,) = run_tables("crash-repro", tmp_path)  # no outcomes.csv: only the launches
    assert table.title == "launches (seconds)" and table.row_count == 1
    assert [c.header for c in table.columns][2:4] == ["api server start", "engine core start"]
