"""Every command's results in one place: its table files and their columns, its JUnit
cases, what ``report``, ``compare`` and the CI summary show of it.

A results directory is read back by several consumers (``offload-check report``,
``compare``, ``python -m harness.ui.summary``, the nightly's trend step) long after the
command that wrote it has exited, so they must agree with the writer on every file
and column. Each column list is spelled here once; the writers take it from here
(``TableFile.write``) and the readers select from it, and ``results/README.md``
documents the same lists (``tests/unit/results/test_result_kinds.py`` keeps them equal).
Adding a command means adding a ``ResultsKind`` here; adding a column means adding it
here and to the README.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.results.records import BugCell, CheckResult, MutantRecord, StepRecord, SweepCell
from harness.results.run_directory import JUnitCase, RunDirectory, junit_xml

if TYPE_CHECKING:
    import pandas as pd


def _no_error(row: Any) -> str | None:
    return None


@dataclass(frozen=True)
class JUnitMap:
    """How a table's rows become JUnit cases, the form CI systems list failures in.

    Names and text are ``str.format`` templates over the row's record (its CSV row) plus
    the writer's context, so a case says what the table says; only whether a row failed
    is logic, and that is the kind's own function.
    """

    classname: str
    name: str
    failure: Callable[[Any], str | None]  # the message when the row failed, else None
    stdout: str = ""
    properties: tuple[str, ...] = ()  # record columns attached as properties
    seconds: str = ""  # record column holding the row's duration ("" = none)
    error: Callable[[Any], str | None] = _no_error  # the message when it could not run

    def cases(self, rows: Sequence[Any], **context: Any) -> list[JUnitCase]:
        out = []
        for row in rows:
            rec = {**context, **row.record()}
            out.append(
                JUnitCase(
                    classname=self.classname.format(**rec),
                    name=self.name.format(**rec),
                    seconds=float(rec.get(self.seconds) or 0.0) if self.seconds else 0.0,
                    failure=self.failure(row),
                    error=self.error(row),
                    stdout=self.stdout.format(**rec),
                    properties={k: str(rec[k]) for k in self.properties},
                )
            )
        return out


@dataclass(frozen=True)
class TableFile:
    """One CSV file of a run: its columns, and which of them each reader uses."""

    name: str  # file name in the run directory
    columns: tuple[str, ...]  # every column, in file order (results/README.md)
    title: str = ""  # heading of the table wherever it is shown; "" = the file's stem
    key: tuple[str, ...] = ()  # a row's identity across runs (``compare``); () = no rows to match
    compared: tuple[str, ...] = ()  # what ``compare`` diffs between two runs
    # Of ``compared``: pass/fail columns (True -> False is a regression: ``compare`` exits 1)
    passes: tuple[str, ...] = ()
    # Of ``compared``: verdicts whose every change fails ``compare`` (an outcome, a state)
    outcomes: tuple[str, ...] = ()
    shown: tuple[str, ...] = ()  # what ``report`` shows in the terminal
    # Headers of its markdown table in report.md and the CI summary (cells rendered there).
    display: tuple[str, ...] = ()
    junit: JUnitMap | None = None  # one JUnit case per row (junit.xml), if any
    # Columns a later version added, with what a file written before them meant: a run
    # from before still reads (``report``, ``compare``) as if it had them.
    added: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.title:
            object.__setattr__(self, "title", Path(self.name).stem)

    def write_junit(
        self, run_dir: RunDirectory, suite: str, rows: Sequence[Any], **context: Any
    ) -> None:
        assert self.junit is not None, self.name
        run_dir.write_text("junit.xml", junit_xml(suite, self.junit.cases(rows, **context)))

    def write(self, run_dir: RunDirectory, records: Sequence[dict[str, Any]]) -> Path:
        """Exactly ``columns``, in order: a record's other keys are not written."""
        return run_dir.write_csv(self.name, records, self.columns)

    def read(self, run_dir: Path) -> pd.DataFrame | None:
        """The table as strings-or-numbers, None when the run never wrote it."""
        import pandas as pd

        path = run_dir / self.name
        if not path.is_file():
            return None
        frame = pd.read_csv(path, keep_default_na=False)
        for column, meant in self.added.items():
            if column not in frame.columns:
                frame.insert(self.columns.index(column), column, meant)
        return frame


@dataclass(frozen=True)
class ResultsKind:
    """What one command writes into its run directory, besides ``run.json``."""

    command: str
    tables: tuple[TableFile, ...]
    files: tuple[str, ...]  # every other file it may write (results/README.md)


def _record_fields(cls: Any, *, drop: Sequence[str] = ()) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls) if f.name not in drop)


