"""Markdown summary of finished (or partial) results directories, for CI pages.

    .venv/bin/python -m harness.ui.summary results/* >> "$GITHUB_STEP_SUMMARY"
    .venv/bin/python -m harness.ui.summary results/* > summary.md   # Buildkite annotation

One section per run directory: a headline verdict, then the crash-repro outcome table
(``outcomes.csv``), the roundtrip phase and check tables (``phases.csv``,
``checks.csv``) or a mutation session's score and survivors (``mutants.csv``). It reads
only the files a run leaves (schema in ``results/README.md``), so it works on runs that
crashed, timed out or were killed: a missing or unreadable file becomes a line saying
so, never a traceback, and the exit code is always 0 so a summary step can never turn a
green job red (or hide why a red one failed). It imports the results schema (the
tables' names and columns) and the readers of the sweep and corpus cells, nothing that
starts a server.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from harness.commands.crash_repro.files import OUTCOMES
from harness.commands.matrix.files import MATRIX_CELLS
from harness.commands.roundtrip.files import CHECKS, PHASE_TABLE
from harness.results.tables import TableFile

MAX_CELL = 300  # characters; a CI page is for reading, the files hold everything


# --- cells and tables --------------------------------------------------------------


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    text = " ".join(text.split())  # newlines and runs of spaces would break the row
    if len(text) > MAX_CELL:
        text = text[: MAX_CELL - 3] + "..."
    return text.replace("|", "\\|")


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return out


def _truthy(value: Any) -> bool | None:
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    return None


def _num(value: Any, sep: str = ",") -> str:
    """``1310720.0`` -> ``1,310,720`` (bytes); ``_num(1700.0, "")`` -> ``1700`` (tokens).

    Anything that is not a number is shown as it is."""
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        return text
    if number != number:  # NaN
        return ""
    if number.is_integer():
        return f"{int(number):,}".replace(",", sep)
    return f"{number:,.3f}".replace(",", sep)


def _read_csv(path: Path) -> tuple[pd.DataFrame | None, str | None]:
    """The CSV as strings (no type guessing), or why it could not be read."""
    if not path.is_file():
        return None, f"_`{path.name}` is missing: the run did not get that far._"
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        return None, f"_`{path.name}` is empty: the run did not get that far._"
    except (OSError, UnicodeDecodeError, ValueError, csv.Error) as exc:
        return None, f"_`{path.name}` could not be read: {_cell(exc)}_"
    return frame, None


def _col(row: pd.Series, name: str) -> str:
    return str(row[name]) if name in row.index else ""


# --- run directories -------------------------------------------------------------


def _load_run(run_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    try:
        data = json.loads((run_dir / "run.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"`run.json` could not be read: {_cell(exc)}"
    if not isinstance(data, dict):
        return None, "`run.json` is not a JSON object"
    return data, None


def _verdict(run: dict[str, Any], passed: bool | None) -> str:
    """Headline word from the run's own status and exit code (``results/README.md``)."""
    status = run.get("status")
    code = run.get("exit_code")
    if status == "running":
        return "INCOMPLETE (still `running` in run.json: the harness was killed or is live)"
    if status == "interrupted":
        return "INTERRUPTED"
    if status == "error":
        return f"ERROR (the harness could not finish, exit {code})"
    if status != "finished":
        return f"UNKNOWN (status {status!r})"
    if passed is None:
        passed = code == 0
    if passed and code in (0, None):
        return "PASS"
    if code == 2:
        return "BAD INPUT (exit 2)"
    return f"FAIL (exit {code})"


def _headline(run_dir: Path, run: dict[str, Any], verdict: str, extra: str = "") -> list[str]:
    command = run.get("command") or "run"
    lines = [f"## {command} `{run_dir.name}`: **{verdict}**", ""]
    facts = []
    raw_scenario = run.get("scenario")
    scenario = raw_scenario if isinstance(raw_scenario, dict) else {}
    if scenario.get("name"):
        facts.append(f"scenario `{scenario['name']}`")
    if isinstance(run.get("argv"), list):
        facts.append("`" + " ".join(str(a) for a in run["argv"]) + "`")
    if isinstance(run.get("wall_seconds"), (int, float)):
        facts.append(f"{run['wall_seconds']:.0f} s")
    if run.get("gpus"):
        facts.append("GPUs: " + ", ".join(str(g) for g in run["gpus"]))
    if extra:
        facts.append(extra)
    if facts:
        lines += ["- " + "; ".join(facts), ""]
    return lines


def _signature(row: pd.Series) -> str:
    """The crash signature, or for a server that started whether it answered."""
    if _col(row, "signature"):
        return _col(row, "signature")
    answered = _truthy(_col(row, "answered"))
    if answered:
        return "answered"
    if answered is False:
        return "no answer: " + _col(row, "answer").strip()
    return ""


