"""A corpus run planned from what the command line names: the entries, ``--releases``,
``--build`` and ``--variant`` (an unpatched variant of the variants file, as a build)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness.commands import sweep as sw
from harness.commands.bugs.corpus import CorpusRun, plan_corpus
from harness.engine import amx
from harness.errors import HarnessError
from harness.scenario.bugs import BugEntry
from harness.scenario.schema import load_variants
from harness.server.interpreters import has_gpu


def variant_builds(names: Sequence[str], variants_file: Path) -> list[str]:
    """The interpreters of the variants ``names`` (of ``variants_file``), each a build; a
    variant that patches vLLM is refused: its version no longer places it on either side
    of a fix."""
    if not names:
        return []

    known = load_variants(variants_file)
    out = []
    for name in names:
        if name not in known:
            raise HarnessError(f"--variant {name}: unknown; known: {', '.join(known)}")
        if known[name].patch:
            raise HarnessError(
                f"--variant {name} patches vLLM ({known[name].patch}): its version no "
                "longer says which side of a fix it is on; give an unpatched build"
            )
        out.append(known[name].python)
    return out


# A CUDA wheel on a host without a GPU serves nothing (its kernels need the driver; the
# CPU ones are not in it), but its scheduler, connector and manager run on its own CPU
# platform (``harness.engine.cuda_wheel``): its scheduler-level entries are judged, and
# its pressure entries by replaying its own manager (from 0.31); the others are named
# with this reason.
NO_SERVER = (
    "needs a server, and the CUDA wheel serves nothing without a GPU (no CPU kernels); "
    "its scheduler-level and pressure entries run here"
)


def plan_bugs(
    entries: Sequence[BugEntry], releases: str | None, builds: Sequence[str], dist: str
) -> CorpusRun:
    """The entries on the releases ``releases`` names (all when neither releases nor
    builds are given) and the user's builds, as this host can run them (its CPU flags, a
    GPU, each build's device)."""
    planned = sw.choose_builds(releases, builds, dist)
    devices = {b.label: sw.build_device(b, dist) for b in planned}
    gpu = has_gpu()
    serverless = {b.label: NO_SERVER for b in planned if not gpu and sw.cuda_build(b, dist)}
    return plan_corpus(entries, planned, dist, amx.cpu_flags(), gpu, devices, serverless)
