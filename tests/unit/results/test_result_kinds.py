"""The results registry is the one spelling of every table file's columns: the records
the commands produce have exactly those columns, the README documents each of them, and
every reader (report, compare, CI summary) selects only columns that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.commands.crash_repro.files import OUTCOMES
from harness.commands.faults import FAULT_ROUNDS
from harness.commands.matrix.files import MATRIX_CELLS
from harness.results import tables as rk
from harness.ui import owned_kinds

owned_kinds.load()  # the commands that register their own kinds

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "results" / "README.md").read_text()
TABLES = [t for k in rk.KINDS.values() for t in k.tables]


def _section(name: str) -> str:
    """The README text from the heading (or paragraph) naming ``name`` to the next heading."""
    start = README.index(f"`{name}`")
    start = README.rfind("\n", 0, start)
    end = re.search(r"\n#{2,3} ", README[start + 1 :])
    return README[start : start + 1 + end.start()] if end else README[start:]


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.name)
def test_every_column_is_documented(table):
    text = _section(table.name)
    # phases.csv documents its counters once for both the d_ and cum_ columns.
    missing = [
        c
        for c in table.columns
        if f"`{c}`" not in text and f"`{re.sub(r'^(d|cum)_', '', c)}`" not in text
    ]
    assert not missing, f"{table.name}: undocumented columns {missing}"


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.name)
def test_readers_select_only_written_columns(table):
    for use in ("key", "compared", "shown"):
        extra = set(getattr(table, use)) - set(table.columns)
        assert not extra, f"{table.name}.{use} names unwritten columns {extra}"
    for use in ("passes", "outcomes"):  # compare's gates are compared columns
        extra = set(getattr(table, use)) - set(table.compared)
        assert not extra, f"{table.name}.{use} names columns compare does not diff {extra}"


def test_records_have_exactly_the_registered_columns():
    from harness.commands.faults import CAUGHT_BY, Round
    from harness.commands.matrix import Cell
    from harness.scenario.matrix import CellExpectation

    rnd = Round(0, "none", CAUGHT_BY["none"])
    assert tuple(rnd.record()) == FAULT_ROUNDS.columns
    cell = Cell(
        family="chunked-local",
        geometry="g",
        variant="current",
        vllm_version="0.32.0",
        rule=CellExpectation(startup="started", roundtrip="pass"),
    )
    assert tuple(cell.record()) == MATRIX_CELLS.columns


def test_crash_repro_rows_carry_every_column():
    from harness.commands.crash_repro import Row
    from harness.server.launcher import ServerSpec

    row = Row("m", "current", True, None, "0.32.0", True, ServerSpec("py", "m"))
    assert set(OUTCOMES.columns) <= set(row.record())


def test_every_command_with_a_run_directory_is_registered():
    assert set(rk.KINDS) == {
        "crash-repro",
        "roundtrip",
        "matrix",
        "faults",
        "bench",
        "sweep",
        "bugs",
        "bug-steps",
        "stress",
        "bug-scheduler",
        "mutate",
        "pressure",
        "oracle",
        "namespace",
    }
    for kind in rk.KINDS.values():
        assert f"{kind.command} runs" in README or kind.command == "crash-repro", kind.command


def test_every_other_file_is_documented():
    for kind in rk.KINDS.values():
        for name in kind.files:
            assert name.split("<")[0].rstrip("/") in README, (kind.command, name)


def test_a_table_from_before_a_column_was_added_reads_as_it_meant(tmp_path):
    """A matrix.csv from before the CPU-tier dimension (a recorded run) reads with every
    cell on the roomy tier, so ``compare`` of yesterday's nightly with today's matches
    rows instead of refusing the file."""
    from harness.ui.compare import compare

    old = ROOT / "tests" / "fixtures" / "matrix" / "20261130-102144-matrix-e4a2"
    assert "tier" not in (old / "matrix.csv").read_text().splitlines()[0].split(",")
    frame = MATRIX_CELLS.read(old)
    assert frame is not None and frame.tier.eq("roomy").all()
    assert list(frame.columns).index("tier") == MATRIX_CELLS.columns.index("tier")
    result = compare(old, old)
    assert result.changed == 0 and len(result.tables[0].rows) == len(frame)
    for table in TABLES:
        assert set(table.added) <= set(table.columns), table.name


def test_every_reader_finds_an_owned_kind_through_one_lookup():
    """The oracle spells its own tables; report, compare and the CI summary find them
    through ``owned_kinds.kind_of``, which loads the owners before it looks, in a fresh
    process where nothing imported the oracle yet."""
    code = (
        "from harness.results import tables\n"
        "assert tables.kind_of('oracle') is None\n"
        "from harness.ui.owned_kinds import kind_of\n"
        "kind = kind_of('oracle')\n"
        "print(sorted(t.name for t in kind.tables))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "oracle-checks.csv" in proc.stdout and "oracle.csv" in proc.stdout
    for reader in ("harness/ui/compare.py", "harness/ui/terminal.py"):
        text = (ROOT / reader).read_text()
        assert "from harness.ui.owned_kinds import kind_of" in text, reader
        assert "from harness.results.tables import" not in text or ", kind_of" not in text
