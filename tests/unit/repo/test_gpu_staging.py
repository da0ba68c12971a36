"""The GPU loan's staging and runs (scripts/gpu/), checked without a GPU or a download.

- ``runs.sh all`` with ``DRY=1``: every step's ``offload-check`` command goes through the
  real CLI with ``--dry-run`` and the device forced to ``cuda``, so every argument and
  scenario a loan would run is accepted here, and each step leaves the two files the
  device tool brings back;
- ``build-payload.sh --plan``: the part arithmetic keeps every call (one part, the
  checkout that travels with it) under the tool's 64 MiB less the margin, with as few
  parts as fit; refusals are one line, exit 2;
- the checkout it measures is what git says travels, and ``.gpu/`` is not part of it.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
GPU = ROOT / "scripts" / "gpu"
RUNS = GPU / "runs.sh"
BUILD = GPU / "build-payload.sh"
MIB = 1 << 20
LIMIT = 64 * MIB
MARGIN = 4 * MIB
# vLLM 0.26.0's payload as `make gpu-payload` built it on 2026-12-06.
PAYLOAD_0_26_0 = 202_762_240
STEPS = ["seed", "crash", "long", "stress"]


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


def test_the_real_payload_takes_four_parts_with_margin() -> None:
    p = plan(PAYLOAD_0_26_0)
    assert p["parts"] == 4  # three would be 64.4 MiB each: over the limit with no checkout
    assert all(call < LIMIT - MARGIN for _, call in p["sizes"])


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
