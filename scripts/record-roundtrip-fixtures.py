"""Record real round-trip runs as small fixtures that unit tests replay through ``evaluate``.

    .venv/bin/python scripts/record-roundtrip-fixtures.py               # every case (~30 min)
    .venv/bin/python scripts/record-roundtrip-fixtures.py --case clean  # one case (repeatable)
    .venv/bin/python scripts/record-roundtrip-fixtures.py --list        # the cases and args

Why: the engine tests prove two things at once, that a seeded fault makes the engine
misbehave and that the checks turn that misbehaviour into the right verdict. The second
is pure logic over what the run measured, so it is proven here once per recorded run and
then re-proven in milliseconds by ``tests/unit/tools/test_replay.py`` on every change to the
checks, the metrics parser or the expected-figure rules.

Each case runs the real CLI (``offload-check roundtrip --results-dir <tmp> <args>``,
which queues on the harness's machine-wide server lock like every launch) and keeps, in
``tests/fixtures/replay/<case>/``, only what ``harness.tools.replay`` needs to rebuild the
result exactly as the run built it, plus the run's own verdict to compare with:

- ``metrics/{start,cold,warm,filler,replay}.prom``: the snapshots the phase deltas and
  the live pool come from, filtered to the metric families ``harness.server.metrics.parse``
  reads (every family named in ``metrics.COUNTERS``, deprecated twins included, and
  ``vllm:cache_config_info``): their ``# HELP``/``# TYPE`` lines and their samples,
  ``_created`` timestamps dropped. The filter is checked, not trusted: the script
  refuses to write a case whose filtered snapshot or pool parses differently from the
  raw one.
- ``requests.jsonl``: as the run wrote it (prompts are already shown as their length;
  text, token ids and logprobs are what ``replay-output-identical`` compares).
- ``server.log``: only the engine's ``offload-check kv-groups:`` report lines, the input
  of the ``kv-layout`` check (and of the engine's Mamba state size).
- ``run.json``: the run's ``argv``, ``plan`` (as ``RoundtripPlan.describe`` wrote it)
  and ``engine_kv_groups``: what the run planned, to compare the replay's plan with.
- ``phases.csv`` and ``checks.csv``: the run's own deltas and verdict, the oracles the
  replay must reproduce (a few KB).
- ``manifest.json``: case name, CLI args, vLLM version, recording date, exit code and
  the failing (non-informational) checks observed.

Machine-specific paths are rewritten in every kept file: the checkout becomes ``<repo>``,
the home directory's ``.cache`` becomes ``~/.cache``, the scratch results directory
``<results>``; a case still holding the home directory or the checkout path is refused.
A case is written only once it is complete (staged, then swapped in), so an interrupted
recording leaves the previous fixture of that case intact.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.server import metrics
from harness.server.kv_layout import REPORT_PREFIX

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / ".venv" / "bin" / "offload-check"
OUT = ROOT / "tests" / "fixtures" / "replay"
EDGE = "scenarios/roundtrip-window-edge.toml"
PROM_FILES = ("start", "cold", "warm", "filler", "replay")

# case -> extra CLI args of `offload-check roundtrip`. Paths are relative to the checkout
# (the CLI runs from it), so the args replay on any machine.
CASES: dict[str, list[str]] = {
    "clean": [],
    "fault-corrupt-load": ["--fault", "corrupt-load"],
    "fault-drop-store": ["--fault", "drop-store"],
    "fault-no-load": ["--fault", "no-load"],
    "fault-partial-store": ["--fault", "partial-store"],
    "fault-partial-load": ["--fault", "partial-load"],
    "patch-hits-minus-chunk": ["--patch", "hits-minus-chunk"],
    "filler-count-1": ["--filler-count", "1"],
    "window-edge-clean": ["--scenario", EDGE],
}

# The metric families harness.server.metrics.parse reads; everything else is dropped.
KEEP_FAMILIES = frozenset(
    {family for cands in metrics.COUNTERS.values() for family, _ in cands}
    | {"vllm:cache_config_info"}
)


def _family(sample_name: str) -> str:
    """A counter's samples (and, as prometheus_client writes them, its ``# HELP``/``# TYPE``
    lines) are named ``<family>_total`` (and ``_created``); a gauge's are bare."""
    for suffix in ("_total", "_created"):
        if sample_name.endswith(suffix) and sample_name[: -len(suffix)] in KEEP_FAMILIES:
            return sample_name[: -len(suffix)]
    return sample_name


