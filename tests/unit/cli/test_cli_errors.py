"""Bad input through the real CLI: one line on stderr, exit 2, never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import CLI, ROOT

SCENARIO = (ROOT / "scenarios" / "crash-repro.toml").read_text()
# One lane more than this machine has cores, whatever it has (the message names the cores,
# or on a GPU machine the GPU); within --jobs's own limit of 64.
TOO_MANY = str(
    min(64, len(os.sched_getaffinity(0)) + 1 if hasattr(os, "sched_getaffinity") else 64)
)


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=120, cwd=cwd or ROOT
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("offload-check: error:")
    assert needle in lines[0], lines[0]


def scenario_copy(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    """A scenario beside copies of the shipped models and variants (absolute interpreters)."""
    (tmp_path / "models").symlink_to(ROOT / "scenarios" / "models")
    (tmp_path / "variants.toml").write_text(
        (ROOT / "scenarios" / "variants.toml").read_text().replace("../", f"{ROOT}/")
    )
    path = tmp_path / name
    path.write_text(text)
    return path


def test_unknown_key(tmp_path):
    path = scenario_copy(tmp_path, SCENARIO.replace("[server]", "[server]\nmax_len = 1"))
    assert_one_line_error(
        run("crash-repro", "--scenario", str(path), "--dry-run"), "server.max_len"
    )


def test_malformed_scenario(tmp_path):
    path = scenario_copy(tmp_path, "name = ")
    assert_one_line_error(run("crash-repro", "--scenario", str(path)), "not valid TOML")
    assert_one_line_error(run("validate", str(path)), "not valid TOML")


def test_missing_interpreter(tmp_path):
    path = scenario_copy(tmp_path, SCENARIO)
    (tmp_path / "variants.toml").write_text(
        '[variants.current]\npython = "/nope/bin/python"\n'
        '[variants.stock]\npython = "/nope/bin/python"\n'
        '[variants."stock+fix"]\npython = "/nope/bin/python"\n'
        "[variants.current-no-amx]\n"
        'python = "/nope/bin/python"\n'
    )
    assert_one_line_error(
        run("crash-repro", "--scenario", str(path), "--dry-run"),
        "interpreter not found: /nope/bin/python",
    )


def test_unknown_variant():
    assert_one_line_error(
        run("crash-repro", "--variant", "nightly", "--dry-run"), "unknown variant 'nightly'"
    )


def test_unbuildable_config(tmp_path):
    cfg = tmp_path / "gpt2.json"
    cfg.write_text('{"model_type": "gpt2", "hidden_size": 64}')
    assert_one_line_error(
        run("crash-repro", "--config", str(cfg), "--variant", "current", "--dry-run"),
        "has no default vLLM architecture",
    )
    cfg.write_text('{"model_type": "llama", "hidden_size": 64}')
    assert_one_line_error(
        run("roundtrip", "--config", str(cfg), "--dry-run"),
        "num_hidden_layers must be a positive integer",
    )


def test_busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        assert_one_line_error(
            run("crash-repro", "--variant", "current", "--port", str(port)),
            f"port {port} on 127.0.0.1 is busy",
        )


def test_unknown_patch():
    assert_one_line_error(run("crash-repro", "--patch", "yolo", "--dry-run"), "unknown patch")


def test_validate_every_shipped_scenario():
    shipped = [*(ROOT / "scenarios").glob("*.toml"), *(ROOT / "scenarios" / "bugs").glob("*.toml")]
    files = sorted(str(p.relative_to(ROOT)) for p in shipped)
    proc = run("validate", *files)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(": ok (") == len(files)
    assert "matrix: 36 cells over 5 families and 3 tiers, all planned" in proc.stdout


def test_matrix_bad_input(tmp_path):
    assert_one_line_error(
        run("matrix", "--family", "transformer", "--dry-run"), "unknown family 'transformer'"
    )
    assert_one_line_error(
        run("matrix", "--geometry", "gpt2", "--dry-run"), "unknown geometry 'gpt2'"
    )
    text = (ROOT / "scenarios" / "matrix.toml").read_text()
    path = scenario_copy(
        tmp_path, text.replace('family = "mla"\ngeometry', 'family = "mla"\nwindow = 3\ngeometry')
    )
    (tmp_path / "roundtrip-cpu.toml").write_text(
        (ROOT / "scenarios" / "roundtrip-cpu.toml").read_text()
    )
    assert_one_line_error(run("matrix", "--scenario", str(path), "--dry-run"), "entries.5.window")
    bad = text.replace("target_tokens = [600, 700]", "target_tokens = [600, 4000]")
    path.write_text(bad)
    assert_one_line_error(
        run("matrix", "--scenario", str(path), "--dry-run"), "exceeds max_model_len"
    )


def test_matrix_dry_run_lists_cells_with_expectations():
    proc = run("matrix", "--family", "chunked-local", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # the console wraps long lines
    for tier in ("roomy", "pressure"):
        assert (
            f"chunked-local / llama4-roundtrip / stock / {tier} (vLLM 0.27.1): expect crashed "
            "#51150" in text
        )
    assert "6 cells" in proc.stdout


@pytest.mark.parametrize("variant", ["stock", "current"])
def test_dry_run_shows_exact_commands_without_launching(variant):
    proc = run("crash-repro", "--variant", variant, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "vllm.entrypoints.openai.api_server" in proc.stdout
    assert '"--host", "127.0.0.1"' in proc.stdout
    assert "HostOffloadingSpec" in proc.stdout  # CPU machine: the harness's host backend


RT = (ROOT / "scenarios" / "roundtrip-cpu.toml").read_text()


def test_roundtrip_unknown_key(tmp_path):
    path = scenario_copy(tmp_path, RT.replace("[workload]", "[workload]\nfiller_tokenz = 3"))
    assert_one_line_error(
        run("roundtrip", "--scenario", str(path), "--dry-run"), "workload.filler_tokenz"
    )


def test_roundtrip_impossible_plans(tmp_path):
    path = scenario_copy(
        tmp_path, RT.replace("target_tokens = [700, 1000]", "target_tokens = [768]")
    )
    assert_one_line_error(
        run("roundtrip", "--scenario", str(path), "--dry-run"), "multiple of the offload chunk"
    )
    path.write_text(RT.replace("cpu_bytes_to_use = 67108864", "cpu_bytes_to_use = 1048576"))
    assert_one_line_error(run("roundtrip", "--scenario", str(path), "--dry-run"), "fewer than the")


def test_roundtrip_unknown_fault_and_tp_that_does_not_divide_heads():
    assert_one_line_error(run("roundtrip", "--fault", "melt", "--dry-run"), "unknown fault")
    assert_one_line_error(run("roundtrip", "--tp", "3", "--dry-run"), "does not divide")


def test_roundtrip_dry_run_prints_the_plan():
    proc = run("roundtrip", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "expected: stored 1,310,720 B, loaded 524,288 B, external hits 1280 tokens" in (
        proc.stdout
    )


def test_report_and_compare_refuse_non_results(tmp_path):
    assert_one_line_error(run("report", str(tmp_path)), "not a results directory")
    assert_one_line_error(run("compare", str(tmp_path), str(tmp_path)), "not a results directory")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--scenario", "nope.toml"], "scenario file not found: nope.toml"),
        (["--scenario", "scenarios/variants.toml"], "a variants file is not a scenario to sweep"),
        (["--check", "llama5", "--releases", "latest"], "--check llama5 names no check"),
        (
            ["--bisect", "llama4-issue-51150", "--releases", "0.27.0..0.28.0"],
            "names 2 checks",
        ),
        (["--build", "/nope/bin/python"], "--build /nope/bin/python: no such wheel"),
        (["--releases", "0.28.0..0.27.0"], "release range 0.28.0..0.27.0 is empty"),
        (["--merge", "/nope"], "/nope: no sweep.csv"),
        (["--jobs", "2", "--port", "8123", "--releases", "latest"], "one --port cannot do"),
        (["--jobs", TOO_MANY, "--releases", "latest"], f"--jobs {TOO_MANY}"),
        (
            ["--bisect", "x", "--jobs", "2", "--releases", "0.27.0..0.28.0"],
            "--bisect builds one release at a time",
        ),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else None,
)
def test_sweep_bad_input(tmp_path, args, needle):
    proc = run("sweep", *args, "--results-dir", str(tmp_path / "results"))
    assert_one_line_error(proc, needle)
    assert not (tmp_path / "results").exists()  # refused before a run directory


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--bug", "1"], "--bug 1: no such entry; there are: 49118, 51150"),
        (["--corpus", "/nope"], "bug corpus not found: /nope"),
        (["--variant", "stock+fix"], "--variant stock+fix patches vLLM (chunked-local-fix)"),
        (["--variant", "nope"], "--variant nope: unknown"),
        (["--build", "/nope/bin/python"], "--build /nope/bin/python: no such wheel"),
        (["--jobs", TOO_MANY], f"--jobs {TOO_MANY}"),
        (["--jobs", "0"], "--jobs"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else None,
)
def test_bugs_bad_input(tmp_path, args, needle):
    proc = run("bugs", *args, "--results-dir", str(tmp_path / "results"))
    assert_one_line_error(proc, needle)
    assert not (tmp_path / "results").exists()


def test_a_malformed_bug_entry(tmp_path):
    text = (ROOT / "scenarios" / "bugs" / "57727.toml").read_text()
    bad = text.replace('since = "after-reset"', 'since = "later"').replace(
        '"../', f'"{ROOT}/scenarios/'
    )
    (tmp_path / "57727.toml").write_text(bad)
    assert_one_line_error(run("validate", str(tmp_path / "57727.toml")), "since 'later'")
    proc = run("bugs", "--corpus", str(tmp_path), "--dry-run")
    assert_one_line_error(proc, "since 'later' names no earlier step")


def test_bugs_dry_run_shows_expectations_and_reruns():
    proc = run("bugs", "--releases", "0.27.1,0.28.0", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "offload-check bugs --bug 51150 --releases 0.27.1,0.28.0" in proc.stdout
    assert "needs amx_tile" in proc.stdout or "amx-sigill" in proc.stdout


def test_sweep_busy_port(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        assert_one_line_error(
            run("sweep", "--releases", "latest", "--port", str(port), "--dry-run"),
            f"port {port} on 127.0.0.1 is busy",
        )


def test_python_option_errors():
    assert_one_line_error(
        run("roundtrip", "--python", "/nope", "--dry-run"),
        "--python /nope: no such interpreter or environment",
    )
    assert_one_line_error(
        run("roundtrip", "--python", ".venv-stock", "--variant", "current", "--dry-run"),
        "give --variant or --python, not both",
    )
    assert_one_line_error(
        run("crash-repro", "--python", "/nope/bin/python", "--dry-run"),
        "--python /nope/bin/python: no such interpreter",
    )


def test_python_option_is_an_adhoc_variant():
    """The interpreter is launched as a variant named after its environment, judged by the
    scenario's rules by version (0.27.1 crashes with the connector on)."""
    proc = run(
        "crash-repro", "--python", str(ROOT / ".venv-stock"), "--connector", "on",
        "--config", str(ROOT / "scenarios" / "models" / "llama4-small-chunk.json"), "--dry-run",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "llama4-small-chunk / .venv-stock / connector on expect crashed (#51150)" in proc.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--profile", "storm"], "unknown profile 'storm'"),
        (["--fault", "melt"], "unknown fault 'melt'"),
        (["--variant", "nope"], "unknown variant 'nope'"),
        (["--url", "http://127.0.0.1:9", "--fault", "no-load"], "--url attaches"),
        (["--scenario", "/nope.toml"], "scenario file not found: /nope.toml"),
        (["--profile", "multi-turn", "--tp", "3"], "--tp 3 does not divide"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else None,
)
def test_stress_bad_input(tmp_path, args, needle):
    proc = run("stress", *args, "--results-dir", str(tmp_path / "results"))
    assert_one_line_error(proc, needle)
    assert not (tmp_path / "results").exists()


def test_stress_unknown_key_in_a_profile_table(tmp_path):
    text = (
        (ROOT / "scenarios" / "stress.toml")
        .read_text()
        .replace("long_requests = 6", "long_reqs = 6")
    )
    path = tmp_path / "stress.toml"
    path.write_text(text.replace('"roundtrip-cpu.toml"', f'"{ROOT}/scenarios/roundtrip-cpu.toml"'))
    proc = run("stress", "--scenario", str(path), "--dry-run")
    assert_one_line_error(proc, "profiles.preemption.long_reqs: Extra inputs are not permitted")


def test_stress_dry_run_prints_the_plan_and_both_servers():
    proc = run("stress", "--profile", "preemption", "--seed", "3", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "profile preemption, seed 3, concurrency 4" in proc.stdout
    assert "requests: 6 (preemption 6)" in proc.stdout
    assert '"--enable-prompt-tokens-details"' in proc.stdout
    assert "reference argv:" in proc.stdout


@pytest.mark.parametrize("command", ["roundtrip", "stress"])
def test_url_refuses_what_only_a_launch_takes(tmp_path, command):
    """Both commands refuse a launch's options with --url alike, before anything runs."""
    proc = run(
        command, "--url", "http://127.0.0.1:9", "--tp", "2", "--patch", "chunked-local-fix",
        "--results-dir", str(tmp_path / "results"),
    )  # fmt: skip
    assert_one_line_error(
        proc,
        "--url attaches to a server someone else launched: --patch and --tp do not apply "
        "(they choose what a launch starts)",
    )
    assert not (tmp_path / "results").exists()


def test_json_and_label_are_checked_as_they_are_parsed(tmp_path):
    assert_one_line_error(run("sweep", "--releases", "latest", "--json"), "with --dry-run")
    assert_one_line_error(run("bench", "--label", "///"), "no letter or digit")
