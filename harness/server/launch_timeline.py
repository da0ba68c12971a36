"""Where a vLLM launch spends its time: spawn to answer, phase by phase, from the log.

A launch is three Python processes started one after another by ``spawn`` (the API
server, then EngineCore, then one worker per rank), and each imports vLLM and torch
before it logs a line. So each process's *first* prefixed log line marks the end of
its start-up, and the gaps between them are what a user waits for: on a machine with
no bytecode most of a launch is those imports, not vLLM working (vLLM's own engine
init, which it logs as ``init engine ... took``, is about a second here).

The points come from the log's own timestamps (vLLM's logger prints whole seconds:
``INFO 12-01 13:46:25 [core.py:133]``, sometimes with a fraction), placed on the
harness's clock by the wall time of the spawn; ``/health`` and the first answer come
from the harness's clock. A whole-second stamp is read as the middle of its second,
so a point is within half a second of the truth (``resolution_s`` says which).

Standard library only: the launcher calls it for every server it stops.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

# "(APIServer pid=5919) INFO 12-01 13:45:58 [api_utils.py:347] ..."; prefixes may nest
# ("(APIServer pid=1) (Worker pid=2) "): the innermost names the writer.
_TAGS = re.compile(r"^((?:\([A-Za-z_][\w -]*?\s+pid=\d+\)\s*)+)")
_TAG = re.compile(r"\((?P<name>[A-Za-z_][\w -]*?)\s+pid=(?P<pid>\d+)\)")
_STAMP = re.compile(
    r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<md>\d\d-\d\d) "
    r"(?P<hms>\d\d:\d\d:\d\d)(?P<frac>\.\d+)? \["
)
_RANK = re.compile(r"\brank=(?P<rank>\d+)\b")
_INIT_DONE = "init engine (profile, create kv cache, warmup model) took"

# Phase names, in order; each is the time from the previous point to its own.
LAUNCH_PHASES = (
    ("api_server_start", "spawn to the API server's first log line (its imports)"),
    ("engine_core_start", "to EngineCore's first line (config, spawn, its imports)"),
    ("worker_start", "to the last worker's first line (spawn, its imports)"),
    ("engine_init", "to vLLM's 'init engine' line (model, KV cache, warm-up)"),
    ("api_ready", "to /health 200 (the API server finishing its start)"),
    ("first_answer", "to the first completion answered"),
)


@dataclass
class LogPoints:
    """Seconds after the spawn at which each process first spoke (None: never)."""

    api_server_s: float | None = None
    engine_core_s: float | None = None
    workers_s: list[float] = field(default_factory=list)  # by rank
    engine_init_s: float | None = None
    resolution_s: float = 0.0  # 1.0 when the log's stamps are whole seconds


def _role(name: str) -> str:
    if name.startswith("APIServer"):
        return "api"
    if "EngineCore" in name:
        return "core"
    if "Worker" in name:
        return "worker"
    return "other"


def log_points(lines: Iterable[str], spawned_wall: float) -> LogPoints:
    """The first timestamped line of each vLLM process, as seconds after the spawn.

    ``spawned_wall`` is ``time.time()`` at the spawn; vLLM stamps lines in local time
    without a year, which is taken from the spawn (a launch that crosses New Year's
    Eve is read as the same year, then corrected by a year).
    """
    spawn = datetime.fromtimestamp(spawned_wall)
    points = LogPoints()
    first: dict[tuple[str, str], float] = {}  # (role, pid) -> seconds
    ranks: dict[str, int] = {}  # worker pid -> rank it logged
    whole = True
    for raw in lines:
        tags = _TAGS.match(raw)
        if tags is None:
            continue
        inner = list(_TAG.finditer(tags.group(1)))[-1]
        rest = raw[tags.end() :]
        stamp = _STAMP.match(rest)
        if stamp is None:
            continue
        role, pid = _role(inner["name"]), inner["pid"]
        when = _seconds_after(spawn, stamp["md"], stamp["hms"], stamp["frac"])
        if when is None:
            continue
        whole = whole and not stamp["frac"]
        first.setdefault((role, pid), when)
        if role == "worker" and pid not in ranks and "parallel_state.py" in rest:
            rank = _RANK.search(rest)
            if rank:
                ranks[pid] = int(rank["rank"])
        if points.engine_init_s is None and _INIT_DONE in rest:
            points.engine_init_s = when
    api = [s for (r, _), s in first.items() if r == "api"]
    core = [s for (r, _), s in first.items() if r == "core"]
    points.api_server_s = min(api) if api else None
    points.engine_core_s = min(core) if core else None
    workers = [(ranks.get(pid, 1 << 20), s, pid) for (r, pid), s in first.items() if r == "worker"]
    points.workers_s = [s for _, s, _ in sorted(workers)]
    points.resolution_s = 1.0 if whole else 0.0
    return points


def _seconds_after(spawn: datetime, md: str, hms: str, frac: str | None) -> float | None:
    try:
        stamp = datetime.strptime(f"{spawn.year}-{md} {hms}", "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    if (stamp - spawn).days > 180:  # a December spawn read as next January's year, or back
        stamp = stamp.replace(year=spawn.year - 1)
    elif (spawn - stamp).days > 180:
        stamp = stamp.replace(year=spawn.year + 1)
    # A whole-second stamp means "some time in that second": its middle.
    offset = float(frac) if frac else 0.5
    return max(0.0, round((stamp - spawn).total_seconds() + offset, 2))


@dataclass
class LaunchTimeline:
    """One server's launch, spawn to stop, in seconds after the spawn."""

    log: str
    spawned_at: str  # local ISO time of the spawn
    ended: str  # "stopped" (the harness stopped it) | "exited" (it died on its own)
    api_server_s: float | None
    engine_core_s: float | None
    workers_s: list[float]
    engine_init_s: float | None
    health_s: float | None
    first_answer_s: float | None
    stopped_s: float | None  # when the last process was gone
    teardown_s: float | None  # from the stop request to that
    resolution_s: float
    cores: list[int] | None = None  # its lane's cores (--jobs); None: the whole machine

    def phases(self) -> dict[str, float | None]:
        """Each phase of ``LAUNCH_PHASES`` as a duration; None where a point is missing (a
        server that crashed before its worker spoke has no worker or init phase)."""
        points = [
            self.api_server_s,
            self.engine_core_s,
            max(self.workers_s) if self.workers_s else None,
            self.engine_init_s,
            self.health_s,
            self.first_answer_s,
        ]
        out: dict[str, float | None] = {}
        before: float | None = 0.0
        for (name, _), point in zip(LAUNCH_PHASES, points, strict=True):
            out[name] = (
                round(max(0.0, point - before), 2)
                if point is not None and before is not None
                else None
            )
            before = point
        return out

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "phases": self.phases()}


