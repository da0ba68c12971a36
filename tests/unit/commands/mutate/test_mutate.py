"""offload-check mutate's foundation: mutants, copies of the environment, the session store.

Everything runs on a small fake site-packages (a ``vllm`` package holding one LRU-like
file) and a fake venv around it, except one test that copies the real .venv and imports
the real 0.32.0 LRU policy from the copy (it imports torch: a few seconds).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from cosmic_ray import work_item
from cosmic_ray.work_db import WorkDB, use_db

from harness.commands.mutate import (
    REDUCED_OPERATORS,
    VERDICTS,
    Mutant,
    Session,
    enumerate_mutants,
    env_prefix,
    file_sha256,
    make_copy,
    merge,
    mutated_source,
    remove_copy,
    replace_module,
    resolve_target,
    sample,
    site_packages,
)
from harness.errors import BadInput

RELPATH = "vllm/v1/kv_offload/cpu/policies/lru.py"
MODULE = "vllm.v1.kv_offload.cpu.policies.lru"
SITE_REL = "lib/python3.11/site-packages"

LRU = '''\
"""A stand-in for vLLM's LRU policy: comparisons, arithmetic, loops, annotations."""

from collections import OrderedDict

LABEL = "zürich"  # non-ASCII before an annotation: ast counts bytes, parso characters
LIMIT = 64


class LRUPolicy:
    def __init__(self, capacity: int, *, slack: int = 0) -> None:
        self.capacity = capacity + slack
        self.blocks: OrderedDict[int, int] = OrderedDict()
        self.flags = 1 | 2

    def touch(self, key: int, size: int | None = None) -> bool:
        if key in self.blocks:
            self.blocks.move_to_end(key)
            return True
        self.blocks[key] = size or 1
        return False

    def evict(self, n: int) -> list[int]:
        selected: list[int] = []
        for key in self.blocks:
            if len(selected) >= n:
                break
            selected.append(key)
        return selected

    def fits(self, used: int, extra: int) -> bool:
        return (
            used + extra
            <= self.capacity
        )

    def walk(self, low: int, high: int) -> int:
        total = 0
        for i in range(
            low, high
        ):
            total += i
        return total


def even(x: int | None, label: str = "ü", y: int | None = None) -> bool | None:
    return x is not None and x % 2 == 0
