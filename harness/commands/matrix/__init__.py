"""matrix: every KV-cache spec family the offloading scheduler classifies, on every build.

PR #51161 fixed one branch of ``get_sliding_window_size_in_chunks``; each new attention
architecture meets that function again. The matrix keeps the table nobody kept: one
cell per (family, model geometry, vLLM variant), each a real server with the
offloading connector, judged on three things read from the engine itself:

- the KV-cache spec classes the engine built (``harness.engine.specs``),
- the startup verdict (started; crashed in offloading code; or unsupported, a crash
  elsewhere that says the build cannot run the family at all),
- the full round trip (``harness.commands.roundtrip``) with all of its checks.

Expectations are data (``[[expectations]]`` in the scenario), so a known upstream bug is
a row that matches, and a new one is a row that does not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast, get_args

from harness.commands.matrix.files import MATRIX_CELLS
from harness.commands.roundtrip import (
    RoundtripPlan,
    RoundtripResult,
    StartupFailure,
    build_local_model,
    execute_roundtrip,
    plan_roundtrip,
)
from harness.commands.roundtrip.files import part_writer
from harness.engine.amx import cpu_flags
from harness.errors import BadInput, ExitCode, HarnessError
from harness.results.records import CheckResult
from harness.scenario.matrix import CellExpectation, MatrixEntry, MatrixScenario, MatrixTier
from harness.scenario.roundtrip import RoundtripScenario, load_roundtrip
from harness.scenario.rules import Match, first_match, platform_gap
from harness.scenario.schema import Variant, load_model_config, load_variants
from harness.server import engine_log, kv_layout
from harness.server.crash_signatures import crash_signature, known_label
from harness.server.interpreters import probe

# A root-cause traceback through any of these is a crash in offloading code.
# Frames of offloading code: vLLM's, and the harness's offload backend (its copies and
# its seeded faults) and patches (its report wrappers in harness/engine/specs.py only
# observe, so a crash through them is still the engine's).
OFFLOAD_PATHS = (
    "kv_connector",
    "kv_offload",
    "kv_transfer",
    "harness/engine/host_offload",
    "harness/engine/host_faults",
    "harness/engine/patches",
)


@dataclass
class Cell:
    """One (family, geometry, variant): planned, then filled in as it runs."""

    family: str
    geometry: str  # the geometry file's stem
    variant: str
    vllm_version: str
    rule: CellExpectation
    tier: MatrixTier = "roomy"
    plan: RoundtripPlan | None = None
    plan_error: str = ""
    # outcome
    startup: str = ""  # started | crashed | unsupported | timeout | error
    startup_seconds: float | None = None
    signature: str = ""
    message: str = ""
    known_issue: int | str | None = None
    specs: str = ""  # spec classes by layer count, as the engine reported them
    kernels: str = ""  # attention backend / ISA the engine chose on this host
    engine_groups: list[dict[str, Any]] | None = None
    roundtrip: str = ""  # pass | fail | error | "" (not run)
    failed_checks: list[str] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    matched: bool | None = None
    why: str = ""
    seconds: float = 0.0
    cell_dir: str = ""
    rule_index: int | None = None  # rule's position in the scenario's expectations
    # Why the cell is not launched here: its variant, or every rule that matches it,
    # holds only on another platform ("no expectation on cuda: ..."); "" = launch it.
    skip_reason: str = ""

    @property
    def key(self) -> str:
        return f"{self.family} / {self.geometry} / {self.variant} / {self.tier}"

    @property
    def check_id(self) -> str:
        """The id ``offload-check sweep`` and the bug corpus name this cell by:
        ``<family>/<geometry>``, with ``/<tier>`` for a tier other than the roomy one."""
        return matrix_check_id(self.family, self.geometry, self.tier)

    @property
    def slug(self) -> str:
        return f"{self.family}__{self.geometry}__{self.variant}__{self.tier}".replace("+", "plus")

    def expected_text(self) -> str:
        r = self.rule
        if self.skip_reason:
            return f"skipped: {self.skip_reason}"
        if r.startup != "started":
            extra = f" {known_label(r.known)}" if r.known else ""
            return f"{r.startup}{extra}"
        if r.roundtrip == "fail":
            return (
                "started, fails "
                + (", ".join(r.failing_checks) or "some check")
                + (f" #{r.issue}" if r.issue else "")
            )
        return "started, round trip passes"

    def observed_text(self) -> str:
        if self.startup != "started":
            return f"{self.startup}: {self.signature}" if self.signature else self.startup
        if self.roundtrip == "pass":
            return "started, round trip passes"
        if self.roundtrip == "fail":
            return "started, fails " + ", ".join(self.failed_checks)
        return f"started, round trip {self.roundtrip or 'not run'}"

    def identity(self) -> list[str]:
        """The first columns of every matrix table: which cell, on which build, and the
        spec classes the engine built."""
        return [self.family, self.geometry, self.variant, self.tier, self.vllm_version, self.specs]

    def record(self) -> dict[str, Any]:
        """One row of matrix.csv: its columns (``files.MATRIX_CELLS``) are this
        cell's fields of the same name, except those rendered here."""
        issue = self.rule.known or self.rule.issue
        rendered = {
            "spec_classes": self.specs,
            "known_issue": "" if self.known_issue is None else str(self.known_issue),
            "failed_checks": " ".join(self.failed_checks),
            "expected": self.expected_text(),
            "observed": self.observed_text(),
            "expected_issue": "" if issue is None else str(issue),
            "seconds": round(self.seconds, 2),
        }
        return {c: rendered[c] if c in rendered else getattr(self, c) for c in MATRIX_CELLS.columns}