def build(
    lines: Iterable[str],
    *,
    log: str,
    spawned_wall: float,
    ended: str,
    health_s: float | None,
    first_answer_s: float | None,
    stopped_s: float | None,
    teardown_s: float | None,
    cores: Sequence[int] | None = None,
) -> LaunchTimeline:
    points = log_points(lines, spawned_wall)
    return LaunchTimeline(
        log=log,
        spawned_at=datetime.fromtimestamp(spawned_wall).isoformat(timespec="milliseconds"),
        ended=ended,
        api_server_s=points.api_server_s,
        engine_core_s=points.engine_core_s,
        workers_s=points.workers_s,
        engine_init_s=points.engine_init_s,
        health_s=_r(health_s),
        first_answer_s=_r(first_answer_s),
        stopped_s=_r(stopped_s),
        teardown_s=_r(teardown_s),
        resolution_s=points.resolution_s,
        cores=None if cores is None else list(cores),
    )


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def phase_medians(timelines: list[dict[str, Any]]) -> dict[str, float | None]:
    """The median of each phase over launch records (``record()``); None where no launch
    reached that phase."""
    out: dict[str, float | None] = {}
    for name, _ in LAUNCH_PHASES:
        values = [t["phases"][name] for t in timelines if t["phases"].get(name) is not None]
        out[name] = round(statistics.median(values), 2) if values else None
    return out


def shares(medians: dict[str, float | None]) -> dict[str, float]:
    """Each phase's share of the sum of the phases that happened."""
    total = sum(v for v in medians.values() if v is not None)
    return {k: round(v / total, 3) for k, v in medians.items() if v is not None and total}


def summary_line(launches: list[dict[str, Any]]) -> str:
    """One line for the end of a run: how many launches, the median to ``/health``, and
    each phase's share of the median launch; "" when the run launched nothing."""
    if not launches:
        return ""
    medians = phase_medians(launches)
    medians.pop("first_answer")  # the workload's, not the launch's
    parts = ", ".join(f"{k.replace('_', ' ')} {v:.0%}" for k, v in shares(medians).items())
    healthy = [float(t["health_s"]) for t in launches if t.get("health_s") is not None]
    to_health = f", median {statistics.median(healthy):.0f}s to /health" if healthy else ""
    return f"{len(launches)} launch{'es' if len(launches) != 1 else ''}{to_health} ({parts})"
