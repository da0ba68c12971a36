"""The GPU loan's staging and runs (scripts/gpu/), checked without a GPU or a download.

- ``runs.sh all`` with ``DRY=1``: every step's ``offload-check`` command goes through the
  real CLI with ``--dry-run`` and the device forced to ``cuda``, so every argument and
  scenario a loan would run is accepted here, and each step leaves the two files the
  device tool brings back;
- ``build-payload.sh --plan``: the part arithmetic keeps every call (one part, the
  checkout that travels with it) under the tool's 64 MiB less the margin, with as few
  parts as fit; refusals are one line, exit 2;
- the checkout it measures is what git says travels, and ``.gpu/`` is not part of it;
- ``keep.sh``: what a loan brought back (``<step>/summary.txt``, ``<step>/runs.tgz``) kept
  under ``results/gpu/<NAME>/<step>/`` small (run.json, tables, report, log tails; no
  metrics, charts, disk tier or whole logs), readable by ``offload-check report``, never
  over an earlier keep unless ``--force``; and ``results/gpu/`` tracked by git.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
GPU = ROOT / "scripts" / "gpu"
RUNS = GPU / "runs.sh"
BUILD = GPU / "build-payload.sh"
KEEP = GPU / "keep.sh"
MIB = 1 << 20
LIMIT = 64 * MIB
MARGIN = 4 * MIB
PAYLOAD_0_26_0 = 202_762_240  # make gpu-payload COMPRESS=gz, measured 2026-12-06
PAYLOAD_0_26_0_XZ = 166_021_120  # the default (xz), the same day
STEPS = ["seed", "crash", "long", "stress"]
LOAN_VLLM = "0.26.0"  # scripts/gpu/deps-vllm-0.26.0.txt: the newest pinning the image's torch


def run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env, check=False
    )


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_CHECK_")}
    for name in ("PARTS", "LIMIT_MIB", "MARGIN_MIB", "STEP_TIMEOUT", "DRY", "OUT"):
        env.pop(name, None)
    # The plans are read line by line: wide enough that rich never wraps one (under
    # xdist, or in a narrow terminal, the width is otherwise 80).
    env["COLUMNS"] = "200"
    env.update(extra)
    return env


# --- runs.sh -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dry_all(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("gpu-runs")
    out, work = tmp / "out", tmp / "work"
    env = clean_env(DRY="1", PYTHON=sys.executable, OUT=str(out), RUNS_WORK=str(work))
    proc = run(["bash", str(RUNS), "all"], env=env)
    return {"proc": proc, "out": out, "work": work}


def test_runs_all_plans_every_step(dry_all: dict[str, Any]) -> None:
    proc = dry_all["proc"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        r"steps: seed=0\(\d+s\) crash=0\(\d+s\) long=0\(\d+s\) stress=0\(\d+s\)", last
    )
    for step in STEPS:
        summary = (dry_all["out"] / step / "summary.txt").read_text()
        assert summary.startswith(f"step {step}: exit 0, "), summary
        assert "--dry-run" in summary and "device cuda" in summary
        assert "python " in summary and "vllm " in summary  # the versions line


def test_each_step_plans_what_a_loan_runs(dry_all: dict[str, Any]) -> None:
    """The plans the real CLI printed, step by step, on the CUDA path."""
    output = {s: (dry_all["work"] / s / "output.txt").read_text() for s in STEPS}
    seed = output["seed"]
    assert "roundtrip plan seed-replica" in seed and ", TP 1" in seed
    assert "expected: stored 245,366,784 B, loaded 245,366,784 B, external hits 1248 tokens" in seed
    assert "OFFLOAD_CHECK_PATCH=chunked-local-fix" in seed  # 0.26.0 has #51150
    crash = output["crash"]
    assert "scenario crash-repro-gpu: 4 rows, 3 launches" in crash
    for variant in ("gpu-0.26.0", "gpu-0.26.0+fix"):
        assert re.search(rf"variant {re.escape(variant)}: .* on cuda, offload backend vllm", crash)
    assert len(re.findall(r"^llama4-issue-51150 / ", crash, re.M)) == 4  # rows
    long = output["long"]
    assert "roundtrip plan long-context-1" in long and ", TP 1" in long
    assert "prompts cross attention_chunk_size 8192" in long
    stress = output["stress"]
    assert "stress plan stress" in stress and "reference argv" in stress


def test_runs_leaves_what_the_device_tool_brings_back(dry_all: dict[str, Any]) -> None:
    """At most 8 files, no more than 2 folders down: two a step."""
    out: Path = dry_all["out"]
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == sorted(f"{s}/{f}" for s in STEPS for f in ("runs.tgz", "summary.txt"))


def test_runs_refuses_an_unknown_step(tmp_path: Path) -> None:
    env = clean_env(DRY="1", PYTHON=sys.executable, OUT=str(tmp_path))
    proc = run(["bash", str(RUNS), "seed", "warmup"], env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "runs.sh: unknown step warmup (seed crash long stress or all)"
    ]
    assert not any(tmp_path.iterdir())  # refused before any step ran


def test_runs_takes_dry_or_rehearse_not_both(tmp_path: Path) -> None:
    env = clean_env(DRY="1", REHEARSE=sys.executable, PYTHON=sys.executable, OUT=str(tmp_path))
    proc = run(["bash", str(RUNS), "seed"], env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["runs.sh: DRY and REHEARSE: one or the other"]


def loan_vllm() -> str:
    """The loan's vLLM (0.26.0, the CUDA wheel) where ``make gpu-rehearse`` made it."""
    from harness.errors import HarnessError
    from harness.tools.gpu_rehearsal.nightly_release import nightly_env_python

    try:
        return nightly_env_python(release=LOAN_VLLM)
    except HarnessError as err:
        pytest.skip(f"{err}; `make gpu-rehearse` makes it")