# --- crash-repro --------------------------------------------------------------------------
OUTCOMES = TableFile(
    "outcomes.csv",
    (
        "model",
        "variant",
        "vllm_version",
        "patch",
        "patch_status",
        "connector",
        "chunked_local",
        "outcome",
        "seconds",
        "launch",
        "signature",
        "exception",
        "frame",
        "message",
        "known_issue",
        "answered",
        "answer",
        "returncode",
        "kernels",
        "expected",
        "expected_known",
        "matched",
        "why",
        "log",
        "command",
    ),
    title="crash-repro",
    key=("model", "variant", "connector"),
    compared=("vllm_version", "outcome", "signature", "matched"),
    passes=("matched",),
    outcomes=("outcome",),
    junit=JUnitMap(
        "crash-repro.{model}",
        "{variant} connector={connector}",
        lambda r: None if r.matched else (r.why or "mismatch"),
        stdout="outcome={outcome} {signature}\nlog={log}",
        properties=("outcome", "expected", "vllm_version"),
        seconds="seconds",
    ),
    shown=(
        "model",
        "variant",
        "vllm_version",
        "patch",
        "connector",
        "outcome",
        "signature",
        "seconds",
        "expected",
        "matched",
    ),
    display=(
        "model",
        "variant",
        "vllm_version",
        "connector",
        "outcome",
        "signature",
        "expected",
        "matched",
    ),
)


# --- roundtrip ------------------------------------------------------------------------------
def _phase_columns() -> tuple[str, ...]:
    from harness.server.metrics import Snapshot

    counters = _record_fields(Snapshot)
    deltas = tuple(f"d_{c}" for c in counters)
    totals = tuple(f"cum_{c}" for c in counters)
    return ("phase", "requests", "seconds", *deltas, *totals)


PHASE_TABLE = TableFile(
    "phases.csv",
    _phase_columns(),
    key=("phase",),
    compared=("d_stored_bytes", "d_loaded_bytes", "d_gpu_hits", "d_ext_hits", "d_ext_queries"),
    display=("phase", "d_stored_bytes", "d_loaded_bytes", "d_gpu_hits", "d_ext_hits/d_ext_queries"),
)
# A check is a JUnit case by its name, failing with what it expected and saw.
CHECKS = TableFile(
    "checks.csv",
    _record_fields(CheckResult),
    junit=JUnitMap(
        "roundtrip.{scenario}",
        "{name}",
        lambda c: None if c.passed else f"expected {c.expected}, observed {c.observed}. {c.detail}",
        stdout="{why}",
    ),
    key=("name",),
    compared=("passed", "observed"),
    passes=("passed",),
    display=("name", "passed", "expected", "observed", "detail"),
)
# stress: the round trip's checks table, its JUnit cases classed by the stress profile.
assert CHECKS.junit is not None
STRESS_CHECKS = replace(CHECKS, junit=replace(CHECKS.junit, classname="stress.{profile}"))


# --- matrix ---------------------------------------------------------------------------------
MATRIX_CELLS = TableFile(
    "matrix.csv",
    (
        "family",
        "geometry",
        "variant",
        "tier",
        "vllm_version",
        "spec_classes",
        "kernels",
        "startup",
        "startup_seconds",
        "signature",
        "message",
        "known_issue",
        "roundtrip",
        "failed_checks",
        "expected",
        "observed",
        "expected_issue",
        "matched",
        "why",
        "seconds",
        "cell_dir",
    ),
    title="KV-cache spec family matrix",
    key=("family", "geometry", "variant", "tier"),
    added={"tier": "roomy"},
    compared=("vllm_version", "spec_classes", "startup", "roundtrip", "failed_checks", "matched"),
    passes=("matched",),
    outcomes=("startup", "roundtrip"),
    junit=JUnitMap(
        "matrix.{family}",
        "{geometry} / {variant} / {tier}",
        lambda c: (
            None
            if c.matched or c.roundtrip == "error"
            else f"expected {c.expected_text()}, observed {c.observed_text()}: {c.why}"
        ),
        properties=("spec_classes", "vllm_version", "startup", "roundtrip"),
        seconds="seconds",
        error=lambda c: c.why if c.roundtrip == "error" and not c.matched else None,
    ),
    shown=(
        "family",
        "geometry",
        "variant",
        "tier",
        "vllm_version",
        "spec_classes",
        "startup",
        "roundtrip",
        "failed_checks",
        "expected",
        "matched",
        "why",
    ),
    display=(
        "family",
        "model",
        "variant",
        "CPU tier",
        "vLLM",
        "engine KV specs",
        "startup",
        "round trip",
        "expected",
        "match",
    ),
)


