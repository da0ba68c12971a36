"""Markdown summary of finished (or partial) results directories, for CI pages.

    .venv/bin/python -m harness.ui.summary results/* >> "$GITHUB_STEP_SUMMARY"
    .venv/bin/python -m harness.ui.summary results/* > summary.md   # Buildkite annotation

One section per run directory: a headline verdict, then what its command shows there (the
crash-repro outcome table, the roundtrip phase and check tables, a mutation session's
score and survivors, ...). Each command's section is its own: its results kind's
``summary`` (``commands/<command>/files.py``), made of ``harness.results.ci_summary``'s
pieces; a kind without one gets its headline and its files. It reads only the files a
run leaves (schema in ``results/README.md``), so it works on runs that crashed, timed out
or were killed: a missing or unreadable file becomes a line saying so, never a
traceback, and the exit code is always 0 so a summary step can never turn a green job
red (or hide why a red one failed). It loads the commands' files modules (their tables
and sections), nothing that starts a server.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.names import RECORDS_MARKER
from harness.results.ci_summary import cell, load_run, other
from harness.ui.owned_kinds import kind_of


def _section(run_dir: Path) -> list[str]:
    run, problem = load_run(run_dir)
    if problem:
        return [f"## `{run_dir.name}`: **UNREADABLE**", "", f"_{problem}_", ""]
    assert run is not None
    kind = kind_of(str(run.get("command")))
    render_one = kind.summary if kind is not None and kind.summary is not None else other
    try:
        return render_one(run_dir, run)
    except Exception as exc:  # a summary must never fail the CI step it runs in
        return [
            f"## `{run_dir.name}`: **UNREADABLE**",
            "",
            f"_could not summarise this run ({type(exc).__name__}: {cell(exc)}); "
            f"its files are in the artifacts._",
            "",
        ]


def _expand(paths: Sequence[Path]) -> tuple[list[Path], list[str]]:
    """Run directories to render, and notes for what was skipped."""
    runs: list[Path] = []
    notes: list[str] = []
    for path in paths:
        if (path / "run.json").is_file():
            runs.append(path)
        elif (path / RECORDS_MARKER).is_file():
            continue  # kept records of earlier runs (results/gpu/): not this job's
        elif path.is_dir():
            children = sorted(p.parent for p in path.glob("*/run.json"))
            if children:  # a results root such as ``results/``
                runs += children
            else:
                notes.append(f"- skipped `{path}`: no `run.json`, not a run directory")
        elif not path.exists():
            notes.append(f"- skipped `{path}`: does not exist")
        # other plain files (results/README.md from ``results/*``) are not runs: ignored
    return runs, notes


def render(run_dirs: list[Path]) -> str:
    """Markdown for the given run directories (or results roots), in the given order."""
    runs, notes = _expand([Path(p) for p in run_dirs])
    lines = ["# offload-check results", ""]
    if not runs:
        lines += [
            "_No run directories found: the job failed before the harness wrote "
            "any results (see the job log)._",
            "",
        ]
    for run_dir in runs:
        lines += _section(run_dir)
    if notes:
        lines += [*notes, ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.ui.summary",
        description="Render a markdown summary of offload-check results directories.",
    )
    parser.add_argument(
        "run_dirs",
        nargs="*",
        type=Path,
        metavar="RUN_DIR",
        help="results/<run-id> directories (or a results root)",
    )
    args = parser.parse_args(argv)
    sys.stdout.write(render(args.run_dirs))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
