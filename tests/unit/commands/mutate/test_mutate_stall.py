"""mutate's stall window for the mutants' stress runs, calibrated from the baseline's
own run (harness.commands.mutate.execute): four times the baseline's longest quiet with
requests waiting, at least 30 s, at most stress's 120 s default; a round trip is left as
it is; a baseline that recorded no quiet leaves stress's default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.commands.mutate import execute
from harness.commands.mutate.execute import MutateCommand, calibrated_stall, stall_windows


def baseline_run(where: Path, slug: str, quiet: float | None) -> Path:
    run = where / slug / "20261204-000000-stress-abcd"
    run.mkdir(parents=True)
    figures = {} if quiet is None else {"longest_still_s": quiet}
    (run / "run.json").write_text(json.dumps({"stress": figures}))
    return run


@pytest.mark.parametrize(
    ("quiet", "window"), [(0.4, 30.0), (2.5, 30.0), (11.0, 44.0), (80.0, 120.0)]
)
def test_the_window_is_four_quiets_between_the_floor_and_the_default(tmp_path, quiet, window):
    assert calibrated_stall(baseline_run(tmp_path, "stress", quiet)) == window


def test_no_recorded_quiet_means_no_calibration(tmp_path):
    assert calibrated_stall(baseline_run(tmp_path, "stress", None)) is None
    assert calibrated_stall(None) is None
    assert calibrated_stall(tmp_path / "missing") is None


def test_only_stress_commands_get_a_window_and_it_reaches_their_argv(tmp_path):
    stress, roundtrip = MutateCommand.parse("stress"), MutateCommand.parse("roundtrip")
    baseline_run(tmp_path, "stress", 12.0)
    (tmp_path / "roundtrip").mkdir()
    stalls = stall_windows([stress, roundtrip], tmp_path)
    assert stalls == {"stress": 48.0}
    timed = stress.stalling_after(stalls["stress"])
    assert timed.name == "stress" and timed.slug == "stress"  # same column, same directory
    argv = execute.command_argv(timed, "/env/bin/python", tmp_path / "out")
    assert argv[argv.index("--stall-after") + 1] == "48"
    assert roundtrip.stalling_after(48.0) is roundtrip
    assert stress.stalling_after(None) is stress