def matrix_check_id(family: str, geometry: str, tier: str = "roomy") -> str:
    """See :attr:`Cell.check_id`; :func:`parse_check_id` reads it back."""
    return f"{family}/{geometry}" + ("" if tier == "roomy" else f"/{tier}")


def parse_check_id(check: str) -> tuple[str, str, MatrixTier]:
    """``(family, geometry, tier)`` of a :func:`matrix_check_id`."""
    family, geometry, *rest = check.split("/")
    tier = rest[0] if rest else "roomy"
    if len(rest) > 1 or tier not in get_args(MatrixTier):
        raise BadInput(f"not a matrix check id: {check!r} (<family>/<geometry>[/<tier>])")
    return family, geometry, cast(MatrixTier, tier)


@dataclass
class MatrixPlan:
    scenario: MatrixScenario
    base: RoundtripScenario
    cells: list[Cell] = field(default_factory=list)


class MatrixReporter(Protocol):
    def cell_started(self, cell: Cell, index: int, total: int) -> None: ...
    def cell_finished(self, cell: Cell, index: int, total: int) -> None: ...
    def status(self, message: str) -> None: ...
    def phase_done(self, phase: Any) -> None: ...
    def request_done(self, completion: Any) -> None: ...


# The CellExpectation fields compared with equality; ``vllm`` is matched as a specifier
# against the variant's version (first_match's default), ``platform`` against the
# variant's device and the host's CPU flags.
CELL_RULE_FIELDS = ("family", "geometry", "variant", "tier")


def _facts(
    family: str,
    geometry: str,
    variant: str,
    tier: str,
    version: str,
    device: str,
    flags: frozenset[str],
) -> dict[str, object]:
    return {
        "family": family,
        "geometry": geometry,
        "variant": variant,
        "tier": tier,
        "vllm_version": version,
        "device": device,
        "cpu_flags": flags,
    }


