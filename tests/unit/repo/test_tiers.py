"""The test tiers' launch budgets, as docs/development.md states them, are what pytest collects.

A launch is what a tier costs; a test added to the PR tier without updating the table
(or a tier silently losing its engine tests) fails here, before it costs a CI run.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TIERS = re.compile(r"offload-check tiers: pr=(\d+) nightly=(\d+) weekly=(\d+)")


@functools.cache
def collected_launches() -> dict[str, int]:
    """Every tier's launches from one ``--collect-only`` of the whole suite."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    m = TIERS.search(proc.stdout)
    assert m, proc.stdout[-2000:]
    return {"PR": int(m[1]), "nightly": int(m[2]), "weekly": int(m[3])}


def documented_launches(tier: str) -> int:
    row = next(
        ln
        for ln in (ROOT / "docs" / "development.md").read_text().splitlines()
        if ln.startswith(f"| {tier} | `make test")
    )
    return int(re.search(r"\| (\d+) \(\+\d+ on AMX hosts\) \|$", row)[1])  # type: ignore[index]


@pytest.mark.parametrize("tier", ["PR", "nightly", "weekly"])
def test_documented_launch_budget_is_what_pytest_collects(tier):
    assert collected_launches()[tier] == documented_launches(tier)


def test_each_tier_adds_engine_tests():
    """The nightly tier holds more than the PR tier (soak, faults, whole matrices), the
    weekly more than the nightly (release sweeps, restarts, TP 4)."""
    launches = collected_launches()
    assert launches["weekly"] > launches["nightly"] > launches["PR"] > 0


@pytest.mark.parametrize(
    ("selection", "tier"),
    # `make test` selects -m "not nightly", `make test-nightly` -m "not weekly"; every
    # weekly test is marked nightly too, so the PR tier never runs one.
    [("not nightly", "PR"), ("not weekly", "nightly")],
)
def test_each_make_selection_reports_its_tiers_budget(selection, tier):
    proc = subprocess.run(
        [
            sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
            "-m", selection, "tests/integration",
        ],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    m = re.search(r"offload-check: (\d+) server launches", proc.stdout)
    assert m and int(m[1]) == collected_launches()[tier], proc.stdout[-2000:]