def test_every_step_rehearses_on_the_loans_vllm(tmp_path: Path) -> None:
    """``REHEARSE``: each step's command line through vLLM 0.26.0's own parser, engine
    config and offloading scheduler side (its CPU platform standing in), the patch applied
    where the step asks for it: what a loan would launch, refused here if 0.26.0 would."""
    env = clean_env(
        REHEARSE=sys.executable, PYTHON=loan_vllm(), OUT=str(tmp_path / "out"),
        RUNS_WORK=str(tmp_path / "work"),
    )  # fmt: skip
    proc = run(["bash", str(RUNS), "all"], env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        r"steps: seed=0\(\d+s\) crash=0\(\d+s\) long=0\(\d+s\) stress=0\(\d+s\)", last
    )
    verdicts = [ln for ln in proc.stdout.splitlines() if re.match(r"(ok|REJECTED|MISMATCH) ", ln)]
    # seed 1, crash 4 (stock and +fix, connector on and off), long 1, stress 2
    assert len(verdicts) == 8 and all(v.startswith("ok ") for v in verdicts), verdicts
    patched = [v for v in verdicts if "patch chunked-local-fix applied" in v]
    through = [v for v in patched if "passed parse, engine-args, engine-config, offload;" in v]
    # seed, long, stress's server and the crash matrix's +fix row with the connector on
    assert len(through) == 4 and all("vLLM 0.26.0 on CpuPlatform" in v for v in through)


# --- build-payload.sh --plan ---------------------------------------------------------


def plan(payload: int, checkout: int | None = None, **env: str) -> dict[str, Any]:
    args = ["bash", str(BUILD), "--plan", str(payload)]
    if checkout is not None:
        args.append(str(checkout))
    proc = run(args, env=clean_env(**env))
    assert proc.returncode == 0, proc.stderr
    head, *parts = proc.stdout.strip().splitlines()
    fields = dict(kv.split("=") for kv in head.split()[1:])
    sizes = []
    for i, line in enumerate(parts):
        m = re.fullmatch(rf"part p{i} bytes=(\d+) call_bytes=(\d+)", line)
        assert m, line
        sizes.append((int(m[1]), int(m[2])))
    return {k: int(v) for k, v in fields.items()} | {"sizes": sizes}