def find_rule(
    scn: MatrixScenario,
    family: str,
    geometry: str,
    variant: str,
    version: str,
    device: str = "cpu",
    flags: frozenset[str] | None = None,
    tier: MatrixTier = "roomy",
) -> Match[CellExpectation] | str:
    """The cell's rule (first match wins) and its index in ``scn.expectations``; or, when
    only rules for another platform match, the plan's "no expectation on ..." statement."""
    facts = _facts(
        family, geometry, variant, tier, version, device, cpu_flags() if flags is None else flags
    )
    found = first_match(scn.expectations, facts, fields=CELL_RULE_FIELDS, platform_field="platform")
    if found is not None:
        return found
    gap = platform_gap(scn.expectations, facts, fields=CELL_RULE_FIELDS)
    if gap:
        return gap
    raise BadInput(
        f"{scn.source}: no expectation matches {family} / {geometry} / {variant} / {tier}; "
        "add a catch-all [[expectations]] entry"
    )


def cell_scenario(
    base: RoundtripScenario,
    entry: MatrixEntry,
    geometry: Path,
    variant: str,
    tier: MatrixTier = "roomy",
) -> RoundtripScenario:
    """The base round trip with the entry's geometry and overrides, on the cell's tier.

    Under ``pressure`` the tier holds exactly the targets' chunks under LRU (the round
    trip's ``cpu_bytes_to_use = "targets"``, whatever the entry sizes for a roomy tier):
    the filler evicts every target, so the replay must hit and load nothing and store
    every chunk again. LRU only: under ARC the warm pass's reuse keeps part of the
    targets in T2 by design, which ``offload-check pressure`` judges with its oracle.
    On ``disk`` that tier sits over vLLM's fs disk tier (the round trip's
    ``[offload.disk]``): the replay must hit and load as on a roomy tier, read back from
    disk."""
    data = base.model_dump()
    data.update(
        geometry=str(geometry), variant=variant, hub_model=None, name=f"matrix-{geometry.stem}"
    )
    if entry.server_args is not None:
        data["server"]["extra_args"] = list(entry.server_args)
    if entry.max_model_len is not None:
        data["server"]["max_model_len"] = entry.max_model_len
    if entry.target_tokens is not None:
        data["workload"]["target_tokens"] = list(entry.target_tokens)
    if entry.filler_tokens is not None:
        data["workload"]["filler_tokens"] = entry.filler_tokens
    if entry.filler_margin is not None:
        data["workload"]["filler_margin"] = entry.filler_margin
    if entry.offload_block_size is not None:
        data["offload"]["block_size"] = entry.offload_block_size
    if entry.offload_cpu_bytes is not None:
        data["offload"]["cpu_bytes_to_use"] = entry.offload_cpu_bytes
    if entry.pool_tokens is not None:
        data["server"]["pool_tokens"] = entry.pool_tokens
    if tier in ("pressure", "disk"):
        data["offload"]["cpu_bytes_to_use"] = "targets"
        data["offload"]["extra_config"] = {
            **data["offload"].get("extra_config", {}),
            "eviction_policy": "lru",
        }
    if tier == "disk":
        data["offload"]["disk"] = {}
    scn = RoundtripScenario.model_validate(data)
    scn.source = base.source
    return scn


