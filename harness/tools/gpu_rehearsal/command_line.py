"""``python -m harness.tools.gpu_rehearsal``: an ``offload-check`` command line rehearsed
here (default: the nightly round trip), the nightly's release (``--nightly-release``,
``--record``), or the other-interpreter side (``--worker``); one line per launch.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.errors import BadInput, HarnessError
from harness.names import PATCH_NONE
from harness.tools.gpu_rehearsal.launch import PlannedLaunch, Rehearsal, RehearsalError, mismatches
from harness.tools.gpu_rehearsal.nightly_release import (
    SCOUT_COMMAND,
    nightly_env_python,
    nightly_pin,
    rehearse_release,
    write_record,
)
from harness.tools.gpu_rehearsal.planning import plan_command
from harness.tools.gpu_rehearsal.stages import rehearse
from harness.tools.gpu_rehearsal.worker import (
    WORKER_MARKER,
    is_this_interpreter,
    rehearse_elsewhere,
    run_worker,
)


def _print_results(results: Sequence[tuple[PlannedLaunch, Rehearsal | RehearsalError]]) -> int:
    bad = 0
    for launch, res in results:
        if isinstance(res, RehearsalError):
            bad += 1
            print(f"REJECTED {res}")
            continue
        problems = mismatches(launch.intended, res.parsed) + mismatches(launch.intended, res.engine)
        bad += bool(problems)
        print(
            f"{'MISMATCH' if problems else 'ok'} {launch.label}: vLLM {res.vllm_version} "
            f"on {res.platform or '?'} passed {', '.join(res.passed)}; "
            f"stopped: {res.stopped or 'after every stage'}"
        )
        for problem in problems:
            print(f"  {problem}")
    return bad


def _main_release(record: bool, release: str | None = None) -> int:
    dist, version = nightly_pin()
    print(f">> the GPU nightly installs {dist}=={version} (Makefile, make setup GPU=1)")
    if release is not None and release != version:
        if record:
            raise BadInput(
                f"--record keeps the pin's rehearsal ({version}); {release} is rehearsed "
                "without it (move the pin in the Makefile first)"
            )
        print(f">> rehearsing {dist}=={release} instead (--release)")
        version = release
    python = nightly_env_python(
        create=True, on_step=lambda m: print(f"   {m}", flush=True), release=version
    )
    print(f">> rehearsing on {python}", flush=True)
    res = rehearse_release(python, dist=dist, release=version)
    _print_results(res.launches)
    for name, verdict in res.seeded.items():
        word = "caught" if verdict["caught"] else "MISSED"
        print(f"{word} seeded rejection {name} (at {verdict['stage']}): {verdict['observed']}")
    print(f">> {res.build.get('platform', '')}; {res.seconds:.0f}s")
    if record:
        if res.problems:
            print(f">> not recorded: {len(res.problems)} problem(s)")
        else:
            print(f">> recorded in {write_record(res)}")
    return 1 if res.problems else 0


USAGE = """usage: python -m harness.tools.gpu_rehearsal [offload-check command ...]
       python -m harness.tools.gpu_rehearsal --nightly-release [--record] [--release VERSION]

Rehearse an offload-check command's GPU launches here with the CUDA build's own vLLM
(roundtrip, crash-repro or stress; default: the nightly round trip; --python VENV and
--patch as the CLI takes them), or every nightly launch and the seeded rejections on
the release the GPU nightly installs (--release: another release of it, e.g. the release
watch's newer one; --record: write the rehearsal record, the pin's only)."""


def _release_options(args: Sequence[str]) -> tuple[bool, str | None]:
    """``--record`` and ``--release VERSION`` after ``--nightly-release``."""
    record, release, rest = False, None, list(args)
    while rest:
        word = rest.pop(0)
        if word == "--record":
            record = True
        elif word == "--release" and rest:
            release = rest.pop(0)
        else:
            raise BadInput(f"--nightly-release takes --record and --release VERSION, not {word!r}")
    return record, release


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.tools.gpu_rehearsal [offload-check command ...]``: rehearse it here.

    Without arguments, the nightly round trip. ``--nightly-release`` rehearses every
    nightly launch and the seeded rejections on the release the GPU nightly installs (its
    environment made when missing); ``--record`` also writes RECORD when all passed.
    ``--worker`` is the other-interpreter side.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--worker"]:
        print(WORKER_MARKER + json.dumps(run_worker(sys.stdin)), flush=True)
        return 0
    if args[:1] in (["--help"], ["-h"]):
        print(USAGE)
        return 0
    try:
        if args[:1] == ["--nightly-release"]:
            return _main_release(*_release_options(args[1:]))
        launches = plan_command(args or list(SCOUT_COMMAND), Path.cwd())
    except HarnessError as err:
        print(f"error: {err}", file=sys.stderr)
        return int(err.exit_code)
    # A patched launch goes to a worker even on this interpreter: the patch would change
    # this process's vLLM for every launch after it.
    here = [x for x in launches if is_this_interpreter(x.python) and x.patch == PATCH_NONE]
    there = [x for x in launches if x not in here]
    results: list[tuple[PlannedLaunch, Rehearsal | RehearsalError]] = []
    for launch in here:
        try:
            results.append((launch, rehearse(launch)))
        except RehearsalError as err:
            results.append((launch, err))
    try:
        results += list(zip(there, rehearse_elsewhere(there), strict=True)) if there else []
    except HarnessError as err:  # a build that cannot rehearse at all: one line
        _print_results(results)
        print(f"error: {err}", file=sys.stderr)
        return int(err.exit_code)
    return 1 if _print_results(results) else 0
