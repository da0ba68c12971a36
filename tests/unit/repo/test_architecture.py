"""The house rules of docs/architecture.md, checked on the source (ast), every import form
counted: module-level, inside functions, under ``TYPE_CHECKING``, ``from harness import x``
and ``importlib.import_module("harness.x")``. A new back-edge or circle fails here.

Floors, lowest first; a module imports only from its own floor or lower ones:

    names, errors < engine < oracle < scenario < server < results < commands < ui < cli < tools

Inside ``commands/`` later commands build on earlier ones, never the reverse (the order is
``COMMAND_ORDER``), and commands on one step do not import each other. A function-local
import is for start-up speed or a heavy optional dependency; since the whole graph,
function-local imports included, must be layered and acyclic, none can hide a cycle.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
HARNESS = ROOT / "harness"
STDLIB = set(sys.stdlib_module_names)

FLOORS = ["", "engine", "oracle", "scenario", "server", "results", "commands", "ui", "cli", "tools"]
# Inside commands/: each command's step; a command imports only from lower steps (and
# from its own package).
COMMAND_ORDER = {
    "crash_repro": 0,
    "roundtrip": 0,
    "doctor": 0,
    "matrix": 1,
    "faults": 1,
    "stress": 1,
    "pressure": 1,
    "oracle": 1,
    "namespace": 1,
    "bench": 1,
    "sweep": 2,
    "bugs": 3,
    "validate": 4,
    "mutate": 4,
}
# Third-party packages that only some floors may import: typer only in the CLI; rich only
# where a person reads; pandas only where tables are read back. Never in engine/.
ONLY_IN = {
    "typer": {"cli", "tools"},
    "rich": {"ui", "cli", "tools"},
    "pandas": {"results", "ui", "cli", "tools"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in HARNESS.rglob("*.py")}


def resolve(name: str) -> str | None:
    """The harness module an imported name lives in (``harness.x.y`` may be a symbol)."""
    while name:
        if name in MODULES:
            return name
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return None


def imported(path: Path) -> Iterator[tuple[str, int]]:
    """Every module name the file imports, with its line, at any depth."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:  # relative: from the file's own package
                pkg = module_name(path).split(".")
                if path.name != "__init__.py":
                    pkg = pkg[:-1]
                base = ".".join([*pkg[: len(pkg) - node.level + 1], node.module])
            yield base, node.lineno
            for a in node.names:  # from harness import cli: the module harness.cli
                yield f"{base}.{a.name}", node.lineno
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value, node.lineno


def edges() -> dict[str, dict[str, int]]:
    """module -> {harness module it imports: first line}"""
    out: dict[str, dict[str, int]] = {}
    for name, path in MODULES.items():
        deps: dict[str, int] = {}
        for imp, line in imported(path):
            target = resolve(imp) if imp.split(".")[0] == "harness" else None
            if target and target != name and not name.startswith(target + "."):
                deps.setdefault(target, line)
        out[name] = deps
    return out