def plan_matrix(
    scn: MatrixScenario,
    *,
    families: list[str] | None = None,
    variants: list[str] | None = None,
    geometries: list[str] | None = None,
    tiers: list[str] | None = None,
    extra_variants: Mapping[str, Variant] | None = None,
) -> MatrixPlan:
    """Every cell with its expectation and round-trip plan; refuses bad input at once.

    ``tiers`` selects among the scenario's tiers, as ``families`` and ``geometries`` do
    among its entries."""
    base = load_roundtrip(scn.resolve(scn.roundtrip))
    known_variants = load_variants(base.resolve(base.variants_file), extra_variants)
    names = variants or scn.variants
    for n in names:
        if n not in known_variants:
            raise BadInput(f"unknown variant {n!r}; known: {', '.join(known_variants)}")
    entries = list(scn.entries)
    all_families = sorted({e.family for e in entries})
    for f in families or []:
        if f not in all_families:
            raise BadInput(f"unknown family {f!r}; in this matrix: {', '.join(all_families)}")
    stems = [Path(e.geometry).stem for e in entries]
    for g in geometries or []:
        if g not in stems:
            raise BadInput(f"unknown geometry {g!r}; in this matrix: {', '.join(stems)}")
    scenario_tiers = list(dict.fromkeys(scn.tiers))
    for t in tiers or []:
        if t not in scenario_tiers:
            raise BadInput(f"unknown tier {t!r}; in this matrix: {', '.join(scenario_tiers)}")
    chosen_tiers = [t for t in scenario_tiers if not tiers or t in tiers]
    envs = {n: probe(known_variants[n].python) for n in names}
    versions = {n: env.vllm_version for n, env in envs.items()}
    flags = cpu_flags()
    plan = MatrixPlan(scn, base)
    for entry, stem in zip(entries, stems, strict=True):
        if families and entry.family not in families:
            continue
        if geometries and stem not in geometries:
            continue
        geometry = scn.resolve(entry.geometry)
        actual = kv_layout.family(load_model_config(geometry))
        if actual != entry.family:
            raise BadInput(
                f"{scn.source}: {entry.geometry} is a {actual} model (by its layers), "
                f"listed as family {entry.family}"
            )
        for n in names:
            for tier in chosen_tiers:
                device = envs[n].device
                found = find_rule(scn, entry.family, stem, n, versions[n], device, flags, tier)
                if isinstance(found, str):  # rules for other platforms only: said, not run
                    cell = Cell(entry.family, stem, n, versions[n], CellExpectation(why=found))
                    cell.skip_reason = found
                else:
                    cell = Cell(
                        entry.family, stem, n, versions[n], found.rule, rule_index=found.index
                    )
                cell.tier = tier
                platform = known_variants[n].platform
                if platform and (off := platform.mismatch(device, flags)):
                    cell.skip_reason = (
                        f"variant {n} holds only on {platform.describe()}, not on {off}"
                    )
                try:
                    cell.plan = plan_roundtrip(
                        cell_scenario(base, entry, geometry, n, tier),
                        variant=n,
                        extra_variants=extra_variants,
                    )
                except BadInput as err:
                    # A plan the harness refuses (say, a prompt longer than the model) is
                    # the scenario's fault: the whole run is bad input, not one red cell.
                    raise BadInput(f"{cell.key}: {err}") from None
                plan.cells.append(cell)
    if not plan.cells:
        raise BadInput("no cell matches the --family/--geometry/--variant/--tier selection")
    return plan


def _classify_crash(cell: Cell, lines: list[str], err: StartupFailure, scn: MatrixScenario) -> None:
    if err.state == "timeout":
        cell.startup = "timeout"
        cell.signature = f"no /health after {err.seconds:.0f}s"
        return
    sig = crash_signature(lines, err.returncode, scn.known_crashes)
    in_offload = any(any(p in path for p in OFFLOAD_PATHS) for path in sig.paths)
    cell.startup = "crashed" if in_offload else "unsupported"
    cell.signature, cell.message, cell.known_issue = sig.summary(), sig.message, sig.known


def judge_cell(cell: Cell) -> None:
    """Compare a finished cell with its rule; sets ``matched`` and a one-line ``why``."""
    r = cell.rule
    if cell.startup != r.startup:
        cell.matched = False
        cell.why = cell.why or f"expected {r.startup} at start, got {cell.startup}"
        return
    if r.startup != "started":
        if r.known is not None and cell.known_issue != r.known:
            cell.matched = False
            cell.why = f"crash does not match known issue {known_label(r.known)}"
        elif r.error and r.error not in f"{cell.signature} {cell.message}":
            cell.matched, cell.why = False, f"crash message lacks {r.error!r}"
        else:
            cell.matched, cell.why = True, r.why or "as expected"
        return
    if cell.roundtrip not in ("pass", "fail"):
        cell.matched = False
        cell.why = cell.why or "the round trip did not finish"
        return
    if r.roundtrip == "pass":
        cell.matched = cell.roundtrip == "pass"
        cell.why = (
            (r.why or "all checks pass")
            if cell.matched
            else (
                "failed: "
                + "; ".join(
                    f"{c.name}: {c.detail or c.observed}" for c in cell.checks if not c.passed
                )
            )
        )
        return
    want = set(r.failing_checks)
    got = set(cell.failed_checks)
    cell.matched = bool(got) and (not want or got == want)
    cell.why = (
        (r.why or "fails as known")
        if cell.matched
        else (
            "passed: the known failure is gone (update the expectation)"
            if not got
            else f"failing checks {sorted(got)} differ from the expected {sorted(want)}"
        )
    )