def _crash_repro(run_dir: Path, run: dict[str, Any]) -> list[str]:
    frame, problem = _read_csv(run_dir / OUTCOMES.name)
    summary = run.get("summary") if isinstance(run.get("summary"), dict) else {}
    extra = ""
    if summary:
        extra = (
            f"{summary.get('done', '?')}/{summary.get('rows', '?')} rows done, "
            f"{summary.get('matched', '?')} as expected, "
            f"{summary.get('mismatched', '?')} not"
        )
    passed = None
    if frame is not None and len(frame) and "matched" in frame.columns:
        passed = all(_truthy(v) for v in frame["matched"])
    lines = _headline(run_dir, run, _verdict(run, passed), extra)
    if problem:
        return [*lines, problem, ""]
    assert frame is not None
    if not len(frame):
        return [*lines, "_`outcomes.csv` has no rows yet._", ""]
    rows = []
    for _, row in frame.iterrows():
        expected = _col(row, "expected")
        known = _num(_col(row, "expected_known"), "")
        if expected and known:
            # known_label's spelling, inline: the summary imports no verdict logic.
            expected += f" (#{known})" if known.isdigit() else f" ({known})"
        matched = _truthy(_col(row, "matched"))
        rows.append(
            [
                _col(row, "model"),
                _col(row, "variant"),
                _col(row, "vllm_version"),
                _col(row, "connector"),
                _col(row, "outcome"),
                _signature(row),
                expected,
                "yes" if matched else ("**NO**" if matched is False else ""),
            ]
        )
    lines += _table(OUTCOMES.display, rows)
    why = [
        (_col(r, "variant"), _col(r, "connector"), _col(r, "why"), _col(r, "log"))
        for _, r in frame.iterrows()
        if _truthy(_col(r, "matched")) is False
    ]
    if why:
        lines += ["", "Not as expected:", ""]
        lines += [
            f"- {v} connector={c}: {_cell(w) or 'see the log'} (log: `{log}`)"
            for v, c, w, log in why
        ]
    return [*lines, ""]


def _matrix(run_dir: Path, run: dict[str, Any]) -> list[str]:
    frame, problem = _read_csv(run_dir / MATRIX_CELLS.name)
    passed = None
    if frame is not None and len(frame) and "matched" in frame.columns:
        passed = all(_truthy(v) for v in frame["matched"])
    extra = f"{run.get('cells_matched', '?')}/{len(run.get('cells') or [])} cells as expected"
    lines = _headline(run_dir, run, _verdict(run, passed), extra)
    if problem:
        return [*lines, problem, ""]
    assert frame is not None
    rows = []
    for _, row in frame.iterrows():  # matrix.csv lists mismatches first
        start = _col(row, "startup") + (
            f": {_col(row, 'signature')}" if _col(row, "signature") else ""
        )
        rt = _col(row, "roundtrip")
        if rt == "fail":
            rt = "FAIL " + _col(row, "failed_checks")
        matched = _truthy(_col(row, "matched"))
        rows.append(
            [
                _col(row, "family"),
                _col(row, "geometry"),
                _col(row, "variant"),
                _col(row, "tier") or "roomy",
                _col(row, "vllm_version"),
                _col(row, "spec_classes"),
                start,
                rt,
                _col(row, "expected"),
                "yes" if matched else f"**NO**: {_col(row, 'why')}",
            ]
        )
    return [*lines, *_table(MATRIX_CELLS.display, rows), ""]


def is_informational(row: pd.Series) -> bool:
    """A ``checks.csv`` row that is reported but never fails the run."""
    flag = _truthy(_col(row, "informational"))
    if flag is not None:
        return flag
    return _col(row, "why").strip().lower().startswith("informational")


def _roundtrip(run_dir: Path, run: dict[str, Any]) -> list[str]:
    phases, phases_problem = _read_csv(run_dir / PHASE_TABLE.name)
    checks, checks_problem = _read_csv(run_dir / CHECKS.name)
    passed = run.get("passed") if isinstance(run.get("passed"), bool) else None
    counted = ""
    if checks is not None and "passed" in checks.columns:
        gating = [r for _, r in checks.iterrows() if not is_informational(r)]
        ok = sum(1 for r in gating if _truthy(_col(r, "passed")))
        counted = f"{ok}/{len(gating)} checks passed"
        if passed is None and gating:
            passed = ok == len(gating)
    raw_plan, raw_variant = run.get("plan"), run.get("variant")
    plan = raw_plan if isinstance(raw_plan, dict) else {}
    variant = raw_variant if isinstance(raw_variant, dict) else {}
    facts = [counted]
    if variant.get("vllm_version"):
        facts.append(
            f"vLLM {variant['vllm_version']} ({variant.get('vllm_dist', '?')}) on "
            f"{variant.get('device', '?')}"
        )
    if plan.get("tensor_parallel"):
        facts.append(f"TP {plan['tensor_parallel']}")
    if plan.get("fault") not in (None, "", "none"):
        facts.append(f"fault `{plan['fault']}`")
    lines = _headline(run_dir, run, _verdict(run, passed), "; ".join(f for f in facts if f))

    lines += ["### Phases", ""]
    lines += _rows_or_note(phases, phases_problem, PHASE_TABLE, _phase_row)
    lines += ["", "### Checks", ""]
    lines += _rows_or_note(checks, checks_problem, CHECKS, _check_row)
    files = [
        f"{what} `{run_dir / name}`"
        for name, what in (("report.md", "full report"), ("logs/server.log", "server log"))
        if (run_dir / name).is_file()
    ]
    if files:
        lines += ["", "Files: " + ", ".join(files) + "."]
    return [*lines, ""]


