"""What a bug-corpus run writes, rewritten after each cell: its tables
(``commands/bugs/files.py``), ``junit.xml`` and ``report.md`` (unmatched cells first, the
bug x release grid, each entry's links, ranges and reproductions)."""

from __future__ import annotations

from harness.commands.bugs.corpus import REPRODUCED, reproduction
from harness.commands.bugs.files import BUG_CELLS
from harness.commands.sweep.files import SWEEP_ENVS
from harness.results.markdown import (
    Envs,
    Meta,
    Rows,
    builds_table,
    grid_report_head,
    grid_section,
    mark,
    table,
)
from harness.results.run_directory import RunDirectory


def write_bugs(run_dir: RunDirectory, cells: Rows, envs: Envs, entries: Rows, meta: Meta) -> None:
    """Every corpus file from what is known so far (rewritten after each cell)."""
    BUG_CELLS.write(run_dir, [c.record() for c in cells])
    SWEEP_ENVS.write(run_dir, envs)
    BUG_CELLS.write_junit(run_dir, "bugs", cells)
    report = bugs_report(cells, envs, entries, {"results_dir": str(run_dir.path), **meta})
    run_dir.write_text("report.md", report)


def bugs_report(cells: Rows, envs: Envs, entries: Rows, meta: Meta) -> str:
    """``report.md`` of a bug-corpus run: unmatched cells first, the bug x release grid,
    then each entry with its upstream links, ranges and reproductions."""
    bad = [c for c in cells if c.matched is False]
    verdict = "every entry as the corpus says" if not bad else f"{len(bad)} cell(s) unmatched"
    reproduced = sorted({c.bug for c in cells if c.outcome == REPRODUCED and c.matched})
    lines = grid_report_head(
        f"bugs: {verdict}",
        f"entries: {len(entries)}; reproduced where they lived: {len(reproduced)} "
        f"({', '.join(reproduced) or '-'})",
        meta,
        (
            "Unmatched",
            ["bug", "release", "outcome", "expected", "why"],
            [[c.bug, c.release, c.outcome, c.expected, c.why] for c in bad],
        ),
    )
    lines += grid_section(
        "Bug x release", "* = unmatched", cells, meta, row_of="bug", text_of="outcome"
    )
    lines += ["## Entries", ""]
    for e in entries:
        issue = f"issue #{e.issue}" if isinstance(e.issue, int) else (e.issue or "no issue")
        fix = f"fix PR #{e.fix_pr} ({e.fix_title})" if e.fix_pr else "no fix merged"
        lines += [
            f"### {e.id}: {e.title}",
            "",
            f"- {issue}{f' ({e.issue_title})' if e.issue_title else ''}; {fix}",
            f"- affected `{e.affected}`; fixed `{e.fixed or 'still open'}`; label {e.label}"
            + (f"; needs {', '.join(e.requires)}" if e.requires else "")
            + (f"; holds only on {e.platform.describe()}" if e.platform else ""),
            f"- rerun: `{reproduction(e, meta.get('release_order', []))}`",
            "",
        ]
        if e.reproduce.strip():
            lines += ["```", e.reproduce.strip(), "```", ""]
    lines += ["## Builds", "", builds_table(envs), "", "## Cells", ""]
    lines.append(
        table(
            ["bug", "release", "outcome", "observed", "signature", "expected", "match"],
            [
                [c.bug, c.release, c.outcome, c.observed, c.signature, c.expected, mark(c.matched)]
                for c in cells
            ],
        )
    )
    return "\n".join(lines) + "\n"