# --- faults ---------------------------------------------------------------------------------
FAULT_ROUNDS = TableFile(
    "faults.csv",
    (
        "round",
        "fault",
        "status",
        "expected_failing",
        "failing",
        "missed",
        "unexpected",
        "seed",
        "reason",
    ),
    # A soak repeats the clean round: a round is its number and its fault.
    key=("round", "fault"),
    compared=("status", "failing"),
    outcomes=("status",),
    junit=JUnitMap(
        "faults",
        "{fault}",
        lambda r: None if r.matched else f"{r.status}: {r.reason}",
        properties=("expected_failing",),
    ),
    shown=("round", "fault", "status", "expected_failing", "failing", "reason"),
    display=("round", "fault", "must fail", "failed", "verdict", "why"),
)


# --- bench ------------------------------------------------------------------------------------
BENCH_FIGURES = TableFile(
    "bench.csv",
    ("figure", "value", "target", "ok"),
    key=("figure",),
    compared=("value", "ok"),
    passes=("ok",),
    shown=("figure", "value", "target", "ok"),
)


# --- sweep ----------------------------------------------------------------------------------
SWEEP_CELLS = TableFile(
    "sweep.csv",
    _record_fields(SweepCell),
    key=("release", "check"),
    compared=("vllm_version", "outcome", "known", "matched"),
    passes=("matched",),
    outcomes=("outcome",),
    shown=("release", "check", "outcome", "signature", "expected", "matched", "detail"),
    display=("release", "check", "outcome", "signature", "expected", "match", "detail"),
    junit=JUnitMap(
        "sweep.{release}",
        "{check}",
        lambda c: f"expected {c.expected}, got {c.state}: {c.why}" if c.matched is False else None,
        stdout="outcome={outcome} {signature}\n{detail}\n{why}",
        properties=("vllm_version", "outcome", "expected", "scenario"),
        seconds="seconds",
    ),
)
SWEEP_ENVS = TableFile(
    "envs.csv",
    ("release", "state", "reason", "seconds", "disk_bytes", "vllm_version", "python", "ahead"),
    title="builds",
    key=("release",),
    compared=("state", "vllm_version"),
    outcomes=("state",),
    shown=("release", "state", "vllm_version", "seconds", "reason"),
)


# --- bugs -------------------------------------------------------------------------------------
# One cell per corpus entry and build, and a scripted trigger's steps (``bug-steps``).
BUG_CELLS = TableFile(
    "bugs.csv",
    _record_fields(BugCell),
    key=("bug", "release"),
    compared=("vllm_version", "outcome", "matched"),
    passes=("matched",),
    outcomes=("outcome",),
    shown=("bug", "release", "outcome", "expected", "matched", "signature"),
    display=("bug", "release", "outcome", "expected", "match", "signature"),
    junit=JUnitMap(
        "bugs.{bug}",
        "{release}",
        lambda c: (
            f"expected {c.expected}, got {c.outcome}: {c.why}" if c.matched is False else None
        ),
        stdout="outcome={outcome} ({observed}) {signature}\n{detail}\n{why}",
        properties=("vllm_version", "outcome", "expected", "check"),
        seconds="seconds",
    ),
)
BUG_STEPS = TableFile(
    "steps.csv",
    _record_fields(StepRecord),
    key=("index",),
    compared=("http_status", "counters"),
    outcomes=("http_status",),
    shown=("index", "do", "name", "detail", "counters"),
)


# --- pressure -------------------------------------------------------------------------------
def _pressure_columns() -> tuple[str, ...]:
    from harness.results.records import PressureRequest

    return _record_fields(PressureRequest)


PRESSURE_REQUESTS = TableFile(
    "pressure.csv",
    _pressure_columns(),
    title="requests against the oracle",
    key=("server", "round", "index"),
    compared=("ext_hits", "stored_bytes", "loaded_bytes", "failing"),
    shown=("server", "round", "index", "request", "hit_expected", "ext_hits", "stored_bytes",
           "loaded_bytes", "evicted_expected", "failing"),
    display=("server", "round", "#", "request", "hit (oracle)", "hit", "stored B",
             "loaded B", "oracle evicts", "failed"),
)  # fmt: skip
PRESSURE_CHECKS = TableFile(
    "pressure-checks.csv",
    (
        "server",
        "round",
        "check",
        "passed",
        "expected",
        "observed",
        "why",
        "detail",
        "known",
        "matched",
    ),
    title="checks",
    key=("server", "round", "check"),
    compared=("passed", "matched"),
    passes=("matched",),
    shown=("server", "round", "check", "passed", "matched", "known", "detail"),
    display=("server", "round", "check", "passed", "as expected", "known bug", "where"),
    junit=JUnitMap(
        "pressure.{server}.{round}",
        "{check}",
        lambda r: (
            None
            if r.matched
            else (
                "passed, but this round's mutant or fault must fail it"
                if r.passed
                else f"expected {r.expected}; observed {r.observed}. {r.detail}"
            )
        ),
        properties=("known",),
    ),
)


