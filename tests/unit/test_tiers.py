"""The test tiers' launch budgets, as the README states them, are what pytest collects.

A launch is what a tier costs; a test added to the PR tier without updating the table
(or a tier silently losing its engine tests) fails here, before it costs a CI run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(r"offload-check: (\d+) server launches in (\d+) tests")


def collected_launches(*marker: str) -> int:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            *marker,
            "tests",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    m = SUMMARY.search(proc.stdout)
    assert m, proc.stdout[-2000:]
    return int(m[1])


def readme_launches(tier: str) -> int:
    row = next(
        ln
        for ln in (ROOT / "README.md").read_text().splitlines()
        if ln.startswith(f"| {tier} | `make test")
    )
    return int(re.search(r"\| (\d+) \(\+\d+ on AMX hosts\) \|$", row)[1])  # type: ignore[index]


@pytest.mark.parametrize(("tier", "marker"), [("PR", ("-m", "not nightly")), ("nightly", ())])
def test_readme_launch_budget_is_what_pytest_collects(tier, marker):
    assert collected_launches(*marker) == readme_launches(tier)


def test_nightly_tier_adds_engine_tests():
    """The nightly tier must hold more than the PR tier (soak, faults, whole matrices)."""
    assert collected_launches("-m", "nightly") > 0