def floor(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("names", "errors"):
        return 0
    if parts[1] == "__main__":
        return len(FLOORS)
    return FLOORS.index(parts[1])


def command(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "commands" else None


def back_edges(graph: dict[str, dict[str, int]]) -> list[str]:
    bad = []
    for src, deps in sorted(graph.items()):
        for dst, line in sorted(deps.items()):
            where = f"{MODULES[src].relative_to(ROOT)}:{line} imports {dst}"
            if floor(dst) > floor(src):
                bad.append(f"{where} (floor {FLOORS[floor(dst)]} is above {FLOORS[floor(src)]})")
                continue
            a, b = command(src), command(dst)
            if a and b and a != b and COMMAND_ORDER[b] >= COMMAND_ORDER[a]:
                bad.append(f"{where} (command {b} is not below {a})")
    return bad


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_every_module_sits_on_a_known_floor():
    for name in MODULES:
        parts = name.split(".")
        assert len(parts) == 1 or parts[1] in {*FLOORS, "names", "errors", "__main__"}, name
        if command(name):
            assert command(name) in COMMAND_ORDER, name


def test_imports_run_one_way():
    assert back_edges(edges()) == []


def test_no_import_circle_counting_function_local_imports():
    assert cycles(edges()) == []


def test_the_checks_see_a_planted_back_edge_and_circle():
    """Seeded fault: results importing a command (the old result_kinds -> stress link)."""
    graph = {k: dict(v) for k, v in edges().items()}
    graph["harness.results.tables"]["harness.commands.stress.judge"] = 1
    assert any("harness.commands.stress.judge" in e for e in back_edges(graph))
    graph["harness.server.launcher"]["harness.results.run_directory"] = 1
    assert any("harness.server.launcher" in c for c in cycles(graph))


@pytest.mark.parametrize("path", sorted((HARNESS / "engine").glob("*.py")), ids=lambda p: p.name)
def test_engine_side_imports_only_stdlib_torch_vllm_and_names(path):
    bad = {
        m
        for m, _ in imported(path)
        if m.split(".")[0] not in STDLIB | {"torch", "vllm", "__future__"}
        and resolve(m) not in ("harness.names", "harness")
        and not m.startswith("harness.engine")
    }
    assert not bad, f"{path.name} imports {sorted(bad)} inside vLLM's processes"


@pytest.mark.parametrize("name", ["names.py", "errors.py"])
def test_leaf_modules_import_nothing_of_the_harness(name):
    assert not {m for m, _ in imported(HARNESS / name) if m.split(".")[0] == "harness"}


@pytest.mark.parametrize("package", sorted(ONLY_IN))
def test_heavy_interfaces_stay_on_their_floors(package):
    users = {
        module_name(p).split(".")[1]
        for p in HARNESS.rglob("*.py")
        if any(m.split(".")[0] == package for m, _ in imported(p))
    }
    assert users <= ONLY_IN[package], f"{package} imported on {sorted(users - ONLY_IN[package])}"


def test_no_library_module_imports_the_cli():
    """The tools are the only readers of the CLI: the replay parses a recorded command line
    with the CLI's own option parser, the GPU rehearsal plans with the CLI's commands."""
    graph = edges()
    users = sorted(m for m, deps in graph.items() if any(d.startswith("harness.cli") for d in deps))
    assert all(m.startswith(("harness.tools", "harness.cli", "harness.__main__")) for m in users)


def test_the_server_argv_is_built_in_one_place():
    """Only ``ServerSpec.argv`` names the API server module in an argv."""
    spelled = [
        p.relative_to(ROOT)
        for p in HARNESS.rglob("*.py")
        if '"--kv-transfer-config"' in p.read_text() or '"--served-model-name"' in p.read_text()
    ]
    assert spelled == [Path("harness/server/launcher.py")], spelled


ARCH_DOC = ROOT / "docs" / "architecture.md"
_PATH = re.compile(r"`((?:harness/)?(?:[a-z_]+/)*[a-z_]+(?:\.py|/))`")


def _doc_paths() -> set[str]:
    return set(_PATH.findall(ARCH_DOC.read_text()))


def _exists(ref: str) -> bool:
    """A path the page names, taken from the harness root or from any floor (the page
    says `server/launcher.py` in the server's row and `commands/faults.py` in prose)."""
    if (ROOT / ref).exists():  # scenarios/, tests/...
        return True
    ref = ref.removeprefix("harness/")
    roots = [HARNESS, *(HARNESS / d for d in FLOORS if d), *HARNESS.glob("*/*/")]
    return any((r / ref).exists() for r in roots)


def test_the_architecture_page_names_only_what_exists():
    missing = sorted(ref for ref in _doc_paths() if not _exists(ref))
    assert not missing, f"docs/architecture.md names what is not in harness/: {missing}"


def page_blocks(text: str) -> list[str]:
    """The page cut where one statement about a folder ends: each table row alone, else
    each paragraph, a paragraph ending in ``:`` together with the list that follows it
    (the engine section's sentence and its bullets)."""
    blocks: list[str] = []
    for chunk in re.split(r"\n\s*\n", text):
        rows = [ln for ln in chunk.splitlines() if ln.startswith("|")]
        if rows:
            blocks += rows
        elif blocks and chunk.lstrip().startswith("- ") and blocks[-1].rstrip().endswith(":"):
            blocks[-1] += "\n" + chunk
        else:
            blocks.append(chunk)
    return blocks


def _under(path: str, ref: str) -> bool:
    """``ref`` (as the page spells it, ``harness/`` or not) is ``path`` or its tail."""
    ref = ref.removeprefix("harness/").rstrip("/")
    return path == ref or path.endswith("/" + ref)


def unnamed_modules(text: str, modules: Iterable[str]) -> list[str]:
    """The modules (paths under ``harness/``) the page does not name. A module is named by
    a path that ends in its own (`` `server/launcher.py` ``, `` `commands/bugs/steps.py` ``),
    or by its file name in a row or paragraph that also names its folder
    (`` `harness/server/` `` ... `` `launcher.py` ``): the folder's sentence covers only
    the modules it lists, and a file name the page gives in another folder's sentence
    (every command has a `` `plan.py` ``) names none here."""
    paths = set(_PATH.findall(text))
    blocks = [(set(_PATH.findall(b)), b) for b in page_blocks(text)]
    out = []
    for module in sorted(modules):
        name = module.rsplit("/", 1)[-1]
        if name in ("__init__.py", "__main__.py"):
            continue
        # by a path with its folder in it; a top-level module only as `harness/<name>`
        by_path = [p for p in paths if _under(module, p)]
        if any("/" in p.removeprefix("harness/") or p == f"harness/{module}" for p in by_path):
            continue
        folder = module.rsplit("/", 1)[0] if "/" in module else ""
        if folder and any(
            f"`{name}`" in block and any(r.endswith("/") and _under(folder, r) for r in refs)
            for refs, block in blocks
        ):
            continue
        out.append(module)
    return out


def harness_modules() -> list[str]:
    return sorted(str(p.relative_to(HARNESS)) for p in HARNESS.rglob("*.py"))


def test_the_architecture_page_names_every_module():
    unnamed = unnamed_modules(ARCH_DOC.read_text(), harness_modules())
    assert not unnamed, f"docs/architecture.md does not say what these do: {unnamed}"


def test_the_page_check_sees_a_module_it_does_not_name():
    """Seeded faults: a new module in a folder the page describes, named nowhere; and one
    whose file name the page gives only in other folders' sentences (``run.py`` is in
    several command rows, none of them the engine's). Each is reported."""
    text = ARCH_DOC.read_text()
    assert "`harness/engine/`" in text and "`run.py`" in text  # the folder and the name are there
    planted = ["engine/a_new_module_nobody_named.py", "engine/run.py"]
    assert unnamed_modules(text, [*harness_modules(), *planted]) == planted


def test_a_folder_sentence_names_only_the_modules_it_lists():
    text = (
        "| `harness/pkg/` | `a.py` (one job), `b.py` (another) |\n"
        "| `harness/other/` | `c.py` |\n\n"
        "`pkg/d.py` is named by its path. The engine side:\n\n"
        "- `e.py`: named in a list under a sentence naming no folder\n"
    )
    modules = ["pkg/a.py", "pkg/b.py", "pkg/c.py", "pkg/d.py", "pkg/e.py", "pkg/sub/a.py"]
    # c.py is listed for another folder, e.py under no folder; pkg/sub/ is not pkg/
    assert unnamed_modules(text, modules) == ["pkg/c.py", "pkg/e.py", "pkg/sub/a.py"]
