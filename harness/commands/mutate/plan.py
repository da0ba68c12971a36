"""A mutation session's plan: the build, the module, the mutants and the commands, all
known before any copy or launch (what ``--dry-run`` prints).

The target is resolved in the build's own environment (``--variant``/``--python``), so
the session mutates the vLLM that build has, and records the file's sha256: a resumed
session on a changed file would renumber cosmic-ray's occurrences under the old ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.commands.mutate.execute import DEFAULT_TIMEOUT_S, MutateCommand
from harness.commands.mutate.mutants import (
    Mutant,
    enumerate_mutants,
    resolve_target,
    sample,
    site_packages,
)
from harness.commands.mutate.sandbox import env_prefix, file_sha256
from harness.errors import BadInput
from harness.server.interpreters import probe


@dataclass
class MutatePlan:
    """Everything a session needs before it runs."""

    python: str  # the build's interpreter (the unmutated baseline runs on it)
    prefix: Path  # its environment (copied per mutant)
    site_rel: str  # its site-packages, relative to the prefix
    module: str
    relpath: str  # the target under site-packages
    path: Path
    sha256: str
    vllm_version: str
    mutants: list[Mutant]  # the session's mutants (a sample, or all)
    total: int  # every mutant the operators give for the file
    commands: list[MutateCommand]
    seed: int
    sample_size: int | None  # None: --all
    timeout_s: float = DEFAULT_TIMEOUT_S
    shard: tuple[int, int] | None = None
    resume: Path | None = None  # the run directory of the session it continues
    # Run mutants on lines no command's baseline executed too (by default they are
    # survivors without a run: ``execute.skip_unreached``).
    run_unreached: bool = False

    def meta(self) -> dict[str, Any]:
        """What the session file keeps of the plan (and a resume must agree with)."""
        return {
            "target": self.module,
            "relpath": self.relpath,
            "source_sha256": self.sha256,
            "vllm_version": self.vllm_version,
            "python": self.python,
            "commands": [c.name for c in self.commands],
            # Each seeded fault's command: the checks it must fail on this build.
            "expect_failing": {
                c.name: sorted(c.expect_failing) for c in self.commands if c.expect_failing
            },
            "seed": self.seed,
            "sample": self.sample_size,
            "total_mutants": self.total,
            "timeout_s": self.timeout_s,
            "run_unreached": self.run_unreached,
        }

    def describe(self) -> dict[str, Any]:
        """``run.json``'s ``plan`` and the dry run's JSON."""
        return {
            **self.meta(),
            "shard": list(self.shard) if self.shard else None,
            "mutants": [m.record() for m in self.mutants],
        }


@dataclass
class MergePlan:
    """``--merge``: the sessions of shard runs, joined into one report."""

    runs: list[Path]

    @classmethod
    def of(cls, runs: Sequence[Path]) -> MergePlan:
        for run in runs:
            if not (run / "session.sqlite").is_file():
                raise BadInput(f"--merge {run}: no session.sqlite there (not a mutate run)")
        return cls(list(runs))


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``--shard i/n`` (0-based): this runner's part of the session."""
    if not text:
        return None
    try:
        i, n = (int(p) for p in text.split("/"))
    except ValueError:
        raise BadInput(f"--shard {text}: give INDEX/COUNT, e.g. 0/4") from None
    if n < 1 or not 0 <= i < n:
        raise BadInput(f"--shard {text}: need 0 <= INDEX < COUNT")
    return i, n


def plan_mutate(
    target: str,
    commands: Sequence[str],
    python: str,
    *,
    sample_size: int | None,
    seed: int,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    shard: str | None = None,
    chosen: Sequence[str] = (),
) -> MutatePlan:
    """Refuses what cannot run with one line: no command, a target outside the build's
    site-packages, a sample larger than the file's mutants."""
    if not commands:
        raise BadInput(
            "mutate needs at least one --command (suite, oracle, roundtrip, stress, pressure, "
            "or a scenario)"
        )
    cmds = MutateCommand.parse_all(commands)
    if len({c.slug for c in cmds}) != len(cmds):
        raise BadInput("each --command once (two of them would share a results directory)")
    build = probe(python)
    version = build.vllm_version
    # A seeded fault's scenario is judged by what it expects of this build, where it runs.
    cmds = [c.expecting(version, build.device) for c in cmds]
    site = site_packages(python)
    prefix = env_prefix(python)
    try:
        site_rel = str(site.relative_to(prefix))
    except ValueError:
        raise BadInput(f"{python}: its site-packages {site} is not inside {prefix}") from None
    module, relpath, path = resolve_target(target, site)
    if not relpath.startswith("vllm/"):
        raise BadInput(f"--target {target}: {relpath} is not vLLM's code (mutate copies vllm/)")
    every = enumerate_mutants(path, relpath, module)
    total = len(every)
    if not every:
        raise BadInput(f"--target {target}: the operators give no mutant in {relpath}")
    if chosen:
        by_id = {m.id: m for m in every}
        unknown = [c for c in chosen if c not in by_id]
        if unknown:
            raise BadInput(f"--mutant {unknown[0]}: no mutant of {relpath} has that id")
        every = [by_id[c] for c in dict.fromkeys(chosen)]
        sample_size = None
    if sample_size is not None and sample_size > len(every):
        raise BadInput(f"--sample {sample_size}: {relpath} has only {len(every)} mutants")
    return MutatePlan(
        python=python,
        prefix=prefix,
        site_rel=site_rel,
        module=module,
        relpath=relpath,
        path=path,
        sha256=file_sha256(path),
        vllm_version=version,
        mutants=sample(every, sample_size, seed),
        total=total,
        commands=cmds,
        seed=seed,
        sample_size=sample_size,
        timeout_s=timeout_s,
        shard=parse_shard(shard),
    )
