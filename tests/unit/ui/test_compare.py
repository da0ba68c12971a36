"""``offload-check compare`` gates a nightly: exit 1 on a recorded regression pair, 0 on
an identical pair, real deltas for counters, the same comparison as JSON (issue 23)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import pandas as pd
import pytest

from harness.cli import app as cli
from harness.ui.compare import compare
from tests.conftest import ROOT

REPLAY = ROOT / "tests" / "fixtures" / "replay"
CLEAN, CORRUPT, PARTIAL = (
    REPLAY / "clean",
    REPLAY / "fault-corrupt-load",
    REPLAY / "fault-partial-store",
)
CRASH_REPRO = ROOT / "tests" / "fixtures" / "results" / "20261130-065547-crash-repro-1904"


def invoke(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.run(list(args))
    return code, out.getvalue(), err.getvalue()


def test_a_recorded_regression_exits_1():
    code, out, err = invoke("compare", str(CLEAN), str(CORRUPT))
    assert code == 1, err
    assert "regressed checks replay-output-identical: passed True -> False" in out
    assert "1 regression(s)" in out


def test_an_identical_pair_exits_0():
    code, out, _ = invoke("compare", str(CLEAN), str(CLEAN))
    assert code == 0
    assert "0 row(s) changed, 0 regression(s)" in out


def test_a_fix_is_a_change_not_a_regression():
    result = compare(CORRUPT, CLEAN)
    assert result.changed == 1
    assert result.regressions == []
    assert result.exit_code == 0


def test_counters_carry_their_real_delta():
    result = compare(CLEAN, PARTIAL)
    phases = {r["key"]["phase"]: r for r in result.tables[0].rows}
    stored = phases["cold"]["columns"]["d_stored_bytes"]
    assert (stored["a"], stored["b"], stored["delta"]) == (1310720, 327680, 327680 - 1310720)
    assert phases["replay"]["columns"]["d_loaded_bytes"]["delta"] == 0
    shown = {r["phase"]: r for r in result.tables[0].records()}
    assert shown["cold"]["d_stored_bytes"] == "1310720 -> 327680 (-983040)"
    assert shown["replay"]["d_loaded_bytes"] == "524288"  # unchanged: one value
    assert set(result.regressions) == {
        "checks cold-stored-bytes: passed True -> False",
        "checks replay-output-identical: passed True -> False",
    }


def test_json_is_the_same_comparison():
    code, out, _ = invoke("compare", str(CLEAN), str(PARTIAL), "--json")
    assert code == 1
    data = json.loads(out)
    assert data["exit_code"] == 1
    assert data["command"] == "roundtrip"
    assert len(data["regressions"]) == 2
    assert [t["file"] for t in data["tables"]] == ["phases.csv", "checks.csv"]
    code, out, _ = invoke("compare", str(CLEAN), str(CLEAN), "--json")
    assert code == 0
    assert json.loads(out)["regressions"] == []


@pytest.fixture
def later(tmp_path):
    copy = tmp_path / "later"
    shutil.copytree(CRASH_REPRO, copy)
    return copy


def _edit(run, **where_then):
    path = run / "outcomes.csv"
    df = pd.read_csv(path, keep_default_na=False)
    mask = (df.variant == "stock") & (df.connector == "on") & (df.model == "llama4-issue-51150")
    assert mask.sum() == 1
    for column, value in where_then.items():
        df[column] = df[column].astype(object)
        df.loc[mask, column] = value
    df.to_csv(path, index=False)
    return df


def test_an_outcome_change_is_a_regression(later):
    _edit(later, outcome="started", signature="")
    result = compare(CRASH_REPRO, later)
    assert result.exit_code == 1
    assert any("outcome crashed -> started" in r for r in result.regressions)


def test_a_signature_change_alone_is_not(later):
    _edit(later, signature="AssertionError somewhere else")
    result = compare(CRASH_REPRO, later)
    assert result.changed == 1
    assert result.exit_code == 0


def test_a_row_gone_from_the_later_run_is_a_regression(later):
    path = later / "outcomes.csv"
    df = pd.read_csv(path, keep_default_na=False)
    df.iloc[1:].to_csv(path, index=False)
    result = compare(CRASH_REPRO, later)
    assert result.exit_code == 1
    assert any("gone from the later run" in r for r in result.regressions)


def test_bad_inputs_stay_one_line(tmp_path):
    code, _, err = invoke("compare", str(CLEAN), str(CRASH_REPRO))
    assert code == 2
    assert "cannot compare a roundtrip run with a crash-repro run" in err
    (tmp_path / "run.json").write_text("{")
    code, _, err = invoke("compare", str(tmp_path), str(CLEAN))
    assert code == 2
    assert len(err.strip().splitlines()) == 1
