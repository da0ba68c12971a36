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
CRASH_REPRO_RUN = ROOT / "tests" / "fixtures" / "results" / "20261130-065547-crash-repro-1904"
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
# A run's name: sanitised into its directory's name, refused when nothing is left.
LABEL_VALUES = ("nightly/gpu #3", "../..", "", "-")

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
    if name == "label":
        return "label"
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
    "label": LABEL_VALUES,
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
        if {"as_json", "dry_run"} <= names:
            inputs.append(Input(path, ("--json",)))  # a plan's JSON without --dry-run
        if "url" in names:  # what only a launch takes, refused with --url
            for name, value in LAUNCH_ONLY.items():
                if name in names:
                    flag = f"--{name.replace('_', '-')}"
                    given = (flag,) if value is None else (f"{flag}={value}",)
                    inputs.append(Input(path, (*base, "--url", "http://127.0.0.1:1", *given)))
    return inputs


# Options of roundtrip and stress that choose what a launch starts, with a value each.
LAUNCH_ONLY = {
    "variant": "current",
    "python": "/usr/bin/python3",
    "patch": "chunked-local-fix",
    "fault": "no-load",
    "tp": "2",
    "engine_arg": "--enforce-eager",
    "baseline": None,
}


INPUTS = generate()
COMMANDS = dict(_commands(typer.main.get_command(cli.app)))


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
    if "--json" in case.args and "-h" not in case.args and outcome.code in (0, 1):
        # --json: one JSON document on stdout, nothing else there.
        try:
            json.loads(outcome.stdout)
        except ValueError:
            problems.append(f"--json printed no JSON document: {outcome.stdout[:120]!r}")
    return problems


@pytest.fixture
def sandbox(tmp_path, monkeypatch) -> Iterator[dict[str, Path]]:
    """A cache, lock and results of its own; what would launch or install stops."""
    from harness.commands.bench import measure as bench
    from harness.commands.doctor import preflight
    from harness.commands.doctor.host import Check
    from harness.server import build_envs, launcher, release_envs

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
        (build_envs, "ensure_envs"),
        (release_envs, "prune_envs"),
    ):
        monkeypatch.setattr(target, name, stop)
    # doctor's per-variant imports of vLLM take seconds and say nothing about the CLI.
    monkeypatch.setattr(preflight, "check_plugin", lambda name, exe: Check(name, "ok", exe))
    monkeypatch.setattr(preflight, "check_bytecode", lambda name, exe: Check(name, "ok", exe))
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
    command = COMMANDS.get(case.command)
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

    monkeypatch.setattr(cli, "usage_error", typer_box)
    monkeypatch.setattr(cli, "internal_error", reraise)
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


