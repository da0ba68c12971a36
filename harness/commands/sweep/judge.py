"""What the scenarios' rules expect of a cell, and the round trip's verdict by them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.commands import crash_repro
from harness.commands.matrix import Cell, find_rule, parse_check_id
from harness.commands.pressure.plan import rules_for
from harness.commands.sweep.targets import (
    ERROR,
    KIND_CRASH_REPRO,
    KIND_MATRIX,
    KIND_PRESSURE,
    Target,
)
from harness.engine import amx
from harness.results.records import SweepCell
from harness.scenario.roundtrip import RoundtripExpectation, expectation_for
from harness.server.crash_signatures import (
    RowContext,
    expectation_gap,
    known_label,
    match_expectation,
)


def judge_roundtrip(
    cell: SweepCell,
    rules: Sequence[RoundtripExpectation],
    failing: Sequence[str],
    device: str = "cpu",
    flags: frozenset[str] | None = None,
) -> None:
    """A round trip on one build against the scenario's rules for its version (and the
    build's device, for rules that say where they hold): with no rule matching, every
    check must pass; a ``fail`` rule names exactly the checks that fail (set equality, as
    the faults sweep judges); a ``crashed`` rule with an issue wants that known crash."""
    found = expectation_for(
        rules, cell.vllm_version, device, amx.cpu_flags() if flags is None else flags
    )
    rule = found.rule if found else RoundtripExpectation(why="every check passes")
    cell.rule = found.index if found else None
    label = known_label(rule.issue)
    checks = f" ({', '.join(rule.failing_checks)})" if rule.failing_checks else ""
    cell.expected = f"{rule.outcome}{checks}" + (f" {label}" if label else "")
    if cell.outcome == ERROR:
        cell.matched = False
        return
    if cell.outcome != rule.outcome:
        cell.matched, cell.why = False, f"expected {rule.outcome}, got {cell.outcome}"
    elif rule.outcome == "crashed" and label and cell.known != label:
        cell.matched = False
        cell.why = f"expected the crash {label}, got {cell.signature or 'another crash'}"
    elif rule.outcome == "fail" and set(failing) != set(rule.failing_checks):
        cell.matched = False
        cell.why = f"expected failing {sorted(rule.failing_checks)}, got {sorted(failing)}"
    else:
        cell.matched = True


def roundtrip_detail(result: Any) -> str:
    """What a round trip measured, in the words a release-to-release diff needs: bytes
    stored and loaded back, external hits on replay, and whether the output matched."""
    by = {p.phase: p.delta for p in result.phases}
    parts = []
    if "cold" in by:
        parts.append(f"stored {int(by['cold'].stored_bytes):,} B")
    if "replay" in by:
        r = by["replay"]
        parts.append(f"loaded {int(r.loaded_bytes):,} B")
        parts.append(f"ext hits {int(r.ext_hits)}/{int(r.ext_queries)}")
    output = next((c for c in result.checks if c.name == "replay-output-identical"), None)
    if output is not None:
        parts.append("output identical" if output.passed else "output differs")
    return ", ".join(parts)


def expected_for(target: Target, check: str, build: str, version: str, device: str = "cpu") -> str:
    """What the scenario's rules expect of ``check`` on a build of vLLM ``version`` running
    on ``device``, worded as the sweep's cells word it; matched through the same rules the
    commands use (``harness.scenario.rules.first_match``), so a dry run shows the sweep's own
    judgement."""
    flags = amx.cpu_flags()
    if target.kind == KIND_CRASH_REPRO:
        model, mode = check.split("/")
        entry = next(m for m in crash_repro.load_models(target.scenario, None) if m.name == model)
        ctx = RowContext(
            build, version, "none", mode == "connector-on", bool(entry.chunked_local_layers), model
        )
        ctx.device, ctx.cpu_flags = device, flags
        found = match_expectation(ctx, target.scenario.expectations)
        if found is None:
            return expectation_gap(ctx, target.scenario.expectations) or "no rule"
        label = known_label(found.rule.known)
        return found.rule.outcome + (f" {label}" if label else "")
    if target.kind == KIND_MATRIX:
        family, geometry, tier = parse_check_id(check)
        m = find_rule(target.scenario, family, geometry, build, version, device, flags, tier)
        if isinstance(m, str):
            return m
        return Cell(family, geometry, build, version, m.rule, tier).expected_text()
    if target.kind == KIND_PRESSURE:
        server = check.split("/", 1)[1]
        srv = next(s for s in target.scenario.servers if s.name == server)
        return rules_for(target.scenario, srv, version, device, flags).expected()
    cell = SweepCell(build, check, target.kind, target.name, "", vllm_version=version)
    judge_roundtrip(cell, target.scenario.expectations, [], device=device, flags=flags)
    return cell.expected