def _rows_or_note(
    frame: pd.DataFrame | None,
    problem: str | None,
    table: TableFile,
    render: Callable[[pd.Series], list[str]],
) -> list[str]:
    """A table file as markdown, or why it cannot be shown (a run cut short has none)."""
    if problem:
        return [problem]
    if frame is None:
        return []
    if not len(frame):
        return [f"_`{table.name}` has no rows yet._"]
    return _table(table.display, [render(r) for _, r in frame.iterrows()])


def _phase_row(r: pd.Series) -> list[str]:
    hits = _num(_col(r, "d_ext_hits"), "")
    queries = _num(_col(r, "d_ext_queries"), "")
    return [
        _col(r, "phase"),
        _num(_col(r, "d_stored_bytes")),
        _num(_col(r, "d_loaded_bytes")),
        _num(_col(r, "d_gpu_hits"), ""),
        f"{hits}/{queries}",
    ]


def _check_row(r: pd.Series) -> list[str]:
    row_ok = _truthy(_col(r, "passed"))
    if is_informational(r):
        result = "info: same" if row_ok else "info: differs"
    else:
        result = "pass" if row_ok else "**FAIL**"
    return [_col(r, "name"), result, _col(r, "expected"), _col(r, "observed"), _col(r, "detail")]


def _other(run_dir: Path, run: dict[str, Any]) -> list[str]:
    lines = _headline(run_dir, run, _verdict(run, None))
    files = sorted(p.name for p in run_dir.iterdir() if p.name != "run.json")
    return [*lines, "Files: " + (", ".join(f"`{f}`" for f in files) or "none"), ""]


def _grid(
    run_dir: Path, run: dict[str, Any], cells: list[Any], bad: list[str], row_of: str, text_of: str
) -> list[str]:
    """A sweep-shaped run: headline, the cells that went wrong, the build grid."""
    from harness.results.markdown import sweep_grid

    lines = _headline(run_dir, run, _verdict(run, not bad), f"{len(cells)} cells")
    lines += [*bad, ""] if bad else []
    builds = [str(b.get("label")) for b in run.get("builds") or [] if isinstance(b, dict)]
    order = builds or list(dict.fromkeys(c.release for c in cells))
    headers, rows = sweep_grid(cells, order, row_of=row_of, text_of=text_of)
    return [*lines, *_table(headers, rows)]


def _sweep(run_dir: Path, run: dict[str, Any]) -> list[str]:
    """Release x check, cells not as expected listed first, and the transitions."""
    from harness.commands.sweep import read_cells

    cells, _ = read_cells(run_dir)
    bad = [
        f"- **not as expected**: {c.release} {c.check}: {c.state} ({c.why})"
        for c in cells
        if c.matched is False
    ]
    lines = _grid(run_dir, run, cells, bad, "check", "state")
    return [*lines, "", *[f"- {t}" for t in run.get("transitions") or []], ""]


def _bugs(run_dir: Path, run: dict[str, Any]) -> list[str]:
    """Bug x release, unmatched cells listed first."""
    from harness.commands.bugs.files import read_cells

    cells = read_cells(run_dir)
    bad = [
        f"- **unmatched**: {c.bug} on {c.release}: {c.outcome} ({c.why})"
        for c in cells
        if c.matched is False
    ]
    return [*_grid(run_dir, run, cells, bad, "bug", "outcome"), ""]