# --- what the commands print: plans, widths, JSON, labels (no server launches) -------------
@contextlib.contextmanager
def fake_server() -> Iterator[str]:
    """An HTTP server answering as a vLLM server with the connector would, to be attached
    to (``--url``): ``/v1/models`` and a recorded ``/metrics``; nothing else."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    metrics = (ROOT / "tests/fixtures/replay/clean/metrics/start.prom").read_bytes()
    models = json.dumps({"data": [{"id": "llama4-attached", "max_model_len": 2048}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, ctype = (
                (models, "application/json")
                if self.path.startswith("/v1/models")
                else (metrics, "text/plain")
            )
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("command", ["roundtrip", "stress"])
def test_a_dry_run_with_url_is_the_attach_plan(sandbox, monkeypatch, command):
    """``--url --dry-run`` plans against that server (its model, its pool), launches
    nothing and prints no argv; ``--json`` says the same."""
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    with fake_server() as url:
        text = _run([command, "--url", url, "--dry-run"])
        data = _run([command, "--url", url, "--dry-run", "--json"])
    assert text.code == 0, text.stderr
    assert f"attach: {url}" in text.stdout and "llama4-attached" in text.stdout
    assert "argv" not in text.stdout and "host: amx_permission" not in text.stdout
    assert data.code == 0, data.stderr
    plan = json.loads(data.stdout)
    assert plan["attach"] == url and plan["launches"] == 0 and plan["server_argv"] is None


def test_url_refuses_what_only_a_launch_takes_alike_in_both_commands(sandbox):
    lines: dict[tuple[str, str], str] = {}
    for command in ("roundtrip", "stress"):
        names = {
            p.name for p in dict(_commands(typer.main.get_command(cli.app)))[(command,)].params
        }
        for name, value in LAUNCH_ONLY.items():
            if name not in names:
                continue
            flag = f"--{name.replace('_', '-')}"
            given = [flag] if value is None else [f"{flag}={value}"]
            out = _run([command, "--dry-run", "--url", "http://127.0.0.1:1", *given])
            assert out.code == 2, (command, flag, out.stderr)
            (line,) = [ln for ln in out.stderr.splitlines() if ln.strip()]
            lines[(command, flag)] = line
    for flag in ("--variant", "--python", "--patch", "--fault", "--tp", "--engine-arg"):
        want = (
            f"offload-check: error: --url attaches to a server someone else launched: {flag} "
            "does not apply (it chooses what a launch starts)"
        )
        assert lines[("roundtrip", flag)] == lines[("stress", flag)] == want
    two = _run(["roundtrip", "--url", "http://127.0.0.1:1", "--tp", "2", "--fault", "no-load"])
    assert "--fault and --tp do not apply (they choose" in two.stderr


def test_a_gpu_scenario_planned_on_a_cpu_build_says_so_first(sandbox, monkeypatch):
    """scout-fp8-tp4 is written for GPUs: on this CPU build the dry run and the real run
    both begin with the note and how to switch; planned for cuda, no note."""
    args = ["roundtrip", "--tp", "4", "--scenario", "scenarios/scout-fp8-tp4.toml"]
    dry = _run([*args, "--dry-run"])
    assert dry.code == 0, dry.stderr
    first = dry.stdout.split("\n\n")[0]
    assert dry.stdout.startswith("note: scout-fp8-tp4 is written for GPUs")
    assert "OFFLOAD_CHECK_DEVICE=cuda" in " ".join(first.split())
    assert "32 GiB CPU tier" in " ".join(dry.stdout.split())
    as_json = json.loads(_run([*args, "--dry-run", "--json"]).stdout)
    assert "OFFLOAD_CHECK_DEVICE=cuda" in as_json["off_platform"]
    real = _run([*args, "--results-dir", str(sandbox["results"])])  # stops at the launch
    assert real.code == 3 and "ContractStop" in real.stderr
    assert real.stdout.startswith("note: scout-fp8-tp4 is written for GPUs"), real.stdout
    from harness.server.interpreters import probe

    monkeypatch.setenv("OFFLOAD_CHECK_DEVICE", "cuda")
    probe.cache_clear()
    try:
        gpu = _run([*args, "--dry-run"])
    finally:
        probe.cache_clear()
    assert gpu.code == 0 and "note:" not in gpu.stdout.split("\n")[0]


WIDE_PLANS = (
    ("bugs", "--dry-run"),
    ("sweep", "--dry-run"),
    ("sweep", "--check", "llama4-issue-51150", "--dry-run"),
    ("bugs", "--releases", "0.27.1,0.28.0", "--dry-run"),
    ("sweep", "--releases", "0.27.1,0.28.0", "--dry-run"),
)


@pytest.mark.parametrize("args", WIDE_PLANS, ids=" ".join)
def test_plans_fit_80_columns(sandbox, monkeypatch, args):
    """Every line of the plan fits 80 columns (counted in bytes too: piped, tables are
    ASCII), no cell is cut to ``…``, and a release a plan names is in a range or alone."""
    monkeypatch.setenv("COLUMNS", "80")
    out = _run(list(args))
    assert out.code == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [ln for ln in lines if len(ln.encode()) > 80] == []
    assert "…" not in out.stdout
    # One line per build and a column per release made ~160; a bug plan grows by a few
    # lines per entry (its table row and its command), never by build.
    entries = len(list((ROOT / "scenarios" / "bugs").glob("*.toml")))
    assert len(lines) < 40 + (6 * entries if args[0] == "bugs" else 0)
    if "--releases" not in args:
        assert "by build (55, runs of builds alike)" in out.stdout
        assert "0.8.5..0.27.1 (50)" in out.stdout


def test_report_at_80_columns_is_the_live_table_readable(sandbox, monkeypatch, tmp_path):
    """``report`` on a crash-repro run prints the table the run printed (built from the
    same function, from the CSV's records), whole words at 80 columns."""
    import pandas as pd
    from rich.console import Console

    from harness.cli.crash_repro_show import crash_repro_table
    from harness.commands.crash_repro import Row
    from harness.commands.crash_repro.files import OUTCOMES
    from harness.server.launcher import ServerSpec

    monkeypatch.setenv("COLUMNS", "80")
    out = _run(["report", str(CRASH_REPRO_RUN)])
    assert out.code == 0, out.stderr
    assert [ln for ln in out.stdout.splitlines() if len(ln.encode()) > 80] == []
    assert "scheduler.py:get_sliding_window_size_in_chunks" in out.stdout
    assert "chunked-local-fix" in out.stdout and "crashed #51150" in out.stdout
    frame = "vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py:f"
    spec = ServerSpec(python="python", model="m")
    rows = [
        Row("m", "stock", True, None, "0.27.1", True, spec, "crashed", 51150, outcome="crashed",
            seconds=51.52, exception="AssertionError", frame=frame, known_issue=51150,
            matched=True, launch=1),
        Row("m", "stock+fix", False, "chunked-local-fix", "0.27.1", True, spec, "started",
            outcome="started", seconds=3.0, answered=True, matched=True, launch=1),
    ]  # fmt: skip
    path = tmp_path / "outcomes.csv"
    pd.DataFrame([r.record() for r in rows], columns=list(OUTCOMES.columns)).to_csv(path)
    back = OUTCOMES.read(tmp_path)
    assert back is not None

    def text(table: Any) -> str:
        console = Console(width=200, record=True, file=io.StringIO())
        console.print(table)
        return console.export_text()

    live = text(crash_repro_table(rows))
    assert live == text(crash_repro_table(back.to_dict("records")))
    assert "#1 (shared)" in live and "crashed #51150" in live


@pytest.mark.parametrize("command", ["bugs", "sweep", "roundtrip", "stress", "faults"])
def test_help_at_80_columns_names_values_and_lists_what_the_code_has(monkeypatch, command):
    from harness.names import FAULTS

    monkeypatch.setenv("COLUMNS", "80")
    out = _run([command, "--help"])
    assert out.code == 0
    import re

    assert not re.search(r"<[a-z][a-z\[\]| ]*>", out.stdout), out.stdout  # typer's <list[str]>
    assert "…" not in out.stdout, out.stdout
    flat = " ".join(out.stdout.replace("│", " ").split())
    if command == "bugs":
        ids = sorted(p.stem for p in (ROOT / "scenarios" / "bugs").glob("*.toml"))
        assert f"by id: {', '.join(ids)}" in flat
    if command in ("roundtrip", "stress"):
        assert ", ".join(FAULTS[1:]) in flat and "segv-in-worker" in flat
    if command == "bugs":
        assert "--bug ID" in flat and "--releases RELEASES" in flat
    if command == "roundtrip":
        # help.toml's square brackets are text, not rich markup tags that vanish.
        assert "(a scenario with [offload.disk]);" in flat, flat
        assert "disk tier ([offload.disk]):" in flat, flat


@pytest.mark.parametrize(
    "args",
    [
        ("report", str(CRASH_REPRO_RUN), "--json"),
        ("validate", "scenarios/crash-repro.toml", "scenarios/stress.toml", "--json"),
        ("crash-repro", "--dry-run", "--json"),
        ("roundtrip", "--dry-run", "--json"),
        ("stress", "--dry-run", "--json"),
        ("matrix", "--dry-run", "--json"),
        ("faults", "--dry-run", "--json"),
        ("sweep", "--releases", "latest", "--dry-run", "--json"),
        ("bugs", "--releases", "latest", "--dry-run", "--json"),
    ],
    ids=" ".join,
)
def test_json_is_one_document_on_stdout(sandbox, args):
    out = _run(list(args))
    assert out.code == 0, out.stderr
    data = json.loads(out.stdout)
    assert isinstance(data, dict)
    if args[0] == "report":
        assert data["command"] == "crash-repro" and len(data["tables"][0]["rows"]) == 4
    elif args[0] == "validate":
        assert [f["kind"] for f in data["files"]] == ["crash-repro", "stress"]
    else:
        assert data["command"] == args[0]


def test_json_without_dry_run_is_refused(sandbox):
    out = _run(["roundtrip", "--json", "--results-dir", str(sandbox["results"])])
    assert out.code == 2 and "give it with --dry-run" in out.stderr
    assert not sandbox["results"].exists()


LABELLED = {
    "crash-repro": ["--connector", "on", "--variant", "current"],
    "roundtrip": [],
    "stress": [],
    "matrix": ["--family", "full-attention"],
    "faults": ["--fault", "none"],
    "sweep": ["--releases", "latest"],
    "bugs": ["--bug", "51150", "--releases", "latest"],
    "bench": ["--only", "copy"],
}


@pytest.mark.parametrize("command", sorted(LABELLED))
def test_a_label_names_the_run_directory_and_run_json(sandbox, monkeypatch, command):
    """Every run command takes ``--label``: sanitised, after the time in the directory's
    name, and in ``run.json``. Each run stops where it would launch or install."""
    import re

    from harness.server import build_envs

    def stop(*_args: Any, **_kwargs: Any) -> Any:
        raise ContractStop("the contract test installs nothing")

    monkeypatch.setattr(build_envs, "ensure_build", stop)
    results = sandbox["results"]
    out = _run([command, *LABELLED[command], "--label", "nightly/gpu #3", "--results-dir",
                str(results)])  # fmt: skip
    assert out.code in (1, 3), (out.code, out.stderr)
    (run_dir,) = [p.parent for p in results.glob("*/run.json")]
    assert re.fullmatch(rf"\d{{8}}-\d{{6}}-nightly-gpu-3-{command}-[0-9a-f]{{4}}", run_dir.name)
    assert json.loads((run_dir / "run.json").read_text())["label"] == "nightly-gpu-3"
