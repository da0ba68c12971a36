"""The checks of options that name what a run launches or attaches to, made before
anything runs (one line, exit 2): a free ``--port``, a reachable ``--url`` and the
options attaching makes moot, ``--jobs`` lanes, interpreters (``--python``, ``--build``),
faults; and ``launch_options``, what ``roundtrip`` and ``stress`` hand to the planner.

The harness modules they need are imported inside each check: the command line's modules
are all loaded for ``--help``, which launches nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import HarnessError
from harness.names import FAULTS
from harness.server import interpreters, lanes
from harness.server.interpreters import has_gpu
from harness.server.launcher import check_port_free, http_json

if TYPE_CHECKING:
    from harness.commands.roundtrip.plan import RoundtripOptions


def port_free(port: int | None) -> None:
    """A busy ``--port`` is bad input before anything runs (not a failed launch later)."""
    if port is not None:
        check_port_free(port)


def reachable(url: str) -> None:
    """An attach ``--url`` answers before a run directory is made (as roundtrip's plan)."""
    base = url.rstrip("/")
    try:
        http_json(f"{base}/v1/models", None, 30)
    except HarnessError as err:
        raise HarnessError(f"cannot reach {base}: {err}") from None


def check_jobs(jobs: int, port: int | None) -> None:
    """``--jobs`` N > 1: N lanes of this machine's cores (each server its own), so not
    more than its cores, no fixed ``--port`` (N servers at once), and no GPU machine
    (its servers would share the GPU, which the lanes do not split)."""
    if jobs <= 1:
        return

    if port is not None:
        raise HarnessError(f"--jobs {jobs} runs {jobs} servers at once: one --port cannot do")
    if has_gpu():
        raise HarnessError(
            f"--jobs {jobs} splits CPU cores between servers; on a GPU machine they would "
            "share the GPU: use --jobs 1"
        )
    lanes.split(jobs)  # more lanes than cores: one line, exit 2


def given_flags(**given: object) -> list[str]:
    """The options among ``given`` (by name without dashes) that were set, as flags."""
    return [f"--{k.replace('_', '-')}" for k, v in given.items() if v not in (None, [], False)]


def refuse_on_attach(url: str | None, **given: object) -> None:
    """``--url`` attaches to a server someone else launched: an option that only chooses
    what a launch starts is refused (one line, exit 2), the same for every command.
    ``given``: each such option's value by its name without dashes (``engine_arg``)."""
    if url is None:
        return
    named = given_flags(**given)
    if named:
        which = ", ".join(named[:-1]) + f" and {named[-1]}" if len(named) > 1 else named[0]
        verb = "do not apply (they choose" if len(named) > 1 else "does not apply (it chooses"
        raise HarnessError(
            f"--url attaches to a server someone else launched: {which} {verb} what a "
            "launch starts)"
        )


def interpreter(given: str, option: str) -> Path:
    """An interpreter (or the venv holding it) with vLLM, checked the same way for every
    option that names one (``--python``, ``--build``): it exists, runs, and imports vLLM."""
    path = Path(given)
    if path.is_dir():
        path = path / "bin" / "python"
    if not path.is_file():
        what = (
            "wheel, environment or interpreter"
            if option == "--build"
            else "interpreter or environment"
        )
        raise HarnessError(f"{option} {given}: no such {what}")
    try:
        interpreters.probe(str(path))
    except HarnessError as err:
        raise HarnessError(f"{option} {given}: {err}") from None
    return path


def check_builds(builds: list[str]) -> None:
    """``--build``: a wheel (path or URL) or an interpreter / venv, as ``--python``."""
    for given in builds:
        if given.endswith(".whl"):
            if "://" not in given and not Path(given).is_file():
                raise HarnessError(f"--build {given}: no such wheel")
            continue
        interpreter(given, "--build")


def adhoc_variants(pythons: list[str]) -> dict[str, Any]:
    """``--python`` interpreters as variants, named as the sweep names user builds."""
    from harness.commands.sweep import build_label
    from harness.scenario.schema import Variant

    out: dict[str, Any] = {}
    for given in pythons:
        path = interpreter(given, "--python")
        name = build_label(str(path))
        out[name] = Variant(name=name, python=str(path.absolute()), description=f"--python {given}")
    return out


def known_fault(fault: str | None) -> None:
    if fault is not None and fault not in FAULTS:
        raise HarnessError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")


def launch_options(
    variant: str | None,
    python: str | None,
    patch: str | None,
    config: Path | None,
    tp: int | None,
    fault: str | None,
    engine_arg: list[str] | None,
) -> RoundtripOptions:
    """What ``roundtrip`` and ``stress`` forward to ``plan_roundtrip`` (its
    ``RoundtripOptions``): ``--python`` becomes an ad-hoc variant, named as the sweep names
    user builds."""
    adhoc = adhoc_variants([python] if python else [])
    if adhoc and variant:
        raise HarnessError("give --variant or --python, not both")
    return {
        "variant": next(iter(adhoc), variant),
        "patch": patch,
        "config": str(config) if config else None,
        "tp": tp,
        "fault": fault,
        "extra_args": engine_arg,
        "extra_variants": adhoc,
    }
