"""Results on disk: one directory per run, written as the run goes.

``run.json`` is written when the run starts and rewritten when it ends, and the
row files are rewritten after every row, so a crash, a Ctrl-C or a dead machine
leaves everything learned so far on disk. The schema is documented field by field
in ``results/README.md``; bump ``SCHEMA_VERSION`` when it changes.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.server.launcher import finished_launches

SCHEMA_VERSION = 2

# Every run directory of this process not yet finished, oldest first: the CLI's guard
# finishes them (``failed``, ``interrupted``) when a command ends in an unexpected way, so
# no ``run.json`` is left ``running`` by a process that is gone.
_UNFINISHED: list[RunDirectory] = []
_CREATED = [0]  # how many run directories this process has made (their serial numbers)


def runs_created() -> int:
    """A mark: runs made after it have a higher ``serial`` (see ``unfinished_runs``)."""
    return _CREATED[0]


def unfinished_runs(after: int = 0) -> list[RunDirectory]:
    """The run directories created in this process after the mark ``after`` and not
    finished, oldest first."""
    return [r for r in _UNFINISHED if r.serial > after]


def finish_unfinished(
    status: str, exit_code: int, after: int = 0, **fields: Any
) -> list[RunDirectory]:
    """Finish every unfinished run made after ``after`` with ``status``; returns them."""
    runs = unfinished_runs(after)
    for run in runs:
        # A directory gone or unwritable has nothing left to mark (finish unlists it first).
        with contextlib.suppress(OSError):
            run.finish(status, exit_code, **fields)
    return runs


def read_json_object(
    path: Path, what: str, error: type[HarnessError] = HarnessError
) -> dict[str, Any]:
    """A JSON file that must hold one object (a run's ``run.json``, a record); anything
    else is ``error`` in one line: "<path>: not valid JSON: ..." or "<path>: not <what>"."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise error(f"{path}: not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: not {what}")
    return data


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_dir(base: Path, command: str, label: str | None = None) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    named = f"{stamp}-{label}" if label else stamp  # a run's --label, sanitised by the CLI
    path = base / f"{named}-{command}-{secrets.token_hex(2)}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@dataclass
class JUnitCase:
    classname: str
    name: str
    seconds: float
    failure: str | None = None  # message when the case failed
    error: str | None = None  # message when the case could not run
    stdout: str = ""
    properties: dict[str, str] = field(default_factory=dict)


def junit_xml(suite: str, cases: Sequence[JUnitCase]) -> str:
    """JUnit XML in the dialect CI consumers agree on (one testsuite in testsuites)."""
    failures = sum(1 for c in cases if c.failure is not None)
    errors = sum(1 for c in cases if c.error is not None)
    total_time = sum(c.seconds for c in cases)
    root = ET.Element(
        "testsuites",
        name="offload-check",
        tests=str(len(cases)),
        failures=str(failures),
        errors=str(errors),
        time=f"{total_time:.2f}",
    )
    ts = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(cases)),
        failures=str(failures),
        errors=str(errors),
        skipped="0",
        time=f"{total_time:.2f}",
        timestamp=utc_now(),
    )
    for case in cases:
        tc = ET.SubElement(
            ts, "testcase", classname=case.classname, name=case.name, time=f"{case.seconds:.2f}"
        )
        if case.properties:
            props = ET.SubElement(tc, "properties")
            for k, v in case.properties.items():
                ET.SubElement(props, "property", name=k, value=v)
        if case.failure is not None:
            ET.SubElement(tc, "failure", message=case.failure, type="mismatch").text = case.failure
        if case.error is not None:
            ET.SubElement(tc, "error", message=case.error, type="error").text = case.error
        if case.stdout:
            ET.SubElement(tc, "system-out").text = case.stdout
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode")


class RunDirectory:
    """The files of one run; every write is atomic (no half-written file on a crash)."""

    def __init__(self, path: Path, command: str) -> None:
        self.path = path
        self.command = command
        self.meta: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "command": command,
            "argv": sys.argv,
            "status": "running",
            "started_at": utc_now(),
            "finished_at": None,
        }
        self._t0 = time.monotonic()
        # Launches made before this run (an earlier run in the same process) are not its.
        self._launch_mark = len(finished_launches())
        _CREATED[0] += 1
        self.serial = _CREATED[0]
        _UNFINISHED.append(self)

    def launches(self) -> list[dict[str, Any]]:
        """The timeline of every server stopped since this run began, in order."""
        return finished_launches()[self._launch_mark :]

    def update_meta(self, **fields: Any) -> None:
        self.meta.update(fields)
        # Rewritten with every update, so an interrupted run keeps the launches it made.
        self.meta["launches"] = self.launches()
        self.write_json("run.json", self.meta)

    def finish(self, status: str, exit_code: int, **fields: Any) -> None:
        if self in _UNFINISHED:
            _UNFINISHED.remove(self)
        self.update_meta(
            status=status,
            exit_code=exit_code,
            finished_at=utc_now(),
            wall_seconds=round(time.monotonic() - self._t0, 2),
            **fields,
        )

    def write_json(self, name: str, data: Any) -> Path:
        path = self.path / name
        _atomic_write(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
        return path

    def write_text(self, name: str, text: str) -> Path:
        path = self.path / name
        _atomic_write(path, text)
        return path

    def write_csv(
        self, name: str, records: Sequence[dict[str, Any]], columns: Sequence[str]
    ) -> Path:
        import pandas as pd

        frame = pd.DataFrame.from_records(list(records), columns=list(columns))
        path = self.path / name
        _atomic_write(path, frame.to_csv(index=False))
        return path
