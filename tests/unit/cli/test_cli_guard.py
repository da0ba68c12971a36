"""The guard around every command: option values checked at parse time, click's usage
errors and unexpected exceptions as one line with a documented exit code, and no
``run.json`` left ``running`` (issue 23)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import CLI, ROOT
from tests.unit.cli.cli_in_process import invoke, keep_signal_handlers, one_line  # noqa: F401


def statuses(results: Path) -> list[str]:
    return [json.loads(p.read_text())["status"] for p in results.glob("*/run.json")]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["roundtrip", "--dry-run", "--port", "99999"], "'--port'"),
        (["roundtrip", "--dry-run", "--port", "-1"], "'--port'"),
        (["crash-repro", "--dry-run", "--port", "99999"], "'--port'"),
        (["crash-repro", "--dry-run", "--port", "-1"], "'--port'"),
        (["roundtrip", "--dry-run", "--url", "not-a-url"], "not an http(s) URL"),
        (["stress", "--url", "not-a-url"], "not an http(s) URL"),
        (["roundtrip", "--dry-run", "--url", "ftp://host:1"], "not an http(s) URL"),
        (["roundtrip", "--dry-run", "--url", "http://:8000"], "not an http(s) URL"),
        (["stress", "--dry-run", "--tp", "0"], "'--tp'"),
        (["stress", "--dry-run", "--concurrency", "0"], "'--concurrency'"),
        (["stress", "--dry-run", "--duration", "0"], "'--duration'"),
        (["stress", "--dry-run", "--duration", "nan"], "'--duration'"),
        (["roundtrip", "--dry-run", "--seed", "abc"], "'--seed'"),
        (["bench", "--only", "bogus"], "'--only'"),
        (["crash-repro", "--dry-run", "--timeout", "-5"], "not a positive number"),
        (["crash-repro", "--dry-run", "--timeout", "nan"], "not a positive number"),
        (["crash-repro", "--dry-run", "--results-dir", "README.md"], "not a directory"),
        (["crash-repro", "--dry-run", "--results-dir", "README.md/sub"], "cannot be created"),
        (["crash-repro", "--bogus"], "No such option: --bogus"),
        (["envs", "create"], "Missing argument"),
    ],
)
def test_bad_values_are_one_line_and_exit_2(args, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    if "--results-dir" not in args:
        args = [*args, "--results-dir", str(tmp_path)] if args[0] != "envs" else args
    code, _, err = invoke(*args)
    line = one_line(err)
    assert code == 2, err
    assert line.startswith(f"offload-check: error: {args[0]}"), line
    assert needle in line, line
    assert statuses(tmp_path) == []


def test_interpreters_are_checked_the_same_way_everywhere(tmp_path):
    not_python = tmp_path / "python"
    not_python.write_text("")
    for args in (
        ["crash-repro", "--python", "/usr/bin/python3", "--dry-run"],
        ["bugs", "--build", "/usr/bin/python3", "--dry-run"],
        ["sweep", "--build", "/usr/bin/python3", "--dry-run"],
        ["roundtrip", "--python", "/usr/bin/python3", "--dry-run"],
    ):
        code, _, err = invoke(*args)
        assert code == 2, (args, err)
        assert "vLLM is not importable" in one_line(err), args
    for option, command in (("--python", "crash-repro"), ("--build", "bugs")):
        code, _, err = invoke(command, option, "/nonexistent", "--dry-run")
        assert code == 2
        assert f"{option} /nonexistent: no such" in one_line(err)
    code, _, err = invoke("bugs", "--build", str(tmp_path / "x.whl"), "--dry-run")
    assert code == 2
    assert "no such wheel" in one_line(err)


def test_stress_attach_to_nothing_leaves_no_run(tmp_path):
    code, _, err = invoke("stress", "--url", "http://127.0.0.1:1", "--results-dir", str(tmp_path))
    assert code == 2
    assert "cannot reach http://127.0.0.1:1" in one_line(err)
    assert list(tmp_path.iterdir()) == []


def test_help_short_option():
    code, out, _ = invoke("stress", "-h")
    assert code == 0
    assert "--profile" in out
    code, out, _ = invoke("-h")
    assert code == 0
    assert "crash-repro" in out


def test_unexpected_exception_before_a_run_dir(monkeypatch, tmp_path):
    from harness.commands import crash_repro

    def boom(*_a, **_k):
        raise ValueError("planner broke\nsecond line")

    monkeypatch.setattr(crash_repro, "plan_run", boom)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    code, _, err = invoke("crash-repro", "--dry-run")
    line = one_line(err)
    assert code == 3
    assert line.startswith("offload-check: internal error in crash-repro: ValueError: planner")
    assert "second line" in line
    where = Path(line.rsplit("(traceback: ", 1)[1].rstrip(")"))
    assert where.parent == tmp_path
    assert "Traceback" in where.read_text()
    assert "planner broke" in where.read_text()


def test_unexpected_exception_in_a_run_marks_it_failed(monkeypatch, tmp_path):
    from harness.commands import crash_repro

    def boom(*_a, **_k):
        raise RuntimeError("model builder broke")

    monkeypatch.setattr(crash_repro, "build_models", boom)
    results = tmp_path / "results"
    code, _, err = invoke(
        "crash-repro", "--variant", "current", "--connector", "off", "--results-dir", str(results)
    )
    line = one_line(err)
    assert code == 3
    assert "internal error in crash-repro: RuntimeError: model builder broke" in line
    (run_json,) = results.glob("*/run.json")
    meta = json.loads(run_json.read_text())
    assert meta["status"] == "failed"
    assert meta["exit_code"] == 3
    assert meta["error"] == "RuntimeError: model builder broke"
    traceback_file = run_json.parent / "traceback.txt"
    assert meta["traceback_file"] == str(traceback_file)
    assert f"(traceback: {traceback_file})" in line
    assert "model builder broke" in traceback_file.read_text()


def test_interrupt_outside_the_run_guard_marks_it_interrupted(monkeypatch, tmp_path):

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr("harness.server.interpreters.git_revision", interrupted)
    code, _, _ = invoke("crash-repro", "--variant", "current", "--results-dir", str(tmp_path))
    assert code == 130
    assert statuses(tmp_path) == ["interrupted"]


def test_real_process_one_line_and_exit_code():
    """The console script goes through the same guard (``main`` -> ``run``)."""
    proc = subprocess.run(
        [*CLI, "roundtrip", "--dry-run", "--port", "99999"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert "'--port'" in one_line(proc.stderr)


def test_silent_acceptances_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("OFFLOAD_CHECK_CACHE", str(tmp_path / "cache"))  # prune: nothing real
    empty = tmp_path / "corpus"
    empty.mkdir()
    for args, needle in (
        (["bugs", "--dry-run", "--corpus", str(empty)], "holds no entries"),
        (["bench", "--config", str(tmp_path / "no.json")], "no such model config"),
        (["envs", "prune", "--keep", ""], "--keep ''"),
        (["crash-repro", "--dry-run", "--results-dir", str(tmp_path / "f" / "x")], None),
    ):
        if needle is None:  # a results dir that can be created is fine, and not made
            code, _, _ = invoke(*args)
            assert code == 0
            assert not (tmp_path / "f").exists()
            continue
        code, _, err = invoke(
            *args, *(["--results-dir", str(tmp_path)] if args[0] == "bench" else [])
        )
        assert code == 2, (args, err)
        assert needle in one_line(err)
    assert list(tmp_path.glob("*/run.json")) == []
