"""The CLI's contract, over every option of every command, generated from the typer app
itself (issue 23): bad and edge values per option type, always with ``--dry-run`` where
the command has it, in this process, never launching a server. Every input must end
with an exit code of the documented set, never a traceback, exit 2 in one line, and no
``run.json`` left ``running``.

What would launch or install is replaced by a stop (``ContractStop``): a command that
gets that far must end through the guard like any unexpected exception (exit 3, one
line, its run marked ``failed``). New commands and options join the sweep by
themselves; the value table below is by type.
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import tempfile
import time
import traceback
import typing
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import typer

from harness.cli import app as cli
from tests.conftest import ROOT

DOCUMENTED = {0, 1, 2, 3, 130}
FIXTURE_RUN = ROOT / "tests" / "fixtures" / "replay" / "clean"
# Placeholders filled per test: an existing file, an existing directory, a path that does
# not exist (in the test's own directory: a results dir given it is created).
FILE, DIR, MISSING = "<file>", "<dir>", "<missing>"

INT_VALUES = ("0", "-1", "99999", "abc")
FLOAT_VALUES = ("-5", "nan", "0", "abc")
PATH_VALUES = (MISSING, FILE, DIR)
CHOICE_VALUES = ("bogus",)
URL_VALUES = ("not-a-url", "http://127.0.0.1:1", "ftp://x")
INTERPRETER_VALUES = (MISSING, FILE, "/usr/bin/python3")
TEXT_VALUES = ("bogus", "")

# Positional arguments a command needs when another of its parameters is under test.
REQUIRED = {
    ("report",): [str(FIXTURE_RUN)],
    ("compare",): [str(FIXTURE_RUN), str(FIXTURE_RUN)],
    ("validate",): [str(ROOT / "scenarios" / "crash-repro.toml")],
    ("envs", "create"): ["bogus"],
    ("envs", "releases"): ["latest"],
}


class ContractStop(Exception):
    """Raised where a command would launch a server or install an environment."""


@dataclass(frozen=True)
class Input:
    command: tuple[str, ...]
    args: tuple[str, ...]

    def text(self) -> str:
        return " ".join(("offload-check", *self.command, *self.args))


def _commands(group: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for name, command in sorted(group.commands.items()):
        if hasattr(command, "commands"):
            yield from _commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


def _kind(param: Any) -> str:
    annotation = param.type_descriptor.annotation
    if typing.get_origin(annotation) is list:
        (annotation,) = typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "choice"
    if annotation is bool:
        return "flag"
    if annotation is int:
        return "int"
    if annotation is float:
        return "float"
    if annotation is Path:
        return "path"
    name = param.name or ""
    if "url" in name:
        return "url"
    if name in ("python", "build"):
        return "interpreter"
    return "text"


VALUES = {
    "int": INT_VALUES,
    "float": FLOAT_VALUES,
    "path": PATH_VALUES,
    "choice": CHOICE_VALUES,
    "url": URL_VALUES,
    "interpreter": INTERPRETER_VALUES,
    "text": TEXT_VALUES,
}


def generate() -> list[Input]:
    """Every (command, parameter, bad or edge value) from the app's own declarations."""
    inputs: list[Input] = [Input((), ()), Input((), ("--bogus",))]
    for path, command in _commands(typer.main.get_command(cli.app)):
        names = {p.name for p in command.params}
        base = ["--dry-run"] if "dry_run" in names else []
        inputs.append(Input(path, ("-h",)))
        inputs.append(Input(path, (*REQUIRED.get(path, []), *base, "--no-such-option")))
        arguments = [p for p in command.params if p.param_type_name == "argument"]
        for param in command.params:
            kind = _kind(param)
            if param.param_type_name == "argument":
                for value in VALUES[kind]:
                    rest = [
                        value if a is param else REQUIRED[path][i] for i, a in enumerate(arguments)
                    ]
                    inputs.append(Input(path, (*rest, *base)))
                continue
            option = param.opts[0]
            if param.name == "dry_run":
                continue  # part of every input of its command
            head = [*REQUIRED.get(path, []), *base]
            if kind == "flag":
                inputs.append(Input(path, (*head, option)))
                continue
            for value in VALUES[kind]:
                inputs.append(Input(path, (*head, option, value)))
            inputs.append(Input(path, (*head, option)))  # the value missing
    return inputs


INPUTS = generate()


@dataclass
class Outcome:
    code: int | None
    stdout: str
    stderr: str
    escaped: str = ""  # a traceback that came out of cli.run itself
    seconds: float = 0.0


def _run(argv: list[str]) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    code: int | None = None
    escaped = ""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.run(argv)
        except BaseException:  # the guard let something through: a contract breach
            escaped = traceback.format_exc()
    return Outcome(code, out.getvalue(), err.getvalue(), escaped, time.monotonic() - t0)


def breaches(case: Input, outcome: Outcome) -> list[str]:
    problems = []
    if outcome.escaped:
        problems.append(f"exception escaped the guard: {outcome.escaped.splitlines()[-1]}")
    text = outcome.stdout + outcome.stderr
    if "Traceback (most recent call last)" in text:
        problems.append("a traceback was printed")
    if outcome.code not in DOCUMENTED:
        problems.append(f"exit code {outcome.code} not in {sorted(DOCUMENTED)}")
    lines = [ln for ln in outcome.stderr.splitlines() if ln.strip()]
    if outcome.code in (2, 3) and case.args and len(lines) != 1:
        problems.append(f"exit {outcome.code} with {len(lines)} stderr lines: {lines[:3]}")
    if "╭" in outcome.stderr:
        problems.append("typer's error box")
    return problems


