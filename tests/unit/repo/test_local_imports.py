"""The function-local imports of ``harness/``, every one listed with why it waits.

An import belongs at the top of its module (docs/architecture.md, "Floors"). The few that
wait until their function runs are in :data:`LOCAL_IMPORTS`, each ``(path, imported
module)`` pair with its reason; a function-local import not listed fails here, and so
does a listed one that is gone. The reasons are start-up (``offload-check --help``
imports no command, tests/unit/cli/test_cli_startup.py; the scenario models cost
``--help`` ~90 ms, the dry-run renderers ~18 ms) and heavy or optional dependencies on
a path that does not need them (vLLM and torch in modules imported without them,
pandas, matplotlib, transformers, psutil). No entry is there to hide an import cycle:
the layering in tests/unit/repo/test_architecture.py counts these imports too.

The imported module is the ``import`` statement's, or for ``from a import b`` the
module ``a.b`` where that is a harness module (``from harness.commands import sweep``:
``harness.commands.sweep``), else ``a``. ``if TYPE_CHECKING:`` blocks at module level
are not function-local.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HARNESS = ROOT / "harness"

COMMAND = "start-up: --help imports no command; the command's code loads when it runs"
SHOW = "start-up: the command's terminal views import its command package"
PYDANTIC = "start-up: the scenario models (pydantic) add ~90 ms to --help; read when used"
TERMINAL = "start-up: ui/terminal.py finds each command's report views by importing commands/"
DRY_RUN = (
    "start-up: the plan renderers (rich tables) add ~18 ms to --help; only a dry run needs them"
)
COMPARE = "start-up: ui/compare.py reads tables with pandas and walks commands/ for them"
ENGINE_VLLM = (
    "engine: imported where vLLM is not (the CLI side, the plugin while vLLM starts, or "
    "before a drive picks vLLM's platform); vLLM only when this runs"
)
ENGINE_TORCH = "engine: imported where torch is not (the CLI side); torch only when this runs"
PANDAS = "heavy: pandas only where a table file is read back"
MATPLOTLIB = "heavy: matplotlib only where a chart is drawn"
MODEL = "heavy: transformers, tokenizers and torch only where a model is built"
PSUTIL = "optional: psutil is no dependency of the harness (it comes with vLLM)"
WORKER = (
    "the rehearsal worker (python -m harness.tools.gpu_rehearsal --worker) runs in release "
    "envs, which have the harness without its dependencies: standard library only at import"
)
REHEARSAL_VLLM = "the rehearsal imports each build's vLLM (and torch) only in its worker"

LOCAL_IMPORTS: dict[tuple[str, str], str] = {
    ("harness/cli/bench.py", "harness.commands.bench.files"): COMMAND,
    ("harness/cli/bench.py", "harness.commands.bench.measure"): COMMAND,
    ("harness/cli/bench.py", "harness.scenario.crash_repro"): PYDANTIC,
    ("harness/cli/bugs.py", "harness.cli.bugs_show"): SHOW,
    ("harness/cli/bugs.py", "harness.commands.bugs.corpus"): COMMAND,
    ("harness/cli/bugs.py", "harness.commands.bugs.plan"): COMMAND,
    ("harness/cli/bugs.py", "harness.commands.bugs.report"): COMMAND,
    ("harness/cli/bugs.py", "harness.commands.sweep"): COMMAND,
    ("harness/cli/common.py", "harness.ui.dry_run"): DRY_RUN,
    ("harness/cli/compare.py", "harness.ui.compare"): COMPARE,
    ("harness/cli/compare.py", "harness.ui.terminal"): TERMINAL,
    ("harness/cli/crash_repro.py", "harness.cli.crash_repro_show"): SHOW,
    ("harness/cli/crash_repro.py", "harness.commands.crash_repro"): COMMAND,
    ("harness/cli/crash_repro.py", "harness.commands.crash_repro.files"): COMMAND,
    ("harness/cli/crash_repro.py", "harness.scenario.crash_repro"): PYDANTIC,
    ("harness/cli/doctor.py", "harness.commands.doctor.host"): COMMAND,
    ("harness/cli/doctor.py", "harness.commands.doctor.preflight"): COMMAND,
    ("harness/cli/envs.py", "harness.commands.sweep"): COMMAND,
    ("harness/cli/envs.py", "harness.cli.envs_show"): SHOW,
    ("harness/cli/faults.py", "harness.cli.faults_show"): SHOW,
    ("harness/cli/faults.py", "harness.cli.roundtrip_show"): SHOW,
    ("harness/cli/faults.py", "harness.commands.faults"): COMMAND,
    ("harness/cli/faults.py", "harness.commands.roundtrip"): COMMAND,
    ("harness/cli/faults.py", "harness.scenario.roundtrip"): PYDANTIC,
    ("harness/cli/faults.py", "harness.ui.terminal"): TERMINAL,
    ("harness/cli/launch_checks.py", "harness.commands.sweep"): COMMAND,
    ("harness/cli/launch_checks.py", "harness.scenario.schema"): PYDANTIC,
    ("harness/cli/matrix.py", "harness.cli.matrix_show"): SHOW,
    ("harness/cli/matrix.py", "harness.commands.matrix"): COMMAND,
    ("harness/cli/matrix.py", "harness.commands.matrix.files"): COMMAND,
    ("harness/cli/matrix.py", "harness.scenario.matrix"): PYDANTIC,
    ("harness/cli/mutate.py", "harness.cli.mutate_show"): SHOW,
    ("harness/cli/mutate.py", "harness.commands.mutate.execute"): COMMAND,
    ("harness/cli/mutate.py", "harness.commands.mutate.files"): COMMAND,
    ("harness/cli/mutate.py", "harness.commands.mutate.plan"): COMMAND,
    ("harness/cli/mutate.py", "harness.commands.mutate.session"): COMMAND,
    ("harness/cli/mutate.py", "harness.scenario.schema"): PYDANTIC,
    ("harness/cli/namespace.py", "harness.commands.namespace.changes"): COMMAND,
    ("harness/cli/namespace.py", "harness.commands.namespace.files"): COMMAND,
    ("harness/cli/namespace.py", "harness.commands.namespace.judge"): COMMAND,
    ("harness/cli/namespace.py", "harness.commands.namespace.plan"): COMMAND,
    ("harness/cli/namespace.py", "harness.commands.namespace.run"): COMMAND,
    ("harness/cli/namespace.py", "harness.scenario.roundtrip"): PYDANTIC,
    ("harness/cli/oracle.py", "harness.commands.oracle.files"): COMMAND,
    ("harness/cli/oracle.py", "harness.commands.oracle.judge"): COMMAND,
    ("harness/cli/oracle.py", "harness.commands.oracle.plan"): COMMAND,
    ("harness/cli/oracle.py", "harness.commands.oracle.run"): COMMAND,
    ("harness/cli/oracle.py", "harness.scenario.oracle"): PYDANTIC,
    ("harness/cli/oracle.py", "harness.ui.terminal"): TERMINAL,
    ("harness/cli/pressure.py", "harness.cli.pressure_show"): SHOW,
    ("harness/cli/pressure.py", "harness.commands.pressure.files"): COMMAND,
    ("harness/cli/pressure.py", "harness.commands.pressure.plan"): COMMAND,
    ("harness/cli/pressure.py", "harness.commands.pressure.replay"): COMMAND,
    ("harness/cli/pressure.py", "harness.commands.pressure.run"): COMMAND,
    ("harness/cli/pressure.py", "harness.scenario.pressure"): PYDANTIC,
    ("harness/cli/pressure.py", "harness.ui.terminal"): TERMINAL,
    ("harness/cli/report.py", "harness.ui.terminal"): TERMINAL,
    ("harness/cli/roundtrip.py", "harness.cli.roundtrip_show"): SHOW,
    ("harness/cli/roundtrip.py", "harness.commands.roundtrip"): COMMAND,
    ("harness/cli/roundtrip.py", "harness.commands.roundtrip.files"): COMMAND,
    ("harness/cli/roundtrip.py", "harness.scenario.roundtrip"): PYDANTIC,
    ("harness/cli/runs.py", "harness.commands.doctor.host"): COMMAND,
    ("harness/cli/stress.py", "harness.cli.roundtrip_show"): SHOW,
    ("harness/cli/stress.py", "harness.cli.stress_show"): SHOW,
    ("harness/cli/stress.py", "harness.commands.roundtrip"): COMMAND,
    ("harness/cli/stress.py", "harness.commands.stress.files"): COMMAND,
    ("harness/cli/stress.py", "harness.commands.stress.plan"): COMMAND,
    ("harness/cli/stress.py", "harness.commands.stress.run"): COMMAND,
    ("harness/cli/stress.py", "harness.scenario.stress"): PYDANTIC,
    ("harness/cli/sweep.py", "harness.cli.sweep_show"): SHOW,
    ("harness/cli/sweep.py", "harness.commands.sweep"): COMMAND,
    ("harness/cli/sweep.py", "harness.commands.sweep.files"): COMMAND,
    ("harness/cli/validate.py", "harness.commands.validate"): COMMAND,
    ("harness/engine/amx.py", "torch"): ENGINE_TORCH,
    ("harness/engine/cuda_wheel.py", "vllm.platforms.cpu"): ENGINE_VLLM,
    ("harness/engine/cuda_wheel.py", "vllm.triton_utils"): ENGINE_VLLM,
    ("harness/engine/manager_replay.py", "vllm.v1.kv_offload.base"): ENGINE_VLLM,
    ("harness/engine/manager_replay.py", "vllm.v1.kv_offload.cpu.manager"): ENGINE_VLLM,
    ("harness/engine/modelinfo_warm.py", "vllm"): ENGINE_VLLM,
    ("harness/engine/modelinfo_warm.py", "vllm.model_executor.models"): ENGINE_VLLM,
    ("harness/engine/oracle_drive.py", "torch"): ENGINE_TORCH,
    ("harness/engine/oracle_drive.py", "vllm.v1.kv_cache_interface"): ENGINE_VLLM,
    ("harness/engine/oracle_drive.py", "vllm.v1.kv_offload.base"): ENGINE_VLLM,
    ("harness/engine/oracle_drive.py", "vllm.v1.request"): ENGINE_VLLM,
    ("harness/engine/patches.py", "vllm.v1.kv_cache_interface"): ENGINE_VLLM,
    ("harness/engine/scheduler_drive.py", "torch"): ENGINE_TORCH,
    ("harness/engine/store_cases.py", "torch"): ENGINE_TORCH,
    ("harness/engine/store_cases.py", "vllm.v1.kv_cache_interface"): ENGINE_VLLM,
    ("harness/engine/scheduler_drive.py", "vllm.v1.kv_cache_interface"): ENGINE_VLLM,
    ("harness/engine/scheduler_rig.py", "vllm"): ENGINE_VLLM,
    ("harness/engine/scheduler_rig.py", "vllm.config"): ENGINE_VLLM,
    (
        "harness/engine/scheduler_rig.py",
        "vllm.distributed.kv_transfer.kv_connector.v1.offloading.common",
    ): ENGINE_VLLM,
    ("harness/engine/scheduler_rig.py", "vllm.utils.hashing"): ENGINE_VLLM,
    ("harness/engine/scheduler_rig.py", "vllm.v1.core.kv_cache_utils"): ENGINE_VLLM,
    ("harness/engine/scheduler_rig.py", "vllm.v1.core.sched.scheduler"): ENGINE_VLLM,
    ("harness/engine/scheduler_rig.py", "vllm.v1.kv_cache_interface"): ENGINE_VLLM,
    ("harness/engine/scheduler_rig.py", "vllm.v1.kv_offload.base"): ENGINE_VLLM,
    ("harness/engine/scheduler_rig.py", "vllm.v1.outputs"): ENGINE_VLLM,
    ("harness/engine/scheduler_rig.py", "vllm.v1.request"): ENGINE_VLLM,
    ("harness/engine/scheduler_rig.py", "vllm.v1.structured_output"): ENGINE_VLLM,
    ("harness/engine/specs.py", "vllm.platforms"): ENGINE_VLLM,
    ("harness/results/chart.py", "matplotlib"): MATPLOTLIB,
    ("harness/results/chart.py", "matplotlib.colors"): MATPLOTLIB,
    ("harness/results/chart.py", "matplotlib.pyplot"): MATPLOTLIB,
    ("harness/results/ci_summary.py", "pandas"): PANDAS,
    ("harness/results/run_directory.py", "pandas"): PANDAS,
    ("harness/results/tables.py", "pandas"): PANDAS,
    ("harness/server/launcher.py", "psutil"): PSUTIL,
    ("harness/server/model_builder.py", "tokenizers"): MODEL,
    ("harness/server/model_builder.py", "torch"): MODEL,
    ("harness/server/model_builder.py", "transformers"): MODEL,
    ("harness/server/model_builder.py", "transformers.utils"): MODEL,
    ("harness/server/server_lock.py", "psutil"): PSUTIL,
    ("harness/tools/gpu_rehearsal/homes.py", "packaging.version"): WORKER,
    ("harness/tools/gpu_rehearsal/homes.py", "vllm"): REHEARSAL_VLLM,
    ("harness/tools/gpu_rehearsal/nightly_release.py", "harness.server.build_envs"): WORKER,
    ("harness/tools/gpu_rehearsal/nightly_release.py", "harness.server.release_envs"): WORKER,
    ("harness/tools/gpu_rehearsal/planning.py", "harness.cli.app"): WORKER,
    ("harness/tools/gpu_rehearsal/planning.py", "harness.cli.launch_checks"): WORKER,
    ("harness/tools/gpu_rehearsal/planning.py", "harness.cli.options"): WORKER,
    ("harness/tools/gpu_rehearsal/planning.py", "harness.commands.crash_repro"): WORKER,
    ("harness/tools/gpu_rehearsal/planning.py", "harness.commands.roundtrip"): WORKER,
    ("harness/tools/gpu_rehearsal/planning.py", "harness.scenario.crash_repro"): WORKER,
    ("harness/tools/gpu_rehearsal/planning.py", "harness.scenario.roundtrip"): WORKER,
    ("harness/tools/gpu_rehearsal/planning.py", "harness.commands.stress.plan"): WORKER,
    ("harness/tools/gpu_rehearsal/planning.py", "harness.scenario.stress"): WORKER,
    ("harness/tools/gpu_rehearsal/planning.py", "typer.main"): WORKER,
    (
        "harness/tools/gpu_rehearsal/stages.py",
        "vllm.distributed.kv_transfer.kv_connector.factory",
    ): REHEARSAL_VLLM,
    (
        "harness/tools/gpu_rehearsal/stages.py",
        "vllm.distributed.kv_transfer.kv_connector.v1.base",
    ): REHEARSAL_VLLM,
    ("harness/tools/gpu_rehearsal/stages.py", "vllm.engine.arg_utils"): REHEARSAL_VLLM,
    ("harness/tools/gpu_rehearsal/stages.py", "vllm.platforms"): REHEARSAL_VLLM,
    ("harness/tools/gpu_rehearsal/stages.py", "vllm.usage.usage_lib"): REHEARSAL_VLLM,
    ("harness/tools/gpu_rehearsal/stages.py", "vllm.utils.argparse_utils"): REHEARSAL_VLLM,
    ("harness/tools/gpu_rehearsal/stages.py", "vllm.v1.attention.backends.utils"): REHEARSAL_VLLM,
    ("harness/tools/gpu_rehearsal/stages.py", "vllm.v1.kv_cache_interface"): REHEARSAL_VLLM,
    ("harness/tools/gpu_rehearsal/stages.py", "vllm.v1.kv_offload.factory"): REHEARSAL_VLLM,
    ("harness/tools/gpu_rehearsal/worker.py", "torch"): REHEARSAL_VLLM,
    ("harness/ui/listing.py", "harness.commands.bugs.corpus"): COMMAND,
    ("harness/ui/listing.py", "harness.commands.faults"): COMMAND,
    ("harness/ui/listing.py", "harness.scenario.kinds"): PYDANTIC,
    ("harness/ui/listing.py", "harness.scenario.schema"): PYDANTIC,
}


def _is_module(name: str) -> bool:
    rel = ROOT.joinpath(*name.split("."))
    return rel.with_suffix(".py").is_file() or (rel / "__init__.py").is_file()


def _targets(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:  # relative imports: none in harness/ today, read as their package
        base = "." * node.level + base
    return [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base for a in node.names]


def local_imports(source: str) -> Iterator[tuple[int, str]]:
    """(line, imported module) of each import under a def, async def or lambda."""

    def walk(node: ast.AST, in_function: bool) -> Iterator[tuple[int, str]]:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(child):
                    yield child.lineno, target
            yield from walk(child, inside)

    yield from walk(ast.parse(source), False)


def found() -> dict[tuple[str, str], int]:
    """(path, imported module) -> first line, over harness/."""
    out: dict[tuple[str, str], int] = {}
    for path in sorted(HARNESS.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for line, target in local_imports(path.read_text()):
            out.setdefault((rel, target), line)
    return out


def unlisted(here: dict[tuple[str, str], int], listed: dict[tuple[str, str], str]) -> list[str]:
    return sorted(f"{p}:{line} {m}" for (p, m), line in here.items() if (p, m) not in listed)


def gone(here: dict[tuple[str, str], int], listed: dict[tuple[str, str], str]) -> list[str]:
    return sorted(f"{p}: {m}" for p, m in listed if (p, m) not in here)


def test_every_function_local_import_is_listed():
    bad = unlisted(found(), LOCAL_IMPORTS)
    assert not bad, (
        "function-local imports not in LOCAL_IMPORTS (move them to the top of the module, "
        f"or list them with the start-up measurement or dependency that keeps them): {bad}"
    )


def test_every_listed_import_still_exists():
    bad = gone(found(), LOCAL_IMPORTS)
    assert not bad, f"LOCAL_IMPORTS lists imports that are gone, remove them: {bad}"


def test_every_reason_is_one_line():
    assert all(reason and "\n" not in reason for reason in LOCAL_IMPORTS.values())


def test_the_check_sees_function_local_imports_and_nothing_else():
    """Seeded: imports in a function, a nested def and a method are found; module-level
    ones, an ``if TYPE_CHECKING:`` block and a try block at module level are not. A new
    one fails the list, and so does an entry whose import is gone."""
    source = """
from typing import TYPE_CHECKING
import json
if TYPE_CHECKING:
    from harness.scenario.schema import Variant
try:
    import tomllib
except ImportError:
    tomllib = None
def f():
    import os
    def g():
        from harness.commands import sweep
class C:
    def m(self):
        from harness.server.launcher import ServerSpec
"""
    lines = sorted(local_imports(source))
    assert lines == [(11, "os"), (13, "harness.commands.sweep"), (16, "harness.server.launcher")]
    here = {("harness/x.py", m): line for line, m in lines}
    listed = {("harness/x.py", "os"): "why", ("harness/x.py", "shutil"): "why"}
    assert unlisted(here, listed) == [
        "harness/x.py:13 harness.commands.sweep",
        "harness/x.py:16 harness.server.launcher",
    ]
    assert gone(here, listed) == ["harness/x.py: shutil"]
