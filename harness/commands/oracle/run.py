"""Running an oracle plan: the drive cells in one drive process, then each server cell
on its own server (one at a time), every request judged as it lands; a failing cell's
sequence shrunk on the drive afterwards (``--no-shrink`` skips it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.commands.oracle import drive, server, shrink
from harness.commands.oracle.judge import ACCOUNTING, CellResult
from harness.commands.oracle.plan import OraclePlan


def execute_oracle(
    plan: OraclePlan,
    out_dir: Path,
    reporter: server.OracleReporter,
    on_update: Callable[[list[CellResult]], None],
    *,
    port: int | None = None,
    do_shrink: bool = True,
    fail_fast: bool = False,
) -> list[CellResult]:
    results: dict[str, CellResult] = {}
    order = [c.name for c in plan.cells if not c.skip]

    def update(result: CellResult) -> None:
        results[result.name] = result
        on_update([results[n] for n in order if n in results])

    def failed() -> bool:
        return fail_fast and any(not r.passed for r in results.values())

    if plan.drive_cells:
        drive.run_drive(plan.env.python, plan.drive_cells, out_dir / "drive", update,
                        reporter.status, fail_fast=fail_fast, patch=plan.patch)  # fmt: skip
    for cell in plan.server_cells:
        if failed():
            break
        server.run_server_cell(plan, cell, out_dir, reporter, update, port)
    if do_shrink:
        for cell in [c for c in plan.cells if not c.skip]:
            res = results.get(cell.name)
            if res is None or not res.unexpected:
                continue
            # The earliest failure among the accounting checks and the check that failed
            # first of all (a count, else an answer or content check): what a short
            # sequence can show most plainly.
            opening = res_first(res)
            first = min(
                (j.index, c)
                for j in res.requests
                for c in j.failing
                if c in res.unexpected and (c in ACCOUNTING or c == opening)
            )
            reporter.status(f"{cell.name}: shrinking the sequence failing {first[1]}")
            got = shrink.shrink(plan.env.python, cell, first[0], first[1], plan.patch)
            res.shrunk.append(got.record())
            update(res)
    return [results[n] for n in order if n in results]


def res_first(res: CellResult) -> str:
    """The check that failed first in the sequence."""
    for j in res.requests:
        for c in j.failing:
            if c in res.unexpected:
                return c
    return ""
