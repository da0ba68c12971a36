"""Benchmarks: the harness's own overhead, as ratios measured side by side.

These machines are noisy (2 shared cores), so no absolute time means much; what is
reported is a ratio of two things measured in the same run, interleaved
(A B B A ...) so that drift in machine load falls on both sides alike.

crash-repro overhead: time to verdict through the harness (planning, interpreter
probes, model cache, launch, health polling) versus a bare
``python -m vllm.entrypoints.openai.api_server`` of the identical command line,
timed from launch to ``/health`` 200, or to process exit for a crashing build.

launch with bytecode vs without: the same server launched through the harness's
launcher with this tree's environment as it is, and with its bytecode hidden
(``PYTHONPYCACHEPREFIX`` naming an empty directory, so Python finds no ``.pyc`` and,
with ``PYTHONDONTWRITEBYTECODE``, writes none: exactly an environment uv installed
without ``--compile-bytecode``), interleaved, with each side's launch timeline.

the README's commands: ``offload-check crash-repro`` as a user runs it (a subprocess,
every row), timed to its exit, with its launch count and where the launches' time went.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.commands import crash_repro
from harness.commands import roundtrip as rt
from harness.commands.bench.copy import measure_host_copy
from harness.errors import HarnessError
from harness.scenario.crash_repro import CrashReproScenario
from harness.scenario.roundtrip import load_roundtrip
from harness.server.interpreters import probe
from harness.server.launch_timeline import phase_medians, shares
from harness.server.launcher import ServerSpec, _signal_group, free_port
from harness.server.server_lock import server_slot


@dataclass
class Case:
    name: str
    variant: str
    config: str
    connector: str
    harness_s: list[float] = field(default_factory=list)
    bare_s: list[float] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)
    # Harness time outside the server's own launch-to-verdict: planning, probes, model
    # cache, health-poll latency, teardown and log parsing. Immune to engine noise.
    overhead_s: list[float] = field(default_factory=list)
    target: float = 1.10

    @property
    def ratio(self) -> float:
        return statistics.median(self.harness_s) / statistics.median(self.bare_s)

    def record(self) -> dict[str, object]:
        return {
            "case": self.name,
            "variant": self.variant,
            "config": self.config,
            "connector": self.connector,
            "outcomes": ",".join(sorted(set(self.outcomes))),
            "harness_median_s": round(statistics.median(self.harness_s), 2),
            "bare_median_s": round(statistics.median(self.bare_s), 2),
            "harness_s": [round(x, 2) for x in self.harness_s],
            "bare_s": [round(x, 2) for x in self.bare_s],
            "harness_overhead_s": [round(x, 2) for x in self.overhead_s],
            "harness_overhead_median_s": round(statistics.median(self.overhead_s), 2),
            "ratio": round(self.ratio, 3),
            "target": self.target,
            "within_target": self.ratio < self.target,
        }


def _case_row(scenario: CrashReproScenario, case: Case) -> crash_repro.Row:
    """The case's one crash-repro row, planned and with its model built."""
    plan = crash_repro.plan_run(
        scenario,
        variant_names=[case.variant],
        configs=[case.config],
        connector_modes=[case.connector],
    )
    crash_repro.build_models(plan)
    return plan.rows[0]


def harness_time(
    scenario: CrashReproScenario, case: Case, log_dir: Path
) -> tuple[float, str, float]:
    """Wall time from 'run crash-repro for this row' to the row's verdict."""
    probe.cache_clear()  # pay the interpreter probe, as a fresh CLI run does
    t0 = time.perf_counter()
    row = _case_row(scenario, case)
    crash_repro.run_row(row, scenario, log_dir)
    total = row.verdict_at - t0
    return total, row.outcome, total - (row.seconds or 0.0)


