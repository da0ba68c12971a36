"""docs/architecture.md's import rules, checked on the source (ast), so a change that
drags typer or pandas into vLLM's processes fails here, not on a GPU runner."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "harness"
STDLIB = set(sys.stdlib_module_names)


def imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports count too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def top(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize("path", sorted((HARNESS / "engine").glob("*.py")), ids=lambda p: p.name)
def test_engine_side_imports_only_stdlib_torch_vllm_and_names(path):
    bad = {
        m
        for m in imports(path)
        if top(m) not in STDLIB | {"torch", "vllm", "__future__"}
        and m != "harness.names"
        and not m.startswith("harness.engine")
    }
    assert not bad, f"{path.name} imports {sorted(bad)} inside vLLM's processes"


@pytest.mark.parametrize("name", ["names.py", "errors.py"])
def test_leaf_modules_import_nothing_of_the_harness(name):
    assert not {m for m in imports(HARNESS / name) if top(m) == "harness"}


def test_no_library_module_imports_the_cli():
    """replay.py is the one reader of the CLI: it parses a recorded command line with the
    CLI's own option parser, so a replayed argv means what it meant to the run."""
    users = [
        p.relative_to(ROOT)
        for p in HARNESS.rglob("*.py")
        if p.name not in ("cli.py", "__main__.py") and "harness.cli" in imports(p)
    ]
    assert users == [Path("harness/replay.py")]


def test_the_server_argv_is_built_in_one_place():
    """Only ``ServerSpec.argv`` names the API server module in an argv."""
    spelled = [
        p.relative_to(ROOT)
        for p in HARNESS.rglob("*.py")
        if '"--kv-transfer-config"' in p.read_text() or '"--served-model-name"' in p.read_text()
    ]
    assert spelled == [Path("harness/launcher.py")], spelled
