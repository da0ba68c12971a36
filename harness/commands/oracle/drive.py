"""The drive engine: every drive cell's sequence through vLLM's real scheduler in one
process of the build's interpreter (``harness.engine.oracle_drive``), each request
judged against the model as its line arrives.

One process serves every cell: importing vLLM is most of a drive's time (8-20 s here),
the sequences seconds. Its stdout is JSON lines; its stderr (vLLM's logging) is kept in
the run directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from harness.commands.oracle.judge import CellResult, Judged, Moved, Observed, judge
from harness.commands.oracle.plan import DRIVE_MODULE, Cell
from harness.errors import RuntimeFailure
from harness.names import ENV_PATCH, GAUGE_CPU_USAGE, PATCH_NONE, REPO_ROOT
from harness.oracle.scheduler import Layout, Offloader, Request, Served
from harness.oracle.workload import Step

STATS_ASYNC = "vllm:kv_offload_lookup_async_delay_seconds_count"
STATS_ALLOCATED = "vllm:kv_offload_cpu_allocation_size_sum"


def drive_env(patch: str | None = None) -> dict[str, str]:
    """The drive's environment: the checkout importable, a small CPU KV space, and the
    seeded fault it applies to vLLM after importing it (``harness.engine.patches``)."""
    path = os.environ.get("PYTHONPATH", "")
    return {
        **os.environ,
        "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{path}" if path else str(REPO_ROOT),
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        ENV_PATCH: patch or PATCH_NONE,
    }


def layout_for(cell: Cell, settings: dict[str, Any]) -> Layout:
    """The model's layout for a drive cell, with the retention interval the release
    really used (it has none before 0.30: ``absent``)."""
    ri = settings.get("retention_interval", 0)
    lay = cell.layout
    return Layout(
        lay.groups,
        lay.blocks_per_chunk,
        lay.offload_prompt_only,
        None if ri == "absent" else ri,
        lay.max_batched_tokens,
        int(settings.get("hash_block_size") or 0),
    )


def request_of(step: Step) -> Request:
    return Request(
        step.request,
        step.tokens,
        step.max_tokens,
        step.max_load_tokens,
        abort_after=step.abort_after,
        reset_after=step.reset_after,
    )


def observed_from(line: dict[str, Any], *, overlap: bool, tier: bool = True) -> Observed:
    """A drive line as an observation (the stats the connector gave over the request).
    ``tier``: the line carries the tier's stats (a wave's come once, on its last line)."""
    if "raised" in line:
        frame = line.get("frame") or "no vLLM frame"
        return Observed(str(line.get("request")), raised=f"{line['raised']} at {frame}")
    stats = line.get("stats") or {}
    sources = line.get("sources")
    return Observed(
        str(line["request"]),
        hit=int(line["hit"]),
        loads=[Moved.of(m) for m in line["loads"]],
        stores=[Moved.of(m) for m in line["stores"]],
        host_tokens=None if sources is None else float(sum(s.get("host", 0) for s in sources)),
        allocated_chunks=float(stats.get(STATS_ALLOCATED, 0.0)) if tier else None,
        # With requests overlapping, stores are still in flight at a request's end and a
        # later lookup may wait on them: the tier is not idle, a wait not a deferral.
        usage_after=None if overlap or not tier else float(stats.get(GAUGE_CPU_USAGE, 0.0)),
        async_lookups=None if overlap or not tier else float(stats.get(STATS_ASYNC, 0.0)),
        content_errors=list(line.get("content_errors") or []),
        gauges=line.get("gauges") if tier else None,
        generated=[int(t) for t in line.get("generated") or []],
        wave_figures=frozenset({"allocated_chunks", "async_lookups"})
        if "wave_stats" in line
        else frozenset(),
    )


def judge_lines(
    cell: Cell, lines: Sequence[dict[str, Any]], settings: dict[str, Any]
) -> list[Judged]:
    """A sequence's lines (its steps, in order) judged against a fresh model."""
    model = Offloader(layout_for(cell, settings), cell.deviations)
    out: list[Judged] = []
    wave: list[Served] = []  # the wave's requests so far, as the model serves them
    for line in lines:
        index = int(line["step"])
        step = cell.steps[index]
        if line.get("reset"):
            if line.get("tier", True):  # a release that cannot reset its tier keeps it
                model.reset()
            continue
        last = _last_of_wave(cell.steps, index)
        obs = observed_from(line, overlap=cell.mode.overlap, tier=last)
        req = request_of(step)
        if line.get("reset_kept_tier"):
            req = replace(req, reset_after=None)
        if not settings.get("max_load_tokens", True):
            req = replace(req, max_load_tokens=None)
        served = None if obs.raised else model.serve(req, obs.generated)
        if step.wave is not None and served is not None:
            wave.append(served)
        out.append(
            judge(
                index,
                step.why,
                served,
                obs,
                deferring=cell.mode.defer_lookups > 0,
                wave=wave if step.wave is not None else (),
            )
        )
        if last:
            wave = []
    return out