def bare_time(row_plan: ServerSpec, log_path: Path, timeout_s: float) -> float:
    """The same argv launched by hand: time to /health 200, or to exit when it crashes."""
    port = free_port()
    env = {**os.environ, **row_plan.env}
    with server_slot(), log_path.open("wb") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            row_plan.argv(port),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        try:
            while time.perf_counter() - t0 < timeout_s:
                if proc.poll() is not None:
                    return time.perf_counter() - t0
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                        return time.perf_counter() - t0
                except OSError:
                    time.sleep(0.05)  # a tighter poll than the harness's: the bare floor
            raise TimeoutError(f"bare launch did not start within {timeout_s}s")
        finally:
            _signal_group(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()


def run_crash_repro_bench(
    scenario: CrashReproScenario,
    cases: list[Case],
    repeats: int,
    out_dir: Path,
    progress: Callable[[str], None] = print,
) -> list[Case]:
    log_dir = out_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    for case in cases:
        row_plan = _case_row(scenario, case).plan
        # One unmeasured launch first: the first start of an environment pays cold caches
        # (seen: 13 s more in config resolution), which would land on whichever side
        # happens to go first.
        bare_time(row_plan, log_dir / f"{case.name}-warmup.log", scenario.server.startup_timeout_s)
        progress(f"{case.name}: warm-up launch done")
        for i in range(repeats):
            # ABBA ordering: each side goes first equally often.
            order = ("harness", "bare") if i % 2 == 0 else ("bare", "harness")
            for side in order:
                if side == "harness":
                    seconds, outcome, overhead = harness_time(
                        scenario, case, log_dir / f"{case.name}-h{i}"
                    )
                    case.harness_s.append(seconds)
                    case.outcomes.append(outcome)
                    case.overhead_s.append(overhead)
                else:
                    seconds = bare_time(
                        row_plan,
                        log_dir / f"{case.name}-bare{i}.log",
                        scenario.server.startup_timeout_s,
                    )
                    case.bare_s.append(seconds)
                progress(f"{case.name} #{i + 1} {side}: {seconds:.1f}s")
    return cases


class _Silent:
    def status(self, message: str) -> None: ...
    def phase_done(self, phase: object) -> None: ...
    def request_done(self, completion: object) -> None: ...


def run_roundtrip_bench(scenario_path: Path, out_dir: Path) -> dict[str, Any]:
    """One clean round trip: filler efficiency and harness wall time vs engine work.

    The denominator is what no harness can avoid: the server's own start (launch to
    /health) plus the generation time of every request as the client saw it. The
    rest (planning, metric settling, teardown) is the harness's overhead.
    """
    t0 = time.perf_counter()
    plan = rt.plan_roundtrip(load_roundtrip(scenario_path))
    rt.build_local_model(plan)
    result = rt.execute_roundtrip(plan, out_dir, _Silent(), lambda _r: None)
    wall = time.perf_counter() - t0
    floor = (result.startup_seconds or 0.0) + result.generation_seconds
    moved = sum(p.delta.stored_bytes + p.delta.loaded_bytes for p in result.phases)
    return {
        "passed": result.passed,
        "bytes_moved": int(moved),
        "content_checked_blocks": result.content.checked if result.content else None,
        "pool_tokens": result.filler.pool_tokens if result.filler else None,
        "filler_tokens": result.filler.tokens if result.filler else 0,
        "filler_over_pool": result.filler.over_pool if result.filler else None,
        "filler_target": FILLER_TARGET,
        "wall_s": round(wall, 2),
        "startup_s": round(result.startup_seconds or 0.0, 2),
        "generation_s": round(result.generation_seconds, 2),
        "wall_over_engine": round(wall / floor, 3) if floor else None,
        "wall_target": WALL_TARGET,
    }


def launch_once(spec: ServerSpec, log_path: Path, timeout_s: float, prompt: str) -> dict[str, Any]:
    """One launch to the first answer and its stop, through the harness's launcher; its
    timeline (``harness.server.launch_timeline``) with ``health_s`` as the launch wall."""
    server = spec.server(log_path)
    with server:
        ready = server.wait_ready(timeout_s)
        if ready.state != "started":
            raise HarnessError(f"bench launch {ready.state} after {ready.seconds:.0f}s: {log_path}")
        server.request(
            "/v1/completions",
            {"model": spec.served_model_name, "prompt": prompt, "max_tokens": 4},
        )
    assert server.timeline is not None
    return server.timeline


def without_bytecode(spec: ServerSpec, empty_dir: Path) -> ServerSpec:
    """The same server with its environment's bytecode out of sight (module docstring)."""
    env = {**spec.env, "PYTHONPYCACHEPREFIX": str(empty_dir), "PYTHONDONTWRITEBYTECODE": "1"}
    return replace(spec, env=env)


def run_launch_bench(
    scenario: CrashReproScenario,
    config: str,
    repeats: int,
    out_dir: Path,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Median launch wall (spawn to /health) with bytecode / without, paired ABBA."""
    spec = _case_row(scenario, Case("launch", "current", config, "on")).plan
    log_dir = out_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    timeout = scenario.server.startup_timeout_s
    prompt = scenario.server.probe_prompt
    sides: dict[str, list[dict[str, Any]]] = {"bytecode": [], "no-bytecode": []}
    launch_once(spec, log_dir / "warmup.log", timeout, prompt)  # cold caches: neither side's
    progress("launch: warm-up launch done")
    for i in range(repeats):
        order = ("bytecode", "no-bytecode") if i % 2 == 0 else ("no-bytecode", "bytecode")
        for side in order:
            with tempfile.TemporaryDirectory(prefix="oc-nopyc-") as empty:
                run = spec if side == "bytecode" else without_bytecode(spec, Path(empty))
                timeline = launch_once(run, log_dir / f"{side}-{i}.log", timeout, prompt)
            sides[side].append(timeline)
            progress(f"launch #{i + 1} {side}: {timeline['health_s']:.1f}s to /health")
    walls = {k: [float(t["health_s"]) for t in v] for k, v in sides.items()}
    medians = {k: phase_medians(v) for k, v in sides.items()}
    return {
        "ratio": round(
            statistics.median(walls["bytecode"]) / statistics.median(walls["no-bytecode"]), 3
        ),
        "bytecode_s": walls["bytecode"],
        "no_bytecode_s": walls["no-bytecode"],
        "bytecode_median_s": round(statistics.median(walls["bytecode"]), 2),
        "no_bytecode_median_s": round(statistics.median(walls["no-bytecode"]), 2),
        "phases_median_s": medians,
        "phase_shares": {k: shares(v) for k, v in medians.items()},
    }


def run_commands_bench(out_dir: Path, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """``offload-check crash-repro`` as the README runs it: wall to exit, launches made,
    and the median phase shares of those launches (from its run.json)."""
    results = out_dir / "commands"
    results.mkdir(parents=True, exist_ok=True)
    progress("offload-check crash-repro (every row, as `make crash-repro` runs it) ...")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "crash-repro", "--results-dir", str(results)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    wall = time.perf_counter() - t0
    runs = sorted(results.glob("*-crash-repro-*/run.json"))
    meta = json.loads(runs[-1].read_text()) if runs else {}
    launches = meta.get("launches") or []
    medians = phase_medians(launches)
    rows = (meta.get("summary") or {}).get("rows")
    return {
        "command": "offload-check crash-repro",
        "exit_code": proc.returncode,
        "wall_s": round(wall, 1),
        "rows": rows,
        "launches": len(launches),
        "phases_median_s": medians,
        "phase_shares": shares(medians),
    }


# Targets of each figure: what the harness promises about its own cost.
LAUNCH_TARGET = 0.5  # launch wall with bytecode / without, at most
COPY_TARGET = 0.6  # host backend copy throughput / plain torch copy, at least
FILLER_TARGET = 1.5  # filler tokens / pool tokens, at most: eviction without waste
LEDGER_TARGET = 0.05  # the content ledger: at most 5% of a round trip (#39)
WALL_TARGET = 1.3  # round-trip wall / (server start + generation), at most


def _figure(name: str, value: Any, target: str, ok: bool, detail: Any) -> dict[str, Any]:
    return {"figure": name, "value": value, "target": target, "ok": ok, "detail": detail}


def run_bench(
    parts: set[str],
    repeats: int,
    crash_scenario: CrashReproScenario,
    roundtrip_scenario: Path,
    config: str,
    out_dir: Path,
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Every figure of ``offload-check bench`` (``parts``: copy, roundtrip, crash-repro),
    each a ratio measured side by side in this run, with its target and verdict."""
    figures: list[dict[str, Any]] = []
    if "launch" in parts:
        say("launch with bytecode vs the same launch without, paired ...")
        lb = run_launch_bench(crash_scenario, config, repeats, out_dir / "launch", progress=say)
        figures.append(
            _figure(
                "launch wall (spawn to /health): with bytecode / without",
                lb["ratio"],
                f"<= {LAUNCH_TARGET}",
                float(lb["ratio"]) <= LAUNCH_TARGET,
                lb,
            )
        )
    if "commands" in parts:
        cb = run_commands_bench(out_dir, progress=say)
        figures.append(
            _figure(
                f"time to verdict: {cb['command']} ({cb['launches']} launches, {cb['rows']} rows)",
                cb["wall_s"],
                "-",
                cb["exit_code"] == 0,
                cb,
            )
        )
    if "copy" in parts:
        say("host backend copy throughput vs plain torch copy ...")
        copy = measure_host_copy()
        ratio = float(copy["ratio"])
        figures.append(
            _figure(
                "host copy throughput / plain torch copy",
                copy["ratio"],
                f">= {COPY_TARGET}",
                ratio >= COPY_TARGET,
                copy,
            )
        )
    if "roundtrip" in parts:
        say("one clean round trip ...")
        rtb = run_roundtrip_bench(roundtrip_scenario, out_dir / "roundtrip")
        figures.append(
            _figure(
                "filler tokens / GPU pool tokens",
                rtb["filler_over_pool"],
                f"<= {FILLER_TARGET}",
                float(rtb["filler_over_pool"]) <= FILLER_TARGET,
                rtb,
            )
        )
        figures.append(
            _figure(
                "roundtrip wall / (server start + generation)",
                rtb["wall_over_engine"],
                f"<= {WALL_TARGET}",
                float(rtb["wall_over_engine"] or 99) <= WALL_TARGET,
                rtb,
            )
        )
        if "copy" in parts:
            # The ledger's cost per byte (the copy bench's paired sides) times the bytes
            # this round trip moved, over its wall: what the content check costs it.
            extra = max(0.0, float(copy["ledger_extra_s_per_gb"])) * rtb["bytes_moved"] / 1e9
            share = extra / float(rtb["wall_s"])
            figures.append(
                _figure(
                    "content ledger's cost / roundtrip wall",
                    round(share, 5),
                    f"<= {LEDGER_TARGET}",
                    share <= LEDGER_TARGET,
                    {
                        "ledger_extra_s": round(extra, 4),
                        "bytes_moved": rtb["bytes_moved"],
                        "ledger_over_worker": copy["ledger_over_worker"],
                        "wall_s": rtb["wall_s"],
                    },
                )
            )
    if "crash-repro" in parts:
        cases = [
            Case("start (current, connector on)", "current", config, "on"),
            Case("crash (stock, connector on)", "stock", config, "on"),
        ]
        run_crash_repro_bench(crash_scenario, cases, repeats, out_dir / "crash-repro", progress=say)
        for c in cases:
            rec = c.record()
            figures.append(
                _figure(
                    f"crash-repro time to verdict / bare launch: {c.name}",
                    rec["ratio"],
                    f"< {c.target:.2f}",
                    bool(rec["within_target"]),
                    rec,
                )
            )
            figures.append(
                _figure(
                    f"  harness seconds outside the server: {c.name}",
                    rec["harness_overhead_median_s"],
                    "-",
                    True,
                    rec,
                )
            )
    return figures