@pytest.mark.parametrize(
    ("payload", "checkout"),
    [
        (PAYLOAD_0_26_0, None),  # the checkout as it is now
        (PAYLOAD_0_26_0, 4 * MIB),
        (PAYLOAD_0_26_0, 20 * MIB),  # a checkout grown by committed records: more parts
        (1000, 0),
        (56 * MIB - 4096, 4 * MIB),  # exactly one part's room
        (56 * MIB - 4095, 4 * MIB),  # one byte over it
    ],
)
def test_parts_and_checkout_stay_under_the_limit(payload: int, checkout: int | None) -> None:
    p = plan(payload, checkout)
    assert p["limit_bytes"] == LIMIT and p["margin_bytes"] == MARGIN
    if checkout is not None:
        assert p["checkout_bytes"] == checkout
    room = LIMIT - MARGIN - p["checkout_bytes"] - p["extra_bytes"]
    sizes = [size for size, _ in p["sizes"]]
    assert len(sizes) == p["parts"] == math.ceil(payload / room)  # as few as fit
    assert sum(sizes) == payload
    assert max(sizes) == p["part_bytes"] and max(sizes) - min(sizes) < len(sizes)  # balanced
    for size, call in p["sizes"]:
        assert call == size + p["checkout_bytes"]
        assert call + p["extra_bytes"] <= LIMIT - MARGIN  # payload.sha rides in the last


def test_the_real_payload_takes_four_parts_gzipped_and_three_as_xz() -> None:
    p = plan(PAYLOAD_0_26_0)
    assert p["parts"] == 4  # three would be 64.4 MiB each: over the limit with no checkout
    assert all(call < LIMIT - MARGIN for _, call in p["sizes"])
    p = plan(PAYLOAD_0_26_0_XZ)
    assert p["parts"] == 3 and all(call < LIMIT - MARGIN for _, call in p["sizes"])


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["1000", str(60 * MIB)], {}, "leaves no room for a part under 64 MiB with a 4 MiB margin"),
        ([str(PAYLOAD_0_26_0), str(4 * MIB)], {"PARTS": "3"}, "PARTS=3 gives parts of"),
        ([str(PAYLOAD_0_26_0), str(55 * MIB)], {}, "over 10"),
        ([str(PAYLOAD_0_26_0), "0"], {"PARTS": "0"}, "PARTS=0: not a positive count"),
        (["many"], {}, "usage: build-payload.sh --plan BYTES [CHECKOUT_BYTES]"),
    ],
)
def test_plan_refusals_are_one_line(args: list[str], env: dict[str, str], message: str) -> None:
    proc = run(["bash", str(BUILD), "--plan", *args], env=clean_env(**env))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("build-payload: ") and message in lines[0]


def test_limit_and_margin_are_knobs() -> None:
    p = plan(PAYLOAD_0_26_0, 0, MARGIN_MIB="8", LIMIT_MIB="32")
    assert p["limit_bytes"] == 32 * MIB and p["margin_bytes"] == 8 * MIB
    assert all(call + p["extra_bytes"] <= 24 * MIB for _, call in p["sizes"])


# --- what travels --------------------------------------------------------------------


def travelling_bytes() -> int:
    listed = run(["git", "ls-files", "-co", "--exclude-standard", "-z"]).stdout
    total = 0
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if path.is_symlink():
            total += len(os.readlink(path).encode())
        elif path.is_file():
            total += path.stat().st_size
    return total


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout"
)
def test_checkout_measured_is_what_travels() -> None:
    before = travelling_bytes()
    measured = plan(1000)["checkout_bytes"]
    after = travelling_bytes()
    # Others may write in the checkout meanwhile: the measure lies between the two.
    assert min(before, after) - MIB <= measured <= max(before, after) + MIB
    # The parts never travel unless carried.
    assert run(["git", "check-ignore", "-q", ".gpu/p0/part0"]).returncode == 0
    assert "/.gpu/" in (ROOT / ".gitignore").read_text().splitlines()