# --- mutate ---------------------------------------------------------------------------------
MUTANTS = TableFile(
    "mutants.csv",
    _record_fields(MutantRecord),
    key=("id",),
    compared=("verdict", "reached"),
    outcomes=("verdict",),
    shown=("id", "line", "function", "operator", "verdict", "command", "reached"),
    display=("id", "line", "function", "change", "verdict", "command", "reached"),
    junit=JUnitMap(
        "mutate.{target}",
        "{id} line {line} {operator}",
        lambda m: (
            f"survived ({'reached by ' + m.reached if m.reached else 'never reached'}): {m.change}"
            if m.verdict == "survived"
            else None
        ),
        stdout="{change}\nverdict={verdict} command={command} failed={failed}\n{detail}",
        properties=("verdict", "command", "reached"),
        seconds="seconds",
    ),
)


# --- what each command writes: its tables and its other files --------------------------
CRASH_REPRO = ResultsKind(
    "crash-repro", (OUTCOMES,), ("junit.xml", "logs/<model>__<variant>__connector-<on|off>.log")
)
ROUNDTRIP = ResultsKind(
    "roundtrip",
    (PHASE_TABLE, CHECKS),
    (
        "requests.jsonl",
        "junit.xml",
        "report.md",
        "phases.png",
        "metrics/<phase>.prom",
        "logs/server.log",
        "logs/baseline-server.log",
        "logs/server-restarted.log",
        "disk-tier/",
    ),
)
MATRIX = ResultsKind(
    "matrix",
    (MATRIX_CELLS,),
    ("junit.xml", "report.md", "cells/<family>__<geometry>__<variant>__<tier>/"),
)
FAULTS_KIND = ResultsKind(
    "faults", (FAULT_ROUNDS,), ("junit.xml", "report.md", "logs/server.log", "rounds/<NN>-<fault>/")
)
BENCH = ResultsKind(
    "bench", (BENCH_FIGURES,), ("bench.json", "crash-repro/logs/", "roundtrip/logs/")
)
SWEEP = ResultsKind(
    "sweep",
    (SWEEP_CELLS, SWEEP_ENVS),
    (
        "junit.xml",
        "report.md",
        "heatmap.png",
        "transitions.json",
        "releases/<build>/<scenario>/",
    ),
)
BUG_SCRIPT = ResultsKind(
    "bug-steps", (BUG_STEPS, CHECKS), ("requests.jsonl", "metrics/", "logs/server.log")
)
BUGS = ResultsKind(
    "bugs",
    (BUG_CELLS, SWEEP_ENVS),
    ("junit.xml", "report.md", "releases/<build>/<scenario or bug>/"),
)
STRESS = ResultsKind(
    "stress",
    (STRESS_CHECKS,),
    (
        "requests.jsonl",
        "reference.jsonl",
        "divergence.md",
        "junit.xml",
        "timeline.png",
        "metrics/start.prom",
        "metrics/end.prom",
        "logs/server.log",
        "logs/reference-server.log",
    ),
)


BUG_SCHEDULER = ResultsKind("bug-scheduler", (), ("drive.json", "drive.stdout", "drive.stderr"))
MUTATE = ResultsKind(
    "mutate",
    (MUTANTS,),
    (
        "session.sqlite",
        "junit.xml",
        "report.md",
        "baseline/<command>/",
        "mutants/<id>/<command>/",
    ),
)
PRESSURE = ResultsKind(
    "pressure",
    (PRESSURE_REQUESTS, PRESSURE_CHECKS),
    ("requests.jsonl", "junit.xml", "report.md", "logs/<server>.log"),
)


KINDS: dict[str, ResultsKind] = {
    k.command: k
    for k in (
        CRASH_REPRO, ROUNDTRIP, MATRIX, FAULTS_KIND, BENCH, SWEEP, BUGS, BUG_SCRIPT, STRESS,
        PRESSURE, BUG_SCHEDULER, MUTATE,
    )
}  # fmt: skip
"""Every command that writes a results directory, by its ``run.json`` ``command``."""


def register(kind: ResultsKind) -> ResultsKind:
    """A command that owns its tables (its package spells their columns) adds its kind
    here when imported; the readers load those commands' files modules first
    (``harness.ui.owned_kinds``)."""
    if kind.command in KINDS and KINDS[kind.command] is not kind:
        raise ValueError(f"results kind {kind.command!r} registered twice")
    KINDS[kind.command] = kind
    return kind


def kind_of(command: str) -> ResultsKind | None:
    return KINDS.get(command)