def _last_of_wave(steps: Sequence[Step], index: int) -> bool:
    """Whether the step ends what is served together (a request alone ends itself)."""
    wave = steps[index].wave
    return wave is None or index + 1 >= len(steps) or steps[index + 1].wave != wave


def _read(stream: IO[str]) -> Iterator[dict[str, Any]]:
    for raw in stream:
        raw = raw.strip()
        if raw.startswith("{"):
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                yield value


def run_drive(
    python: str,
    cells: Sequence[Cell],
    out_dir: Path,
    on_result: Callable[[CellResult], None],
    status: Callable[[str], None] = lambda _: None,
    timeout_s: float = 1800.0,
    fail_fast: bool = False,
    patch: str | None = None,
) -> list[CellResult]:
    """Every cell's sequence in one drive process; each cell's result handed to
    ``on_result`` when its sequence ends. ``fail_fast``: stop at the first cell that
    does not pass (the rest are not run)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    seq_file = out_dir / "sequences.json"
    seq_file.write_text(json.dumps({"sequences": [c.drive_sequence() for c in cells]}))
    results = [CellResult(c.name, expected_failing=c.failing_checks) for c in cells]
    pending: list[list[dict[str, Any]]] = [[] for _ in cells]
    t0 = time.monotonic()
    status(f"oracle drive: {len(cells)} sequences through vLLM's scheduler (no server)")
    with (out_dir / "drive.stderr").open("w") as err, (out_dir / "drive.jsonl").open("w") as log:
        proc = subprocess.Popen(
            [python, "-m", DRIVE_MODULE, str(seq_file)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=drive_env(patch),
            cwd=str(REPO_ROOT),
        )
        assert proc.stdout is not None
        version = ""
        try:
            for line in _read(proc.stdout):
                log.write(json.dumps(line) + "\n")
                if "vllm_version" in line and "sequence" not in line:
                    version = str(line["vllm_version"])
                    status(f"oracle drive: vLLM {version} imported ({line.get('import_s')} s)")
                    if line.get("patch"):
                        status(f"oracle drive: {line['patch']}")
                    continue
                i = int(line.get("sequence", -1))
                if not 0 <= i < len(cells):
                    continue
                res = results[i]
                res.vllm_version = version
                if line.get("summary"):
                    if line.get("error"):
                        res.error = f"the drive could not set up: {line['error']}"
                    else:
                        res.requests = judge_lines(cells[i], pending[i], line["settings"])
                    res.seconds = float(line.get("wall_s") or 0.0)
                    res.finished = True
                    on_result(res)
                    if fail_fast and not res.passed:
                        break
                    continue
                pending[i].append(line)
                if time.monotonic() - t0 > timeout_s:
                    raise RuntimeFailure(f"the oracle drive ran past {timeout_s:g} s")
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    stopped = fail_fast and any((r.requests and not r.passed) or r.error for r in results)
    missing = [r for r in results if not r.requests and not r.error]
    if stopped:
        return [r for r in results if r not in missing]
    for r in missing:
        r.error = f"the drive ended (exit {proc.returncode}) before this sequence: {_tail(out_dir)}"
        r.finished = True
        on_result(r)
    return results


def _tail(out_dir: Path) -> str:
    text = (out_dir / "drive.stderr").read_text(errors="replace").strip().splitlines()
    return text[-1][:300] if text else "no output"