def test_make_gpu_payload_runs_the_script() -> None:
    if shutil.which("make") is None:
        pytest.skip("no make")
    proc = run(["make", "-n", "gpu-payload"])
    assert proc.returncode == 0, proc.stderr
    assert "VLLM=0.26.0 scripts/gpu/build-payload.sh" in proc.stdout
    assert "make gpu-payload" in run(["make", "--no-print-directory", "help"]).stdout


# --- keep.sh ---------------------------------------------------------------------------

FIXTURES = ROOT / "tests" / "fixtures" / "results"
SEED_RUN = "20261207-101112-gpu-seed-roundtrip-c9dc"
CRASH_RUN = "20261207-101530-gpu-crash-crash-repro-1904"
LONG_RUN = "20261207-102200-gpu-long-roundtrip-f56d"


def gpu_summary(step: str, run_id: str, gpu: str = "NVIDIA H200, 580.159.04") -> str:
    """A step's summary.txt as runs.sh writes it on a GPU machine."""
    return (
        f"step {step}: exit 0, 187 s wall\n"
        f"command: offload-check roundtrip --tp 1 --results-dir /tmp/gpu-runs/{step}/runs"
        f" --label gpu-{step}\n"
        "date: 2026-12-07T10:11:12Z host: gpu-host\n"
        f"name, driver_version\n{gpu}\n"
        "python 3.12.3 (/usr/bin/python3) torch 2.11.0+cu130 vllm 0.26.0 typer 0.29.2\n"
        f"run {run_id}: status finished exit 0\n"
    )


def lines(prefix: str, n: int) -> str:
    return "".join(f"{prefix} line {i}\n" for i in range(1, n + 1))


