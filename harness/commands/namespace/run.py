"""Running a namespace matrix: per build, one server writes the targets' KV through the
CPU tier to disk and stops cleanly; then, one at a time, a restarted server per change
reads its own copy of that directory: the replay first (a fresh server: every hit is the
disk's), then the clean-cache control and the noise pass under a cache salt."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from harness.commands.namespace.changes import UNCHANGED, Change, Known
from harness.commands.namespace.judge import (
    ENGINE_FAILED,
    KEPT,
    NOT_RUNNABLE,
    NOT_STARTED,
    Row,
    Served,
    judge,
)
from harness.commands.namespace.plan import (
    MODEL_LINK,
    BuildPlan,
    NamespacePlan,
    Reader,
    for_build,
    weights_dir,
)
from harness.commands.roundtrip.plan import RoundtripPlan
from harness.commands.roundtrip.run import (
    Endpoint,
    EngineFailure,
    StartupFailure,
    Status,
)
from harness.commands.roundtrip.run import (
    start_server as start,
)
from harness.errors import RuntimeFailure
from harness.scenario.rules import version_matches
from harness.server.workload import Completion

# The clean-cache control's salt: any value changes every block hash of a request.
CONTROL_SALT = "offload-check-namespace-control"


class NamespaceReporter(Status, Protocol):
    def row_done(self, row: Row) -> None: ...


def execute_namespace(
    plan: NamespacePlan,
    run_dir: Path,
    reporter: NamespaceReporter,
    on_rows: Callable[[list[Row]], None],
    port: int | None = None,
) -> list[Row]:
    """Every build's writer and readers, one server at a time; ``on_rows`` after each
    row, so a run cut short keeps what it judged."""
    rows: list[Row] = []

    def done(row: Row) -> None:
        rows.append(row)
        reporter.row_done(row)
        on_rows(rows)

    for build in plan.builds:
        run_build(build, run_dir / build.slug, reporter, done, port)
    return rows


def run_build(
    build: BuildPlan,
    build_dir: Path,
    reporter: NamespaceReporter,
    done: Callable[[Row], None],
    port: int | None,
) -> None:
    (build_dir / "logs").mkdir(parents=True, exist_ok=True)
    written = build_dir / "written"
    writer = for_build(build.writer, build_dir, written)
    expected = writer.expected.hit_tokens
    _point(build_dir, weights_dir(writer))
    try:
        cold = _write(writer, build_dir, reporter, build.label, port)
    except (StartupFailure, EngineFailure, RuntimeFailure) as err:
        outcome = NOT_STARTED if isinstance(err, StartupFailure) else ENGINE_FAILED
        for r in build.readers:
            done(_row(build, r, expected, outcome, False, f"the writing server: {err}"))
        return
    for reader in build.readers:
        if reader.plan is None:
            done(_row(build, reader, expected, NOT_RUNNABLE, None, reader.skipped))
            continue
        tier = build_dir / "tiers" / reader.change.name
        shutil.rmtree(tier, ignore_errors=True)
        shutil.copytree(written, tier, symlinks=True)
        plan = for_build(reader.plan, build_dir, tier)
        _point(build_dir, weights_dir(plan))
        done(_read(build, reader, plan, cold, expected, build_dir, reporter, port))


def _point(build_dir: Path, weights: Path) -> None:
    """Point the build's one model path at ``weights`` (atomically: a new link renamed
    over the old)."""
    link, fresh = build_dir / MODEL_LINK, build_dir / f".{MODEL_LINK}.new"
    fresh.unlink(missing_ok=True)
    fresh.symlink_to(weights, target_is_directory=True)
    os.replace(fresh, link)


def _write(
    plan: RoundtripPlan, build_dir: Path, reporter: Status, label: str, port: int | None
) -> list[Completion]:
    """The writing server: the targets once, the tier settled, a clean stop (which the
    fs tier's files outlive)."""
    assert plan.server is not None
    server = plan.server.server(build_dir / "logs" / "writer.log", port)
    w = plan.scenario.workload
    try:
        start(server, plan.scenario.server, reporter, f"{label}: the writing server")
        ep = Endpoint(server.url, server)
        cold = [ep.complete(plan, t, "write", w.max_tokens) for t in plan.targets]
        ep.settle("write", w.settle_timeout_s)
        return cold
    finally:
        server.stop()


def _read(
    build: BuildPlan,
    reader: Reader,
    plan: RoundtripPlan,
    writer_answers: list[Completion],
    expected: int,
    build_dir: Path,
    reporter: Status,
    port: int | None,
) -> Row:
    """One restarted server: replay, control, noise; judged."""
    assert plan.server is not None
    name = reader.change.name
    server = plan.server.server(build_dir / "logs" / f"{name}.log", port)
    w = plan.scenario.workload
    t0 = time.monotonic()
    try:
        start(server, plan.scenario.server, reporter, f"{build.label}: {name}")
        ep = Endpoint(server.url, server)
        before, _ = ep.snapshot("start")
        replay = [ep.complete(plan, t, "replay", w.max_tokens) for t in plan.targets]
        after = ep.settle("replay", w.settle_timeout_s)
        salt = {"cache_salt": CONTROL_SALT}
        control = [ep.complete(plan, t, "control", w.max_tokens, salt) for t in plan.targets]
        again = [ep.complete(plan, t, "noise", w.max_tokens, salt) for t in plan.targets]
    except StartupFailure as err:
        return _row(build, reader, expected, NOT_STARTED, False, str(err), time.monotonic() - t0)
    except (EngineFailure, RuntimeFailure) as err:
        return _row(build, reader, expected, ENGINE_FAILED, False, str(err), time.monotonic() - t0)
    finally:
        server.stop()
    delta = after - before
    served = Served(delta.ext_hits, delta.loaded_bytes, delta.disk_hits, replay, control, again)
    unchanged = reader.change.name == UNCHANGED
    outcome, kept, answers, tol, diffs = judge(unchanged, expected, served, writer_answers)
    row = _row(build, reader, expected, outcome, kept, "", time.monotonic() - t0)
    known = known_bug(reader.change, build.vllm_version, outcome)
    if known is not None:
        row.known = f"#{known.issue}"
        row.passed = True
        row.detail = known.why if not kept else f"#{known.issue} no longer reproduces here"
    row.hit_tokens, row.loaded_bytes = int(delta.ext_hits), int(delta.loaded_bytes)
    row.disk_hits, row.answers, row.tolerance, row.diffs = int(delta.disk_hits), answers, tol, diffs
    return row


def known_bug(change: Change, version: str, outcome: str) -> Known | None:
    """The known upstream bug ``change`` is on ``version``: the one whose outcome this
    is, else (the row kept the rule) one that should have reproduced here."""
    mine = [k for k in change.known if version_matches(version, k.vllm)]
    return next((k for k in mine if k.outcome == outcome), None) or (
        mine[0] if mine and outcome in KEPT else None
    )


def _row(
    build: BuildPlan,
    reader: Reader,
    expected: int,
    outcome: str,
    passed: bool | None,
    detail: str,
    seconds: float = 0.0,
) -> Row:
    return Row(
        build.label, build.vllm_version, reader.change.name, reader.change.what, outcome,
        passed, expected, detail=detail, seconds=round(seconds, 1),
    )  # fmt: skip
