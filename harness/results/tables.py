"""The results registry: what a table file of a run directory is (``TableFile``: its
columns, its JUnit cases, what ``report``, ``compare`` and the CI summary show of it),
what one command writes (``ResultsKind``) and every command's kind by its ``run.json``
``command`` (``KINDS``).

A results directory is read back by several consumers (``offload-check report``,
``compare``, ``python -m harness.ui.summary``, the nightly's trend step) long after the
command that wrote it has exited, so they must agree with the writer on every file
and column. Each command spells its tables once, in its own package
(``commands/<command>/files.py``), and registers its kind here when imported
(``register``); the writers take the columns from there (``TableFile.write``) and the
readers select from them, finding every kind through ``harness.ui.owned_kinds``.
``results/README.md`` documents the same lists (``tests/unit/results/test_result_kinds.py``
keeps them equal). This module imports no command.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    # Its section of the CI summary (``python -m harness.ui.summary``): markdown lines from
    # the run directory and its run.json; None = the headline and the files it wrote.
    summary: Callable[[Path, dict[str, Any]], list[str]] | None = None


def record_fields(cls: Any, *, drop: Sequence[str] = ()) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls) if f.name not in drop)


KINDS: dict[str, ResultsKind] = {}
"""Every command that writes a results directory, by its ``run.json`` ``command``: filled
as each command's files module is imported (``harness.ui.owned_kinds.load``)."""


def register(kind: ResultsKind) -> ResultsKind:
    """A command adds its kind here when its files module is imported (its package spells
    the tables' columns); the readers load every command's files module first
    (``harness.ui.owned_kinds``)."""
    if kind.command in KINDS and KINDS[kind.command] is not kind:
        raise ValueError(f"results kind {kind.command!r} registered twice")
    KINDS[kind.command] = kind
    return kind


def kind_of(command: str) -> ResultsKind | None:
    return KINDS.get(command)