def gpu_run(src: str, dst: Path, logs: dict[str, int], requests_bytes: int) -> None:
    """A recorded run directory made into what a GPU run leaves: run.json on cuda, the
    tables, a report, requests, server logs of ``logs`` lines, and what keep.sh leaves
    out (metrics, a chart, a disk tier)."""
    shutil.copytree(FIXTURES / src, dst)
    meta = json.loads((dst / "run.json").read_text())
    meta["platform"]["gpu_driver"] = "580.159.04"
    if "variant" in meta:
        meta["variant"].update(device="cuda", gpus=["NVIDIA H200"], torch="2.11.0+cu130")
    (dst / "run.json").write_text(json.dumps(meta, indent=2))
    (dst / "report.md").write_text(f"# {meta['command']}\n\nall checks as expected\n")
    line = json.dumps({"id": "r0", "output": list(range(40))}) + "\n"
    (dst / "requests.jsonl").write_text(line * (requests_bytes // len(line) + 1))
    (dst / "logs").mkdir()
    for name, n in logs.items():
        (dst / "logs" / name).write_text(lines(name, n))
    (dst / "metrics").mkdir()
    (dst / "metrics" / "cold.prom").write_text("vllm:kv_offload_store_bytes 1\n" * 5000)
    (dst / "phases.png").write_bytes(b"\x89PNG" + b"\0" * 4000)
    (dst / "disk-tier").mkdir()
    (dst / "disk-tier" / "chunk-0.bin").write_bytes(os.urandom(64 << 10))


def files_at(tmp: Path) -> Path:
    """What the device tool brings back of ``runs.sh seed crash long``: per step its
    summary.txt and runs.tgz (run directories, output.txt, summary.txt)."""
    out = tmp / "files_at"
    plan = {
        "seed": (SEED_RUN, "20261130-070140-roundtrip-c9dc", {"server.log": 1000}, 20_000, 1000),
        "crash": (
            CRASH_RUN,
            "20261130-065547-crash-repro-1904",
            {"launch-1.log": 450, "launch-2.log": 120, "launch-3.log": 300},
            0,
            60,
        ),
        # requests.jsonl of 1.2 MiB: left out
        "long": (LONG_RUN, "20261130-070852-roundtrip-f56d", {"server.log": 301}, 1_250_000, 400),
    }
    for step, (run_id, src, logs, requests_bytes, output_lines) in plan.items():
        work = tmp / "work" / step
        gpu_run(src, work / "runs" / run_id, logs, requests_bytes)
        if not requests_bytes:
            (work / "runs" / run_id / "requests.jsonl").unlink()
        (work / "output.txt").write_text(lines("output", output_lines))
        (work / "summary.txt").write_text(gpu_summary(step, run_id))
        (out / step).mkdir(parents=True)
        shutil.copy(work / "summary.txt", out / step / "summary.txt")
        with tarfile.open(out / step / "runs.tgz", "w:gz") as tgz:
            for name in ("runs", "output.txt", "summary.txt"):
                tgz.add(work / name, arcname=name)
    return out


def keep(*args: str | Path, root: Path) -> subprocess.CompletedProcess[str]:
    root.mkdir(parents=True, exist_ok=True)
    return run(["bash", str(KEEP), *map(str, args)], env=clean_env(KEEP_ROOT=str(root)))


def loans(base: Path) -> list[str]:
    """The loans kept under results/gpu/ (its marker file aside)."""
    return sorted(p.name for p in base.iterdir() if p.is_dir())


def tree(path: Path) -> list[str]:
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("gpu-keep")
    root = tmp / "repo"  # stands for the checkout: the real one is never written
    fa = files_at(tmp)
    proc = keep(fa, root=root)
    return {"proc": proc, "files_at": fa, "root": root, "base": root / "results" / "gpu"}


def test_keep_names_the_loan_by_date_and_gpu(kept: dict[str, Any]) -> None:
    proc = kept["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert loans(kept["base"]) == ["20261207-nvidia-h200"]
    last = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        r"kept 3 step\(s\) in results/gpu/20261207-nvidia-h200: 26 files, \d+ B", last
    )


def test_keep_marks_the_records_so_a_ci_summary_passes_over_them(
    kept: dict[str, Any], tmp_path: Path
) -> None:
    """results/gpu/ holds runs of earlier loans: ``python -m harness.ui.summary results/*``
    (every CI job's summary step) renders this job's runs and says nothing of them."""
    from harness.names import RECORDS_MARKER
    from harness.ui import summary

    assert (kept["base"] / RECORDS_MARKER).is_file()
    assert (ROOT / "results" / "gpu" / RECORDS_MARKER).is_file()  # the tracked folder's
    job_run = tmp_path / "20261207-000000-roundtrip-abcd"
    shutil.copytree(kept["base"] / "20261207-nvidia-h200" / "seed" / "runs" / SEED_RUN, job_run)
    runs, notes = summary._expand([kept["base"], job_run])
    assert runs == [job_run] and notes == []
    (kept["base"] / RECORDS_MARKER).rename(tmp_path / "moved")  # without it: named
    try:
        assert summary._expand([kept["base"]])[1] == [
            f"- skipped `{kept['base']}`: no `run.json`, not a run directory"
        ]
    finally:
        (tmp_path / "moved").rename(kept["base"] / RECORDS_MARKER)


def test_keep_keeps_what_report_needs_and_nothing_else(kept: dict[str, Any]) -> None:
    base: Path = kept["base"] / "20261207-nvidia-h200"
    tables = {"seed": ["checks.csv", "phases.csv"], "crash": ["outcomes.csv"]}
    tables["long"] = tables["seed"]
    logs = {
        "seed": ["server.log"],
        "crash": ["launch-1.log", "launch-2.log", "launch-3.log"],
        "long": ["server.log"],
    }
    runs = {"seed": SEED_RUN, "crash": CRASH_RUN, "long": LONG_RUN}
    for step, run_id in runs.items():
        in_run = ["junit.xml", "report.md", "run.json", *tables[step]]
        in_run += [f"logs/{log}.tail" for log in logs[step]]
        if step == "seed":
            in_run.append("requests.jsonl")  # crash has none, long's is over 1 MiB
        expected = ["output.txt", "summary.txt", *(f"runs/{run_id}/{f}" for f in in_run)]
        assert tree(base / step) == sorted(expected), step
        # The tables and run.json as the run wrote them.
        src = kept["files_at"].parent / "work" / step / "runs" / run_id
        for name in ("run.json", *tables[step]):
            assert (base / step / "runs" / run_id / name).read_bytes() == (src / name).read_bytes()
    assert "runs/" + LONG_RUN + "/requests.jsonl left out" in kept["proc"].stdout


def test_keep_cuts_logs_and_output(kept: dict[str, Any]) -> None:
    base: Path = kept["base"] / "20261207-nvidia-h200"
    tail = (base / "seed" / "runs" / SEED_RUN / "logs" / "server.log.tail").read_text()
    head, *rest = tail.splitlines()
    assert head == "[keep.sh: the last 300 of 1000 lines of logs/server.log]"
    assert rest == [f"server.log line {i}" for i in range(701, 1001)]
    # 300 lines or fewer: whole, no header
    crash = base / "crash" / "runs" / CRASH_RUN / "logs"
    assert (crash / "launch-3.log.tail").read_text() == lines("launch-3.log", 300)
    assert (crash / "launch-2.log.tail").read_text() == lines("launch-2.log", 120)
    assert (crash / "launch-1.log.tail").read_text().splitlines()[1] == "launch-1.log line 151"
    long_tail = base / "long" / "runs" / LONG_RUN / "logs" / "server.log.tail"
    assert len(long_tail.read_text().splitlines()) == 301  # 301 lines: the header and 300
    output = (base / "seed" / "output.txt").read_text().splitlines()
    assert output[0] == "[keep.sh: the last 400 of 1000 lines of output.txt]"
    assert output[1:] == [f"output line {i}" for i in range(601, 1001)]
    assert (base / "long" / "output.txt").read_text() == lines("output", 400)
    assert (base / "seed" / "summary.txt").read_text().startswith("step seed: exit 0")


def test_kept_steps_are_small(kept: dict[str, Any]) -> None:
    """Each step well under 1 MiB, as printed (the fixture's seed run: ~31 kB)."""
    base: Path = kept["base"] / "20261207-nvidia-h200"
    for step in ("seed", "crash", "long"):
        size = sum(p.stat().st_size for p in (base / step).rglob("*") if p.is_file())
        assert size < 256 << 10, (step, size)
        assert re.search(rf"^kept {step}: \d+ files, {size} B$", kept["proc"].stdout, re.M)


def test_report_reads_a_kept_run(kept: dict[str, Any]) -> None:
    base: Path = kept["base"] / "20261207-nvidia-h200"
    exe = Path(sys.executable).with_name("offload-check")
    if not exe.exists():
        pytest.skip("no offload-check beside the interpreter")
    for step, run_id, table in (("seed", SEED_RUN, "checks"), ("crash", CRASH_RUN, "| outcome ")):
        run_dir = base / step / "runs" / run_id
        proc = run([str(exe), "report", str(run_dir)], env=clean_env())
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"{run_dir}: status finished, exit code" in proc.stdout
        assert table in proc.stdout
        as_json = json.loads(run([str(exe), "report", "--json", str(run_dir)]).stdout)
        assert as_json["tables"], step


def test_keep_refuses_to_overwrite_unless_forced(tmp_path: Path) -> None:
    fa = files_at(tmp_path)
    root = tmp_path / "repo"
    assert keep(fa, "loan-1", root=root).returncode == 0
    kept_run = root / "results" / "gpu" / "loan-1" / "seed" / "runs" / SEED_RUN / "run.json"
    kept_run.write_text("{}")
    again = keep(fa, "loan-1", root=root)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        "keep.sh: results/gpu/loan-1/crash exists (--force replaces it)"
    ]
    assert kept_run.read_text() == "{}"  # nothing written
    forced = keep("--force", fa, "loan-1", root=root)
    assert forced.returncode == 0, forced.stderr
    assert json.loads(kept_run.read_text())["platform"]["gpu_driver"] == "580.159.04"
    assert loans(root / "results" / "gpu") == ["loan-1"]
    assert not list((root / "results" / "gpu" / "loan-1").glob(".keep-*"))  # no scratch left


@pytest.mark.parametrize(
    ("gpu", "name"),
    [
        ("NVIDIA H200, 580.159.04", "20261207-nvidia-h200"),
        (
            "NVIDIA H100 80GB HBM3, 580.159.04\nNVIDIA H100 80GB HBM3, 580.159.04",
            "20261207-nvidia-h100-80gb-hbm3",
        ),
    ],
)
def test_keep_slugs_the_gpu(tmp_path: Path, gpu: str, name: str) -> None:
    (tmp_path / "fa" / "seed").mkdir(parents=True)
    (tmp_path / "fa" / "seed" / "summary.txt").write_text(gpu_summary("seed", "x", gpu))
    with tarfile.open(tmp_path / "fa" / "seed" / "runs.tgz", "w:gz") as tgz:
        tgz.add(tmp_path / "fa" / "seed" / "summary.txt", arcname="summary.txt")
    proc = keep(tmp_path / "fa", root=tmp_path / "repo")
    assert proc.returncode == 0, proc.stderr
    assert tree(tmp_path / "repo" / "results" / "gpu") == [
        ".offload-check-records",
        f"{name}/seed/summary.txt",
    ]
    assert "(no run directory in runs.tgz" in proc.stdout


def test_keep_takes_what_runs_sh_leaves(dry_all: dict[str, Any], tmp_path: Path) -> None:
    """runs.sh's own archives (DRY: no run directory, no GPU): summary and output kept."""
    proc = keep(dry_all["out"], root=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (name,) = loans(tmp_path / "results" / "gpu")
    assert re.fullmatch(r"\d{8}-(no-gpu|nvidia-.+)", name)
    for step in STEPS:
        kept_step = tmp_path / "results" / "gpu" / name / step
        assert tree(kept_step) == ["output.txt", "summary.txt"]
        assert (kept_step / "summary.txt").read_text().startswith(f"step {step}: exit 0, ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["{tmp}/nowhere"],
            "keep.sh: {tmp}/nowhere: no such directory (the device tool's files_at)",
        ),
        (["{tmp}"], "keep.sh: {tmp} holds no <step>/runs.tgz (what runs.sh leaves)"),
        ([], "keep.sh: usage: keep.sh [--force] FILES_AT [NAME]"),
        (["{tmp}", "a/../b"], "keep.sh: NAME a/../b: only letters, digits, '.', '_' and '-'"),
        (["--overwrite", "{tmp}"], "keep.sh: unknown option --overwrite"),
    ],
)
def test_keep_refusals_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    root = tmp_path / "repo"
    proc = keep(*(a.format(tmp=tmp_path) for a in args), root=root)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(message.format(tmp=tmp_path)), line
    assert not any(root.iterdir())


def test_a_bad_archive_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    fa = files_at(tmp_path)
    (fa / "zzz").mkdir()
    (fa / "zzz" / "runs.tgz").write_bytes(b"not a tarball")
    proc = keep(fa, root=tmp_path / "repo")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"keep.sh: {fa}/zzz/runs.tgz: not a readable .tgz"]
    assert not (tmp_path / "repo" / "results").exists()


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout"
)
def test_kept_records_are_tracked() -> None:
    """results/gpu/ is not ignored; other run outputs still are."""
    assert run(["git", "check-ignore", "-q", "results/gpu/x/seed/runs/r/run.json"]).returncode == 1
    for ignored in ("results/other/run.json", "results/gpu-runs/seed/runs.tgz"):
        assert run(["git", "check-ignore", "-q", ignored]).returncode == 0, ignored