def _stress(run_dir: Path, run: dict[str, Any]) -> list[str]:
    """The profile and what it did in numbers, then every check."""
    from harness.commands.stress.files import STRESS_CHECKS

    checks, problem = _read_csv(run_dir / STRESS_CHECKS.name)
    passed = run.get("passed") if isinstance(run.get("passed"), bool) else None
    raw_plan, raw_figures = run.get("plan"), run.get("stress")
    plan = raw_plan if isinstance(raw_plan, dict) else {}
    f = raw_figures if isinstance(raw_figures, dict) else {}
    facts = [
        f"profile `{plan.get('profile', '?')}`, seed {plan.get('seed', '?')}, "
        f"concurrency {plan.get('concurrency', '?')}",
        f"{f.get('requests_sent', '?')} requests ({f.get('requests_compared', '?')} compared) "
        f"in {f.get('traffic_seconds', '?')} s",
        f"tolerance {f.get('tolerance')} (noise floor {f.get('noise_floor')})",
    ]
    if plan.get("fault") not in (None, "", "none"):
        facts.append(f"fault `{plan['fault']}`")
    if plan.get("patch") not in (None, "", "none"):
        facts.append(f"patch `{plan['patch']}`")
    lines = _headline(run_dir, run, _verdict(run, passed), "; ".join(facts))
    lines += ["### Checks", ""]
    lines += _rows_or_note(checks, problem, STRESS_CHECKS, _check_row)
    files = [
        f"{what} `{run_dir / name}`"
        for name, what in (
            ("divergence.md", "divergences"),
            ("timeline.png", "timeline"),
            ("requests.jsonl", "requests"),
        )
        if (run_dir / name).is_file()
    ]
    if files:
        lines += ["", "Files: " + ", ".join(files) + "."]
    return [*lines, ""]


MAX_SURVIVORS = 50  # rows; report.md and mutants.csv list every one


def _mutate(run_dir: Path, run: dict[str, Any]) -> list[str]:
    """The score, then the survivors: reached ones first (a change no check noticed),
    then the unreached (a line no workload runs)."""
    from harness.commands.mutate.files import MUTANTS

    frame, problem = _read_csv(run_dir / MUTANTS.name)
    raw_plan, raw_score = run.get("plan"), run.get("mutate")
    plan = raw_plan if isinstance(raw_plan, dict) else {}
    score = raw_score if isinstance(raw_score, dict) else {}
    passed = run.get("passed") if isinstance(run.get("passed"), bool) else None
    raw_commands = plan.get("commands")
    commands = raw_commands if isinstance(raw_commands, list) else []
    facts = [
        f"`{plan.get('target', '?')}` of vLLM {plan.get('vllm_version', '?')}",
        "through " + (", ".join(str(c) for c in commands) or "?"),
    ]
    shard = plan.get("shard")
    if isinstance(shard, list) and len(shard) == 2:
        facts.append(f"shard {shard[0]}/{shard[1]}")
    if isinstance(run.get("merged"), list):
        facts.append(f"merged from {len(run['merged'])} shard run(s)")
    if score.get("summary"):
        facts.append(f"score: {score['summary']}")
    lines = _headline(run_dir, run, _verdict(run, passed), "; ".join(facts))
    if problem:
        return [*lines, problem, ""]
    assert frame is not None
    if not len(frame):
        return [*lines, f"_`{MUTANTS.name}` has no rows yet._", ""]
    verdicts = frame["verdict"] if "verdict" in frame.columns else pd.Series(dtype=str)
    counts = verdicts.replace("", "not run").value_counts()
    lines += ["Verdicts: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())), ""]
    survivors = [r for _, r in frame.iterrows() if _col(r, "verdict") == "survived"]
    survivors.sort(
        key=lambda r: (
            not _col(r, "reached"),
            int(_col(r, "line")) if _col(r, "line").isdigit() else 0,
        )
    )
    lines += ["### Survivors", ""]
    if not survivors:
        lines.append("None.")
    else:
        rows = [
            [
                _col(r, "id"),
                _col(r, "line"),
                _col(r, "function"),
                _col(r, "change"),
                _col(r, "reached") or "not reached",
            ]
            for r in survivors[:MAX_SURVIVORS]
        ]
        lines += _table(["id", "line", "function", "change", "reached by"], rows)
        if len(survivors) > MAX_SURVIVORS:
            lines += ["", f"_and {len(survivors) - MAX_SURVIVORS} more in `report.md`._"]
    if (run_dir / "report.md").is_file():
        lines += ["", f"Files: full report `{run_dir / 'report.md'}`."]
    return [*lines, ""]


def _section(run_dir: Path) -> list[str]:
    run, problem = _load_run(run_dir)
    if problem:
        return [f"## `{run_dir.name}`: **UNREADABLE**", "", f"_{problem}_", ""]
    assert run is not None
    render_one = {
        "crash-repro": _crash_repro,
        "roundtrip": _roundtrip,
        "matrix": _matrix,
        "sweep": _sweep,
        "bugs": _bugs,
        "stress": _stress,
        "mutate": _mutate,
    }.get(str(run.get("command")), _other)
    try:
        return render_one(run_dir, run)
    except Exception as exc:  # a summary must never fail the CI step it runs in
        return [
            f"## `{run_dir.name}`: **UNREADABLE**",
            "",
            f"_could not summarise this run ({type(exc).__name__}: {_cell(exc)}); "
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