def run_cell(cell: Cell, scn: MatrixScenario, out_dir: Path, reporter: MatrixReporter) -> None:
    """Launch, round-trip, classify; never raises for what the engine does. The cell's
    round trip leaves a roundtrip run's files in ``cells/<slug>/``."""
    assert cell.plan is not None
    t0 = time.monotonic()
    cell_dir = out_dir / "cells" / cell.slug
    cell_dir.mkdir(parents=True, exist_ok=True)
    cell.cell_dir = str(cell_dir)
    log = cell_dir / "logs" / "server.log"
    writer = part_writer(cell_dir, cell.plan, cell=cell.key)
    try:
        build_local_model(cell.plan)
        result: RoundtripResult = execute_roundtrip(cell.plan, cell_dir, reporter, writer)
        # execute launched the server (no url), so it timed the start.
        assert result.startup_seconds is not None
        cell.startup, cell.startup_seconds = "started", round(result.startup_seconds, 2)
        cell.engine_groups = result.engine_groups
        cell.checks = result.checks
        cell.failed_checks = [c.name for c in result.checks if not c.passed]
        cell.roundtrip = "pass" if result.passed else "fail"
    except StartupFailure as err:
        lines = err.log_path.read_text(errors="replace").splitlines()
        cell.startup_seconds = round(err.seconds, 2)
        _classify_crash(cell, lines, err, scn)
    except BadInput as err:
        # Found only once the server runs (e.g. a filler sized from the live pool that the
        # CPU tier cannot hold): this cell's plan is impossible, the others may be fine.
        cell.startup = "started" if log.is_file() else "error"
        cell.roundtrip, cell.why = "error", f"impossible plan: {err}"
    except HarnessError as err:
        # Started, then the run broke (server died mid-phase, no answer): not a verdict.
        cell.startup = cell.startup or "started"
        cell.roundtrip, cell.why = "error", str(err)
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    if cell.engine_groups is None and lines:
        cell.engine_groups = kv_layout.parse_report(lines)
    cell.kernels = engine_log.describe(lines)
    cell.specs = (
        kv_layout.spec_summary(cell.engine_groups)
        if cell.engine_groups
        else "not reported (crashed before the KV cache was built)"
        if cell.startup in ("crashed", "unsupported")
        else "not reported"
    )
    cell.seconds = time.monotonic() - t0
    judge_cell(cell)
    # The cell's own run.json ends like a roundtrip run's, with the cell's verdict.
    writer.run_dir.finish(
        "finished",
        int(ExitCode.OK if cell.matched else ExitCode.MISMATCH),
        passed=cell.roundtrip == "pass",
        cell_verdict=cell.record(),
    )


def execute_matrix(
    plan: MatrixPlan,
    out_dir: Path,
    reporter: MatrixReporter,
    on_cell: Callable[[Cell], None],
) -> None:
    """Run every cell in order, one server at a time; ``on_cell`` persists each verdict."""
    total = len(plan.cells)
    for i, cell in enumerate(plan.cells, 1):
        reporter.cell_started(cell, i, total)
        if cell.skip_reason:
            cell.startup, cell.matched, cell.why = "skipped", True, cell.skip_reason
        else:
            run_cell(cell, plan.scenario, out_dir, reporter)
        reporter.cell_finished(cell, i, total)
        on_cell(cell)


def ordered(cells: list[Cell]) -> list[Cell]:
    """Cells that differ from their expectation first, then in plan order."""
    return sorted(cells, key=lambda c: c.matched is not False)