@pytest.fixture
def sandbox(tmp_path, monkeypatch) -> Iterator[dict[str, Path]]:
    """A cache, lock and results of its own; what would launch or install stops."""
    from harness.commands import doctor
    from harness.commands.bench import measure as bench
    from harness.server import launcher, release_envs

    def stop(*_args: Any, **_kwargs: Any) -> Any:
        raise ContractStop("the contract test launches nothing")

    monkeypatch.setenv("OFFLOAD_CHECK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # tracebacks of runs without a dir
    monkeypatch.setenv("OFFLOAD_CHECK_LOCK", str(tmp_path / "server.lock"))
    monkeypatch.delenv("OFFLOAD_CHECK_LOCK_WAIT", raising=False)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(release_envs, "_ask_index", lambda dist: [])  # no network
    for target, name in (
        (launcher, "server_slot"),
        (bench, "server_slot"),
        (bench, "run_bench"),
        (launcher.VllmServer, "start"),
        (release_envs, "ensure_envs"),
        (release_envs, "prune_envs"),
    ):
        monkeypatch.setattr(target, name, stop)
    # doctor's per-variant imports of vLLM take seconds and say nothing about the CLI.
    monkeypatch.setattr(doctor, "check_plugin", lambda name, exe: doctor.Check(name, "ok", exe))
    monkeypatch.setattr(doctor, "check_bytecode", lambda name, exe: doctor.Check(name, "ok", exe))
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    a_file = tmp_path / "a-file.txt"
    a_file.write_text("not a scenario, not a directory\n")
    a_dir = tmp_path / "a-dir"
    a_dir.mkdir()
    missing = tmp_path / "missing" / "deeper"
    yield {
        "file": a_file,
        "dir": a_dir,
        "missing": missing,
        "results": tmp_path / "results",
        "root": tmp_path,
    }
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _argv(case: Input, where: dict[str, Path]) -> list[str]:
    fill = {FILE: where["file"], DIR: where["dir"], MISSING: where["missing"]}
    args = [str(fill[a]) if a in fill else a for a in case.args]
    argv = [*case.command, *args]
    command = dict(_commands(typer.main.get_command(cli.app))).get(case.command)
    has_results = command is not None and any(p.name == "results_dir" for p in command.params)
    if has_results and "--results-dir" not in args and "-h" not in args:
        argv += ["--results-dir", str(where["results"])]
    return argv


def test_the_sweep_covers_every_command_and_option():
    commands = dict(_commands(typer.main.get_command(cli.app)))
    covered = {c.command for c in INPUTS}
    assert set(commands) <= covered
    for path, command in commands.items():
        for param in command.params:
            if param.name == "dry_run":
                continue
            needle = param.opts[0]
            assert any(
                needle in c.args or param.param_type_name == "argument"
                for c in INPUTS
                if c.command == path
            ), (path, needle)
    assert len(INPUTS) > 300


def test_every_input_keeps_the_contract(sandbox, capsys):
    failures: list[str] = []
    codes: Counter[int | None] = Counter()
    stopped = 0
    slow: list[tuple[float, str]] = []
    t0 = time.monotonic()
    for case in INPUTS:
        outcome = _run(_argv(case, sandbox))
        codes[outcome.code] += 1
        stopped += "ContractStop" in outcome.stderr
        slow.append((outcome.seconds, case.text()))
        for problem in breaches(case, outcome):
            failures.append(f"{case.text()}: {problem}")
    running = [
        str(p)
        for p in sandbox["root"].glob("**/run.json")
        if json.loads(p.read_text()).get("status") == "running"
    ]
    took = time.monotonic() - t0
    with capsys.disabled():
        print(
            f"\ncli contract: {len(INPUTS)} inputs in {took:.1f}s; exit codes "
            f"{dict(sorted(codes.items(), key=lambda kv: str(kv[0])))}; "
            f"{stopped} stopped where they would launch; slowest: "
            + "; ".join(f"{s:.1f}s {t}" for s, t in sorted(slow, reverse=True)[:3])
        )
    assert not running, f"run.json left running: {running}"
    assert not failures, "\n".join(failures[:40]) + f"\n({len(failures)} breaches)"


def test_the_sweep_fails_without_the_guard(sandbox, monkeypatch):
    """With the guard's two handlers put back to what typer and Python do by themselves
    (the error box, the exception), the same inputs breach the contract."""
    from typer import rich_utils

    def typer_box(command: str, err: Any) -> int:
        rich_utils.rich_format_error(err)
        return int(err.exit_code)

    def reraise(command: str, err: BaseException, mark: int) -> int:
        raise err

    monkeypatch.setattr(cli, "_usage_error", typer_box)
    monkeypatch.setattr(cli, "_internal_error", reraise)
    issue = {
        ("roundtrip", "--dry-run", "--port", "99999"),
        ("crash-repro", "--dry-run", "--port", "-1"),
        ("stress", "--dry-run", "--tp", "0"),
    }
    subset = [c for c in INPUTS if c.command == ("bench",) or (*c.command, *c.args) in issue]
    assert len(subset) > 10
    breached = [c for c in subset if breaches(c, _run(_argv(c, sandbox)))]
    assert len(breached) > len(subset) // 2, [c.text() for c in breached]
    running = [
        p
        for p in sandbox["root"].glob("**/run.json")
        if json.loads(p.read_text()).get("status") == "running"
    ]
    assert running  # bench's run, stopped by an exception nobody caught