'''


def write(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def env(tmp_path: Path) -> Path:
    """A fake venv: bin/python -> the base interpreter, pyvenv.cfg naming its home, a
    console script, lib64 -> lib, and a site-packages with vllm (and bytecode) and another
    package."""
    prefix = tmp_path / "env"
    site = prefix / SITE_REL
    parts = Path(RELPATH).parts
    for i in range(1, len(parts)):
        write(site.joinpath(*parts[:i], "__init__.py"))
    write(site / RELPATH, LRU)
    write(site / "vllm/v1/kv_offload/cpu/policies/__pycache__/lru.cpython-311.pyc", "stale")
    write(site / "otherpkg/__init__.py", "X = 1\n")
    (prefix / "bin").mkdir()
    base = os.path.realpath(sys.executable)
    os.symlink(base, prefix / "bin/python")
    os.symlink("python", prefix / "bin/python3")
    write(prefix / "bin/some-tool", f"#!{prefix}/bin/python\nprint('original')\n")
    os.symlink("lib", prefix / "lib64")
    version = ".".join(map(str, sys.version_info[:3]))
    home = Path(base).parent
    write(
        prefix / "pyvenv.cfg",
        f"home = {home}\ninclude-system-site-packages = false\nversion = {version}\n",
    )
    return prefix


@pytest.fixture
def site(env: Path) -> Path:
    return env / SITE_REL


@pytest.fixture
def mutants(site: Path) -> list[Mutant]:
    return enumerate_mutants(site / RELPATH, RELPATH, MODULE)


# --- mutants --------------------------------------------------------------------------


def test_reduced_operators_exist_and_leave_out_the_noisy_ones():
    assert REDUCED_OPERATORS
    assert all(op.startswith("core/") for op in REDUCED_OPERATORS)
    for dropped in ("core/ExceptionReplacer", "core/RemoveDecorator"):
        assert dropped not in REDUCED_OPERATORS
    assert "core/ReplaceComparisonOperator_Lt_LtE" in REDUCED_OPERATORS
    assert "core/ReplaceComparisonOperator_Lt_Is" not in REDUCED_OPERATORS
    assert "core/ReplaceBinaryOperator_Add_Sub" in REDUCED_OPERATORS
    assert "core/ReplaceBinaryOperator_Add_Mul" not in REDUCED_OPERATORS


def test_mutant_ids_are_deterministic_and_unique(site: Path, mutants: list[Mutant]):
    assert mutants
    again = enumerate_mutants(site / RELPATH, RELPATH, MODULE)
    assert again == mutants
    assert len({m.id for m in mutants}) == len(mutants)
    for m in mutants:
        key = f"{RELPATH}:{m.operator}:{m.occurrence}"
        assert m.id == hashlib.sha1(key.encode()).hexdigest()[:12]
        assert m.module == MODULE and m.relpath == RELPATH
    keys = [(m.line, m.col, m.operator, m.occurrence) for m in mutants]
    assert keys == sorted(keys)


def test_no_mutant_inside_an_annotation(mutants: list[Mutant]):
    """``int | None`` in a signature or an AnnAssign is never mutated (that only breaks
    import), while ``1 | 2`` in code is."""
    bitor = [m for m in mutants if m.operator == "core/ReplaceBinaryOperator_BitOr_BitAnd"]
    assert [m.after for m in bitor] == ["self.flags = 1 & 2"]
    assert not any("int & None" in m.after or "bool & None" in m.after for m in mutants)
    annotated_lines = {m.line for m in mutants if m.before.startswith("def even(")}
    # the defaults ("ü", None) are code, but nothing in the annotations around them
    assert all("|" not in m.operator for m in mutants if m.line in annotated_lines)


def test_keyword_only_star_is_not_multiplication(mutants: list[Mutant]):
    """cosmic-ray 8.7 offers ``def f(self, *, x)`` -> ``def f(self, +, x)``, which does not
    parse; it is left out."""
    init = [m for m in mutants if m.before.startswith("def __init__")]
    assert init and not any("+," in m.after for m in init)


def test_every_mutant_is_what_mutate_code_gives_and_keeps_line_numbers(
    site: Path, mutants: list[Mutant]
):
    source = (site / RELPATH).read_text()
    lines = source.splitlines()
    for m in mutants:
        text = mutated_source(source, m)
        assert text != source
        assert len(text.splitlines()) == len(lines), m
        assert text.splitlines()[m.line - 1].strip() == m.after, m
        assert m.before == lines[m.line - 1].strip()
        compile(text, RELPATH, "exec")


def test_a_continuation_line_comparison_stays_on_its_line(site: Path, mutants: list[Mutant]):
    """cosmic-ray swaps ``<=`` with the newline before it, joining the lines; the mutant
    keeps them apart."""
    m = next(m for m in mutants if m.operator == "core/ReplaceComparisonOperator_LtE_Lt")
    assert (m.before, m.after) == ("<= self.capacity", "< self.capacity")
    loop = [m for m in mutants if m.operator == "core/ZeroIterationForLoop"]
    assert {m.before for m in loop} == {"for key in self.blocks:", "for i in range("}


def test_one_line_and_unified_diff(site: Path, mutants: list[Mutant], tmp_path: Path):
    m = next(m for m in mutants if m.operator == "core/ReplaceComparisonOperator_GtE_Gt")
    assert m.function == "evict"
    assert m.one_line() == (
        f"lru.py:{m.line} evict: `if len(selected) >= n:` -> `if len(selected) > n:`"
    )
    source = (site / RELPATH).read_text()
    diff = m.unified_diff(source)
    head = diff.splitlines()
    assert head[0] == f"--- a/{RELPATH}" and head[1] == f"+++ b/{RELPATH}"
    assert head[2].startswith(f"@@ -{m.line - 3},7 +{m.line - 3},7 @@")
    assert f"-{' ' * 12}if len(selected) >= n:" in head
    assert f"+{' ' * 12}if len(selected) > n:" in head
    record = m.record()
    assert Mutant(**record) == m and set(record) >= {"id", "line", "before", "after"}
    module_level = next(x for x in mutants if x.function is None)
    assert " <module>: `" in module_level.one_line()
    if shutil.which("git"):  # the diff is a patch git applies from site-packages
        tree = tmp_path / "applied"
        write(tree / RELPATH, source)
        write(tree / "m.diff", diff)
        subprocess.run(["git", "apply", "m.diff"], cwd=tree, check=True)
        assert (tree / RELPATH).read_text() == mutated_source(source, m)


def test_resolve_target_forms(site: Path):
    want = (MODULE, RELPATH, site / RELPATH)
    assert resolve_target(MODULE, site) == want
    assert resolve_target(RELPATH, site) == want
    assert resolve_target(str(site / RELPATH), site) == want
    package = resolve_target("vllm.v1.kv_offload", site)
    assert package == ("vllm.v1.kv_offload", "vllm/v1/kv_offload/__init__.py", package[2])


@pytest.mark.parametrize(
    "target",
    [
        "vllm.v1.kv_offload.cpu.missing",
        "vllm/v1/nothere.py",
        "../outside.py",
        "/etc/hostname",
        "vllm/v1/kv_offload/cpu/policies",
        "not a module",
    ],
)
def test_resolve_target_refuses(site: Path, target: str):
    with pytest.raises(BadInput) as err:
        resolve_target(target, site)
    assert "\n" not in str(err.value) and target in str(err.value)


def test_sample_is_deterministic_and_in_file_order(mutants: list[Mutant]):
    assert sample(mutants, None, 0) == mutants
    assert sample(mutants, len(mutants) + 5, 0) == mutants
    a, b = sample(mutants, 5, 7), sample(list(reversed(mutants)), 5, 7)
    assert a == b and len(a) == 5
    assert a == sorted(a, key=lambda m: (m.line, m.col, m.operator, m.occurrence))
    assert {m.id for m in sample(mutants, 5, 8)} != {m.id for m in a}
    with pytest.raises(BadInput):
        sample(mutants, -1, 0)


def test_interpreter_queries():
    assert site_packages(sys.executable) == Path(sysconfig.get_paths()["purelib"])
    assert env_prefix(sys.executable) == Path(sys.prefix)
    with pytest.raises(BadInput):
        env_prefix("/nonexistent/python")


# --- sandbox --------------------------------------------------------------------------


def run_python(copy: Path, code: str) -> str:
    out = subprocess.run(
        [str(copy / "bin/python"), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")},
        check=True,
    )
    return out.stdout.strip()


def test_copy_and_replace_never_touch_the_original(
    env: Path, site: Path, mutants: list[Mutant], tmp_path: Path
):
    original = site / RELPATH
    source = original.read_text()
    sha, links = file_sha256(original), original.stat().st_nlink
    copy = make_copy(env, tmp_path / "copy", SITE_REL)
    in_copy = copy / SITE_REL / RELPATH
    assert in_copy.stat().st_ino == original.stat().st_ino  # a hard link, no bytes copied
    assert original.stat().st_nlink == links + 1

    m = next(m for m in mutants if m.operator == "core/ReplaceComparisonOperator_GtE_Gt")
    replace_module(copy, SITE_REL, RELPATH, mutated_source(source, m))
    assert file_sha256(original) == sha
    assert original.read_text() == source
    assert original.stat().st_nlink == links
    assert in_copy.stat().st_ino != original.stat().st_ino
    assert m.after in in_copy.read_text()
    pycache = "vllm/v1/kv_offload/cpu/policies/__pycache__/lru.cpython-311.pyc"
    assert not (copy / SITE_REL / pycache).exists() and (site / pycache).exists()

    assert (copy / SITE_REL / "otherpkg").is_symlink()
    assert sorted(os.listdir(copy / "bin")) == ["python", "python3"]  # no console scripts
    assert os.readlink(copy / "lib64") == "lib"
    assert not (copy / "pyvenv.cfg").is_symlink()
    printed = run_python(
        copy, f"import sys, {MODULE} as m; print(sys.prefix); print(m.__file__)"
    ).splitlines()
    assert printed == [str(copy), str(in_copy)]

    with pytest.raises(ValueError, match="shared with the original"):
        replace_module(copy, SITE_REL, "otherpkg/__init__.py", "X = 2\n")
    assert (site / "otherpkg/__init__.py").read_text() == "X = 1\n"

    remove_copy(copy)
    assert not copy.exists()
    assert file_sha256(original) == sha and (site / "otherpkg/__init__.py").exists()
    remove_copy(copy)  # gone already: nothing to do
    with pytest.raises(ValueError, match="not a copy"):
        remove_copy(env)
    with pytest.raises(FileExistsError):
        make_copy(env, env, SITE_REL)


def test_copy_of_the_real_env_imports_the_mutant(tmp_path: Path):
    """The real .venv (vllm 0.32.0): a copy in well under a second, whose interpreter
    imports the mutated LRU policy from the copy."""
    import time

    python = sys.executable
    site, prefix = site_packages(python), env_prefix(python)
    if not (site / RELPATH).is_file():
        pytest.skip(f"no {RELPATH} in {site}")
    site_rel = site.relative_to(prefix).as_posix()
    module, relpath, path = resolve_target(MODULE, site)
    source = path.read_text()
    sha, links = file_sha256(path), path.stat().st_nlink
    m = next(m for m in enumerate_mutants(path, relpath, module) if "Lt_LtE" in m.operator)

    start = time.perf_counter()
    copy = make_copy(prefix, tmp_path / "copy", site_rel)
    assert time.perf_counter() - start < 10
    try:
        replace_module(copy, site_rel, relpath, mutated_source(source, m))
        assert file_sha256(path) == sha and path.stat().st_nlink == links
        code = (
            f"import sys, inspect, {MODULE} as m; print(sys.prefix); print(m.__file__); "
            f"print({m.after!r} in inspect.getsource(m))"
        )
        assert run_python(copy, code).splitlines() == [
            str(copy),
            str(copy / site_rel / relpath),
            "True",
        ]
    finally:
        remove_copy(copy)
    assert file_sha256(path) == sha and path.stat().st_nlink == links


# --- session --------------------------------------------------------------------------

META = {"target": MODULE, "relpath": RELPATH, "source_sha256": "ab" * 32, "seed": 0}


def test_session_create_open_record_resume(tmp_path: Path, mutants: list[Mutant]):
    db = tmp_path / "s.sqlite"
    with Session.create(db, mutants, META) as s:
        assert s.meta == META
        assert s.mutants() == mutants
        assert s.pending() == mutants
        s.record(mutants[0].id, "killed", command="roundtrip", failed="hits", seconds=1.5)
        s.record(mutants[1].id, "equivalent", detail="same behaviour")
    with pytest.raises(BadInput, match="exists"):
        Session.create(db, mutants, META)

    with Session.open(db) as s:  # resumed: earlier verdicts seen, pending shrunk
        assert s.pending() == mutants[2:]
        s.record(mutants[2].id, "timeout", seconds=60.0)
        s.record(mutants[3].id, "survived", reached="yes", diff="--- a/x\n")
        assert [v["verdict"] for v in s.verdicts()] == [
            "killed",
            "equivalent",
            "timeout",
            "survived",
        ]
        first = s.verdicts()[0]
        assert first["job_id"] == mutants[0].id
        assert (first["command"], first["failed"], first["seconds"]) == ("roundtrip", "hits", 1.5)
        with pytest.raises(BadInput, match="unknown mutate verdict"):
            s.record(mutants[4].id, "maybe")
        with pytest.raises(BadInput, match="not in session"):
            s.record("0" * 12, "killed")
        assert len(s.pending()) == len(mutants) - 4

    with use_db(str(db), WorkDB.Mode.open) as work:  # cosmic-ray's own view of the file
        assert work.num_work_items == len(mutants)
        results = dict(work.results)
    assert results[mutants[0].id].test_outcome == work_item.TestOutcome.KILLED
    assert results[mutants[1].id].test_outcome == work_item.TestOutcome.SURVIVED
    assert results[mutants[1].id].output == "equivalent"
    assert results[mutants[2].id].output == "timeout"
    assert results[mutants[2].id].test_outcome == work_item.TestOutcome.KILLED
    assert set(VERDICTS) == {"killed", "survived", "timeout", "incompetent", "equivalent"}


def test_open_refuses_what_is_not_a_session(tmp_path: Path):
    with pytest.raises(BadInput, match="does not exist"):
        Session.open(tmp_path / "none.sqlite")
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t (x)")
    with pytest.raises(BadInput, match="not a mutate session"):
        Session.open(other)


def test_shards_cover_every_mutant_exactly_once(tmp_path: Path, mutants: list[Mutant]):
    with Session.create(tmp_path / "s.sqlite", mutants, META) as s:
        for n in (1, 2, 3, 5):
            parts = [s.pending((i, n)) for i in range(n)]
            ids = [m.id for part in parts for m in part]
            assert sorted(ids) == sorted(m.id for m in mutants)
        with pytest.raises(BadInput):
            s.pending((2, 2))


def test_merge_of_two_shards(tmp_path: Path, mutants: list[Mutant]):
    paths = [tmp_path / f"shard{i}.sqlite" for i in range(2)]
    for i, path in enumerate(paths):
        with Session.create(path, mutants, META) as s:
            for m in s.pending((i, 2)):
                s.record(m.id, "killed" if i == 0 else "survived", seconds=float(i))
    with merge(paths, tmp_path / "merged.sqlite") as merged:
        assert merged.pending() == []
        assert merged.meta == META
        verdicts = {v["job_id"]: v["verdict"] for v in merged.verdicts()}
    assert verdicts == {m.id: "killed" if int(m.id, 16) % 2 == 0 else "survived" for m in mutants}


def test_merge_refuses_conflicts_and_other_sessions(tmp_path: Path, mutants: list[Mutant]):
    a, b, c = (tmp_path / f"{x}.sqlite" for x in "abc")
    target = mutants[0]
    with Session.create(a, mutants, META) as s:
        s.record(target.id, "killed")
    with Session.create(b, mutants, META) as s:
        s.record(target.id, "survived")
    with pytest.raises(BadInput, match=target.id) as err:
        merge([a, b], tmp_path / "out.sqlite")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out.sqlite").exists()
    with Session.create(c, mutants, {**META, "seed": 1}) as s:
        pass
    with pytest.raises(BadInput, match="differs in seed"):
        merge([a, c], tmp_path / "out.sqlite")


def test_check_source_refuses_a_changed_target(tmp_path: Path, mutants: list[Mutant]):
    with Session.create(tmp_path / "s.sqlite", mutants, META) as s:
        s.check_source(META["source_sha256"])
        with pytest.raises(BadInput, match="changed since session"):
            s.check_source("cd" * 32)


def test_a_session_made_from_a_real_plans_meta_resumes(tmp_path: Path, mutants: list[Mutant]):
    """What ``MutatePlan.meta`` writes is what ``Session.check_source`` reads on
    ``--resume`` (a key read under another name refused every session the CLI made)."""
    from harness.commands.mutate.execute import MutateCommand
    from harness.commands.mutate.plan import MutatePlan

    plan = MutatePlan(
        python=sys.executable,
        prefix=tmp_path,
        site_rel="lib/site-packages",
        module=MODULE,
        relpath=RELPATH,
        path=tmp_path / RELPATH,
        sha256="ef" * 32,
        vllm_version="0.32.0",
        mutants=mutants,
        total=len(mutants),
        commands=[MutateCommand.parse("roundtrip")],
        seed=1,
        sample_size=None,
    )
    with Session.create(tmp_path / "s.sqlite", mutants, plan.meta()) as s:
        pass
    with Session.open(tmp_path / "s.sqlite") as s:
        s.check_source(plan.sha256)
        with pytest.raises(BadInput, match="changed since session"):
            s.check_source("cd" * 32)


def test_a_mutant_no_command_reached_is_a_survivor_without_a_run(
    tmp_path: Path, mutants: list[Mutant], site: Path
):
    """The baseline's coverage decides: a mutant on a line some command executed runs;
    one on a line none did is recorded survived (a gap of the suite, named so) at once."""
    from harness.commands.mutate import execute as ex

    source = (site / RELPATH).read_text()
    reached_line = mutants[0].line
    covered = {"oracle-drive": [reached_line], "pressure": []}
    said: list[str] = []

    class Reporter:
        def status(self, message: str) -> None:
            said.append(message)

    with Session.create(tmp_path / "s.sqlite", mutants, META) as s:
        ran = ex.skip_unreached(s.pending(), covered, s, source, Reporter())
        assert ran == [m for m in mutants if m.line == reached_line]
        skipped = {v["job_id"]: v for v in s.verdicts()}
        assert set(skipped) == {m.id for m in mutants if m.line != reached_line}
        assert {v["verdict"] for v in skipped.values()} == {"survived"}
        assert all(v["detail"] == ex.NOT_REACHED and v["reached"] == "" for v in skipped.values())
        assert all(v["diff"].startswith("---") for v in skipped.values())
        assert s.pending() == ran  # a resume runs only the reached ones
    assert len(said) == len(skipped) and "not reached: not run" in said[0]