def filter_prom(text: str) -> str:
    """Keep the parser's families only; deterministic (line order kept, nothing added)."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(maxsplit=3)
            if (
                len(parts) >= 3
                and parts[1] in ("HELP", "TYPE")
                and not parts[2].endswith("_created")
                and _family(parts[2]) in KEEP_FAMILIES
            ):
                out.append(line)
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name and not name.endswith("_created") and _family(name) in KEEP_FAMILIES:
            out.append(line)
    return "\n".join(out) + "\n"


def _lossless(raw: str, kept: str, where: str) -> None:
    """Refuse a filter that changes what evaluation reads (snapshot or pool)."""
    a, b = metrics.parse(raw), metrics.parse(kept)
    if a[0] != b[0] or a[1] != b[1]:
        raise SystemExit(
            f"{where}: the Prometheus filter changed the parsed snapshot or "
            f"pool:\n  raw  {a[0]} {a[1]}\n  kept {b[0]} {b[1]}"
        )


class Scrubber:
    """Rewrite machine-specific absolute paths; longest first so nested ones stay right."""

    def __init__(self, results: Path) -> None:
        home = Path.home()
        pairs = [
            (str(ROOT), "<repo>"),
            (str(home / ".cache"), "~/.cache"),
            (str(results), "<results>"),
        ]
        cache = os.environ.get("OFFLOAD_CHECK_CACHE")
        if cache:
            pairs.append((str(Path(cache).resolve()), "~/.cache/offload-check"))
        self.pairs = sorted(pairs, key=lambda p: -len(p[0]))
        self.forbidden = [str(ROOT), str(results)]
        if str(home) not in ("/", ""):
            self.forbidden.append(str(home) + "/")

    def __call__(self, text: str) -> str:
        for old, new in self.pairs:
            text = text.replace(old, new)
        return text

    def check(self, case_dir: Path) -> None:
        for path in case_dir.rglob("*"):
            if path.is_file():
                text = path.read_text()
                for bad in self.forbidden:
                    if bad in text:
                        raise SystemExit(f"{path}: still holds the machine path {bad!r}")


def failing_checks(checks_csv: Path) -> list[str]:
    with checks_csv.open(newline="") as fh:
        return sorted(
            r["name"]
            for r in csv.DictReader(fh)
            if r["passed"] != "True" and r.get("informational") != "True"
        )


def run_case(case: str, args: list[str], scratch: Path) -> tuple[int, Path, str]:
    results = Path(tempfile.mkdtemp(prefix=f"{case}-", dir=scratch))
    argv = [str(CLI), "roundtrip", "--results-dir", str(results), *args]
    print(f"[{case}] {' '.join(['offload-check', 'roundtrip', *args])}", flush=True)
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    runs = [p for p in results.iterdir() if p.is_dir()]
    if proc.returncode not in (0, 1) or len(runs) != 1 or not (runs[0] / "checks.csv").is_file():
        raise SystemExit(
            f"[{case}] the run did not finish with a verdict (exit "
            f"{proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.returncode, runs[0], proc.stdout


def keep(
    case: str, args: list[str], code: int, run: Path, stage: Path, scrub: Scrubber
) -> dict[str, Any]:
    (stage / "metrics").mkdir(parents=True)
    for name in PROM_FILES:
        raw = (run / "metrics" / f"{name}.prom").read_text()
        kept = scrub(filter_prom(raw))
        _lossless(raw, kept, f"[{case}] {name}.prom")
        (stage / "metrics" / f"{name}.prom").write_text(kept)
    for name in ("requests.jsonl", "phases.csv", "checks.csv"):
        (stage / name).write_text(scrub((run / name).read_text()))
    log = (run / "logs" / "server.log").read_text(errors="replace").splitlines()
    report = [ln for ln in log if REPORT_PREFIX in ln]
    if not report:
        raise SystemExit(f"[{case}] the server log holds no {REPORT_PREFIX!r} line")
    (stage / "server.log").write_text(scrub("\n".join(report) + "\n"))
    meta = json.loads((run / "run.json").read_text())
    trimmed = {
        "argv": meta.get("argv"),
        "plan": meta["plan"],
        "engine_kv_groups": meta.get("engine_kv_groups"),
    }
    (stage / "run.json").write_text(scrub(json.dumps(trimmed, indent=1, sort_keys=True)) + "\n")
    manifest = {
        "case": case,
        "cli_args": args,
        "command": ["offload-check", "roundtrip", "--results-dir", "<results>", *args],
        "vllm_version": meta["variant"]["vllm_version"],
        "vllm_dist": meta["variant"].get("vllm_dist"),
        "recorded_at": meta.get("started_at")
        or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "harness_git_revision": meta.get("git_revision"),
        "exit_code": code,
        "failing_checks": failing_checks(run / "checks.csv"),
    }
    (stage / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    scrub.check(stage)
    return manifest


def replay_agrees(case_dir: Path, observed: list[str]) -> bool:
    """The recorded case, re-evaluated offline, must reach the run's own verdict."""
    from harness.tools.replay import failing, replay

    got = sorted(failing(replay(case_dir)))
    if got != observed:
        print(f"  REPLAY DISAGREES: replayed {got}, the run observed {observed}", flush=True)
        return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument(
        "--case",
        action="append",
        choices=sorted(CASES),
        help="record only this case (repeatable; default: all)",
    )
    ap.add_argument("--out", type=Path, default=OUT, help="fixtures directory")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument(
        "--keep-runs",
        type=Path,
        default=None,
        help="write the full run directories here (default: a temporary "
        "directory, removed at the end)",
    )
    opts = ap.parse_args()
    if opts.list:
        for case, args in CASES.items():
            print(f"{case:24} {' '.join(args) or '(defaults)'}")
        return 0
    if not CLI.is_file():
        print(f"{CLI} is missing: run `make setup` first", file=sys.stderr)
        return 2
    opts.out.mkdir(parents=True, exist_ok=True)
    ok = True
    with tempfile.TemporaryDirectory(prefix="offload-check-fixtures-") as tmp:
        scratch = Path(tmp)
        if opts.keep_runs is not None:
            scratch = opts.keep_runs.resolve()
            scratch.mkdir(parents=True, exist_ok=True)
        for case in opts.case or list(CASES):
            args = CASES[case]
            code, run, _ = run_case(case, args, scratch)
            scrub = Scrubber(run.parent)
            stage = opts.out / f".{case}.staging"
            shutil.rmtree(stage, ignore_errors=True)
            manifest = keep(case, args, code, run, stage, scrub)
            final = opts.out / case
            shutil.rmtree(final, ignore_errors=True)
            stage.rename(final)
            print(f"  exit {code}; failing: {manifest['failing_checks'] or 'none'}", flush=True)
            ok = replay_agrees(final, manifest["failing_checks"]) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
