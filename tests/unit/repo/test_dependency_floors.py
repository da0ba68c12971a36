"""The floors pyproject.toml declares hold (issue 43): the installed releases satisfy them,
the typer floor covers every typer API the command line reads, and a typer below it is
refused in one line (exit 2), never a traceback. ci.yml's lowest-direct job runs this tier
on the floors themselves (docs/development.md, "Dependency floors")."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import stat
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import tomllib
import typer
from packaging.requirements import Requirement
from packaging.version import Version

from harness.cli import app as cli
from harness.cli import help_format
from tests.conftest import ROOT
from tests.unit.cli.cli_in_process import invoke, keep_signal_handlers, one_line  # noqa: F401

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
REQUIREMENTS = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]

# What the command line reads of typer beyond click's own API, with the release it first
# appeared in (read in typer's source: 0.28.0's core.py has neither; 0.29.0's
# TyperArgument.__init__ and TyperOption.__init__ take and store it, typer/_coercion.py's
# TypeDescriptor with annotation, is_choice and choices). harness/cli/help_format.py's
# readable_help reads it for every option's metavar; so does tests/unit/cli/test_cli_contract.py.
TYPER_APIS = {
    "TyperOption.type_descriptor": "0.29.0",
    "TyperArgument.type_descriptor": "0.29.0",
    "TypeDescriptor.annotation / is_choice / choices": "0.29.0",
}


def floor(name: str) -> Version:
    """The lowest release pyproject.toml allows for ``name`` (its ``>=``)."""
    (req,) = [r for r in REQUIREMENTS if r.name.replace("_", "-") == name]
    (low,) = [s.version for s in req.specifier if s.operator == ">="]
    return Version(low)


# --- the floors --------------------------------------------------------------------


@pytest.mark.parametrize("req", REQUIREMENTS, ids=lambda r: r.name)
def test_every_dependency_has_a_floor_and_the_installed_release_meets_it(req: Requirement):
    """Each floor is a ``>=`` (what lowest-direct installs), and what is installed here
    satisfies the whole specifier: an image with an older release fails here by name."""
    assert [s for s in req.specifier if s.operator == ">="], f"{req} has no floor"
    installed = importlib.metadata.version(req.name)
    assert req.specifier.contains(installed, prereleases=True), (
        f"{req.name} {installed} is installed, pyproject.toml asks for {req}"
    )


def test_the_cli_refuses_below_the_typer_floor_pyproject_declares():
    assert floor("typer") == Version(help_format.TYPER_FLOOR)


@pytest.mark.parametrize("api", TYPER_APIS)
def test_the_typer_floor_has_every_api_the_cli_reads(api: str):
    assert floor("typer") >= Version(TYPER_APIS[api]), f"{api} appeared in {TYPER_APIS[api]}"


def test_the_installed_typer_gives_every_parameter_what_the_help_reads():
    """The table above names what is really read: every option and argument of every
    command carries a type descriptor with those fields."""
    seen = set()

    def walk(command: Any) -> None:
        for sub in getattr(command, "commands", {}).values():
            walk(sub)
        for param in command.params:
            desc = param.type_descriptor  # AttributeError on typer 0.28 and older
            desc.annotation, desc.is_choice, desc.choices  # noqa: B018
            seen.add(type(param).__name__)

    walk(typer.main.get_command(cli.app))
    assert {"TyperOption", "TyperArgument"} <= seen


# --- an older typer: one line, exit 2 --------------------------------------------------


@pytest.mark.parametrize(
    "args", [["--help"], ["crash-repro", "--help"], ["envs", "create", "--help"], ["list"]]
)
@pytest.mark.parametrize("old", ["0.28.0", "0.27.2", "0.12.0"])
def test_a_typer_below_the_floor_is_one_line_and_exit_2(monkeypatch, args, old):
    monkeypatch.setattr(typer, "__version__", old)
    code, out, err = invoke(*args)
    line = one_line(err)
    assert code == 2, err
    assert out == ""
    assert line.startswith("offload-check: error: offload-check needs typer>=0.29.0")
    assert f"this environment has typer {old}" in line
    assert "pip install 'typer>=0.29.0'" in line


@pytest.mark.parametrize("version", ["0.29.0", "0.29.2", "1.0.0", "0.30.0.dev1", "local-build"])
def test_a_typer_at_or_above_the_floor_runs(monkeypatch, version):
    monkeypatch.setattr(typer, "__version__", version)
    assert help_format.typer_problem() is None
    code, out, err = invoke("--help")
    assert (code, err) == (0, "")
    assert "Usage:" in out


def test_a_tree_without_what_the_help_reads_is_one_line_and_exit_3(monkeypatch, tmp_path):
    """A typer whose version passes but whose options lack ``type_descriptor`` (0.28's
    tree): the guard's internal error, one line naming the cause and the traceback file."""
    made = typer.main.get_command

    def old_tree(app: Any) -> Any:
        tree = made(app)

        def strip(command: Any) -> None:
            for sub in getattr(command, "commands", {}).values():
                strip(sub)
            for param in command.params:
                del param.type_descriptor

        strip(tree)
        return tree

    monkeypatch.setattr(typer.main, "get_command", old_tree)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code, _out, err = invoke("--help")
    line = one_line(err)
    assert code == 3, err
    assert line.startswith("offload-check: internal error in offload-check: AttributeError")
    assert "type_descriptor" in line and str(tmp_path) in line
    (saved,) = tmp_path.glob("offload-check-offload-check-*.traceback.txt")
    assert "readable_help" in saved.read_text()


# --- scripts/help_every_command.py ---------------------------------------------------------


def help_script() -> ModuleType:
    path = ROOT / "scripts" / "help_every_command.py"
    spec = importlib.util.spec_from_file_location("help_every_command", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_help_script_finds_every_command_and_subcommand():
    paths = help_script().command_paths()
    tree = typer.main.get_command(cli.app)
    assert paths[0] == ()
    assert [p[0] for p in paths[1:] if len(p) == 1] == list(tree.commands)
    envs = tree.commands["envs"].commands  # type: ignore[attr-defined]
    assert [p[1] for p in paths if p[:1] == ("envs",) and len(p) == 2] == list(envs)
    assert len(set(paths)) == len(paths)


def fake_cli(tmp_path: Path, body: str) -> Path:
    """An ``offload-check`` stand-in: a shell script with ``$*`` as the command line."""
    path = tmp_path / "offload-check"
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_help_script_names_each_unclean_help(tmp_path, capsys):
    stub = fake_cli(
        tmp_path,
        'case "$*" in\n'
        '  "bench --help") echo "Traceback (most recent call last):" >&2; exit 1;;\n'
        '  "envs prune --help") echo "Usage: x"; echo "DeprecationWarning: old" >&2;;\n'
        '  "report --help") echo "no usage here";;\n'
        '  *) echo "Usage: offload-check $*";;\n'
        "esac",
    )
    assert help_script().main([], cli=stub) == 1
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert [f.split(":")[0] for f in failed] == [
        "FAIL offload-check bench --help",
        "FAIL offload-check report --help",
        "FAIL offload-check envs prune --help",
    ]
    assert "exit 1, no usage on stdout, output on stderr" in out and "Traceback" in out
    assert "ok   offload-check envs create --help" in out


def test_the_help_script_stops_at_a_cli_that_cannot_start(tmp_path, capsys):
    stub = fake_cli(
        tmp_path, 'echo "offload-check: error: offload-check needs typer>=0.29.0" >&2; exit 2'
    )
    assert help_script().main([], cli=stub) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL offload-check --help: exit 2")
    assert "needs typer>=0.29.0" in out and "crash-repro" not in out
