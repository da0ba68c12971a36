"""``--help`` stays fast: ``offload-check --help`` imports no ``harness.commands`` module,
and ``offload-check <command> --help`` none but its own command's.

The CLI modules (``harness/cli/<command>.py``) import their command when it runs, not at
import: these imports wait in functions, listed in tests/unit/repo/test_local_imports.py.
Each help runs in a fresh interpreter, which then names the command modules it loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer.main

from harness.cli.app import app
from tests.conftest import ROOT

PROBE = """
import contextlib, io, json, sys
from harness.cli.app import run
with contextlib.redirect_stdout(io.StringIO()):
    code = run(sys.argv[1:])
print(json.dumps([code, sorted(m for m in sys.modules if m.startswith("harness.commands"))]))
"""

COMMANDS = sorted(typer.main.get_command(app).commands)


def loaded_commands(argv: list[str]) -> tuple[int, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    code, modules = json.loads(proc.stdout.strip().splitlines()[-1])
    return code, modules


def own_package(command: str) -> str:
    return "harness.commands." + command.replace("-", "_")


def test_the_command_list_is_read_from_the_app():
    assert {"crash-repro", "roundtrip", "stress", "envs", "list", "validate"} <= set(COMMANDS)


def test_top_level_help_imports_no_command():
    assert loaded_commands(["--help"]) == (0, [])


@pytest.mark.parametrize("command", COMMANDS)
def test_a_commands_help_imports_no_other_command(command):
    code, modules = loaded_commands([command, "--help"])
    own = own_package(command)
    others = [
        m for m in modules if m != "harness.commands" and m != own and not m.startswith(own + ".")
    ]
    assert (code, others) == (0, [])
    assert "harness.commands" not in modules or any(m.startswith(own) for m in modules)


def test_the_probe_sees_the_commands_a_run_imports():
    """Seeded: ``offload-check list`` runs, and reads the fault and bug catalogues from
    their commands; the probe names them, so an import at the top of a CLI module would
    show up in the help tests above the same way."""
    code, modules = loaded_commands(["list"])
    assert code == 0
    assert {"harness.commands.faults", "harness.commands.bugs"} <= set(modules)
