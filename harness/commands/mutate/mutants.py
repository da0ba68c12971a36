"""The mutants of one installed vLLM file: which ones, where, and what each changes.

cosmic-ray supplies the operators and the one safe primitive, ``mutate_code`` (source text
in, mutated text out). Its in-place helpers (``apply_mutation``, ``use_mutation``,
``mutate_and_test``, ``cosmic-ray exec``) are never used: installed vLLM files are hard links
shared by every environment built from the same uv cache, so writing one in place would
mutate them all. Applying a mutant is ``sandbox.replace_module`` on a copy.

A mutant's identity is (relpath, operator, occurrence), cosmic-ray's own coordinates, so a
session enumerated on one CI runner names the same mutants as on any other; ``id`` hashes
exactly that. Occurrences count every position an operator offers, including the ones this
module drops (annotations), so dropping never renumbers the rest.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import hashlib
import random
import re
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import cosmic_ray.plugins  # type: ignore[import-untyped]
from cosmic_ray.ast import ast_nodes, get_ast  # type: ignore[import-untyped]
from cosmic_ray.ast.ast_query import ASTQuery  # type: ignore[import-untyped]
from cosmic_ray.mutating import mutate_code  # type: ignore[import-untyped]
from cosmic_ray.util import read_python_source  # type: ignore[import-untyped]
from parso.utils import split_lines

from harness.errors import BadInput

_CORE = "core/"

# Comparisons: only the boundary swaps (off-by-one: < vs <=) and the negations (== vs !=,
# is vs is not, < vs >=). cosmic-ray offers every pair (Lt -> Is, Eq -> Gt, ...); those
# mostly crash at once or repeat a boundary mutant, and would triple the run. cosmic-ray
# 8.7 has no In/NotIn operator, so membership tests are not mutated.
_COMPARISONS = (
    "Lt_LtE Lt_GtE LtE_Lt LtE_Gt Gt_GtE Gt_LtE GtE_Gt GtE_Lt Eq_NotEq NotEq_Eq Is_IsNot IsNot_Is"
)
# Arithmetic and bit operators: one replacement per source operator, the one a slip of
# the keyboard or of the mind would make (+ vs -, // vs *, | vs &, << vs >>).
_BINARY = (
    "Add_Sub Sub_Add Mul_Add Div_Mul FloorDiv_Mul Mod_FloorDiv Pow_Mul "
    "BitOr_BitAnd BitAnd_BitOr BitXor_BitOr LShift_RShift RShift_LShift"
)
# Unary: dropping a ``not`` (the complement of AddNot) and -x -> +x (``blocks[-1]``).
_UNARY = "Delete_Not USub_UAdd"
_OTHERS = (
    "NumberReplacer",
    "ReplaceTrueWithFalse",
    "ReplaceFalseWithTrue",
    "ReplaceAndWithOr",
    "ReplaceOrWithAnd",
    "AddNot",
    "ReplaceBreakWithContinue",
    "ReplaceContinueWithBreak",
    "ZeroIterationForLoop",
)
# Left out on purpose: ExceptionReplacer (swaps the caught type for a made-up one: it tests
# the exception path's existence, not its logic) and RemoveDecorator (in 0.32.0 the
# decorators are @override, @dataclass and @classmethod: removing them is a no-op or an
# import-time crash, and it deletes a line, which would shift every line number after it).
_LINE_CHANGING = frozenset({_CORE + "RemoveDecorator"})


def _wanted() -> Iterator[str]:
    yield from (f"{_CORE}ReplaceComparisonOperator_{p}" for p in _COMPARISONS.split())
    yield from (f"{_CORE}ReplaceBinaryOperator_{p}" for p in _BINARY.split())
    yield from (f"{_CORE}ReplaceUnaryOperator_{p}" for p in _UNARY.split())
    yield from (_CORE + name for name in _OTHERS)


def _reduced() -> tuple[str, ...]:
    """The wanted names the installed cosmic-ray offers, in its own order (a name missing from
    a later cosmic-ray drops out rather than failing every session)."""
    offered = cosmic_ray.plugins.operator_names()
    wanted = set(_wanted())
    return tuple(name for name in offered if name in wanted)


REDUCED_OPERATORS: tuple[str, ...] = _reduced()


@dataclass(frozen=True)
class Mutant:
    """One mutation of one file, with what a person needs to judge it without the source."""

    id: str
    module: str
    relpath: str
    operator: str
    occurrence: int
    line: int
    col: int
    function: str | None
    before: str
    after: str

    def record(self) -> dict[str, Any]:
        """A flat row (CSV, JSON); ``Mutant(**m.record())`` rebuilds the mutant."""
        return dataclasses.asdict(self)

    def one_line(self) -> str:
        """``lru.py:141 evict: `if len(selected) < n:` -> `if len(selected) <= n:` ``"""
        name = PurePosixPath(self.relpath).name
        where = self.function or "<module>"
        return f"{name}:{self.line} {where}: `{self.before}` -> `{self.after}`"

    def unified_diff(self, source: str) -> str:
        """The mutant as a patch ``git apply`` / ``patch -p1`` accept, from site-packages."""
        return _unified_diff(source, mutated_source(source, self), self.relpath)


def mutant_id(relpath: str, operator: str, occurrence: int) -> str:
    """Deterministic across machines: the same file, operator and occurrence, the same id."""
    return hashlib.sha1(f"{relpath}:{operator}:{occurrence}".encode()).hexdigest()[:12]


def _unified_diff(source: str, mutated: str, relpath: str) -> str:
    lines: list[str] = []
    for line in difflib.unified_diff(
        source.splitlines(keepends=True),
        mutated.splitlines(keepends=True),
        f"a/{relpath}",
        f"b/{relpath}",
    ):
        if line.endswith("\n"):
            lines.append(line)
        else:  # the file's last line has no newline: say so, as diff(1) does
            lines.append(line + "\n\\ No newline at end of file\n")
    return "".join(lines)


def site_packages(python: str) -> Path:
    """The interpreter's purelib, asked of the interpreter itself (a venv's layout is its own)."""
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(_ask(python, code))


def _ask(python: str, code: str) -> str:
    try:
        proc = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise BadInput(f"cannot run interpreter {python}: {err}") from err
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BadInput(f"interpreter {python} failed ({proc.returncode}): {tail}")
    return proc.stdout.strip()


_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def resolve_target(target: str, site: Path) -> tuple[str, str, Path]:
    """(dotted module, posix path relative to site-packages, absolute path) of a target given
    as a dotted module, a path relative to site-packages, or an absolute path inside it."""
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if path.is_absolute():
            rel = _inside(path, site)
            if rel is None:
                raise BadInput(f"mutate target {target} is not inside site-packages {site}")
        else:
            rel = PurePosixPath(path.as_posix())
            if ".." in rel.parts:
                raise BadInput(f"mutate target {target} leaves site-packages {site}")
    elif _DOTTED.match(target):
        parts = target.split(".")
        rel = PurePosixPath(*parts).with_suffix(".py")
        if not (site / rel).is_file():
            rel = PurePosixPath(*parts, "__init__.py")
    else:
        raise BadInput(f"mutate target {target!r} is neither a dotted module nor a .py path")
    absolute = site / rel
    if rel.suffix != ".py" or not absolute.is_file():
        raise BadInput(f"mutate target {target}: no such Python file under {site}")
    names = rel.with_suffix("").parts
    if names[-1] == "__init__":
        names = names[:-1]
    return ".".join(names), rel.as_posix(), absolute


def _inside(path: Path, site: Path) -> PurePosixPath | None:
    """path relative to site, as written first (a copy's site-packages holds symlinks that
    resolve back to the original), then with both sides resolved."""
    for p, s in ((path, site), (path.resolve(), site.resolve())):
        try:
            rel = p.relative_to(s)
        except ValueError:
            continue
        if ".." not in rel.parts:
            return PurePosixPath(rel.as_posix())
    return None


def _annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Every annotation's (start, end) in parso's coordinates: line 1-based, column in
    characters (the stdlib ``ast`` counts UTF-8 bytes). A mutant there (``int | None`` ->
    ``int & None``) only breaks import, so it teaches nothing."""
    lines = source.splitlines()

    def chars(line: int, byte_col: int) -> int:
        return len(lines[line - 1].encode()[:byte_col].decode(errors="replace"))

    try:
        tree = ast.parse(source)
    except SyntaxError as err:  # a newer Python's syntax than the harness runs on
        raise BadInput(f"cannot parse {err.filename or 'the target'}: {err}") from err
    spans = []
    for node in ast.walk(tree):
        found = []
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            found.append(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
            found.append(node.returns)
        for a in found:
            assert a.end_lineno is not None and a.end_col_offset is not None
            start = (a.lineno, chars(a.lineno, a.col_offset))
            end = (a.end_lineno, chars(a.end_lineno, a.end_col_offset))
            spans.append((start, end))
    return spans


def _operator(name: str) -> Any:
    """An instance of a named cosmic-ray operator, refusing the ones a session cannot hold."""
    try:
        cls = cosmic_ray.plugins.get_operator(name)
    except (KeyError, ValueError) as err:
        raise ValueError(f"cosmic-ray has no operator {name!r}") from err
    if cls.arguments():
        raise ValueError(f"operator {name} takes arguments; mutate runs argument-less ones")
    if name in _LINE_CHANGING:
        raise ValueError(f"operator {name} deletes lines; mutants must keep line numbers")
    return cls()


def enumerate_mutants(
    path: Path, relpath: str, module: str, operators: Sequence[str] = REDUCED_OPERATORS
) -> list[Mutant]:
    """Every mutant of the file that changes its text and lies outside annotations, sorted by
    position, each with its real mutated line (``after``)."""
    source = read_python_source(path)
    lines = source.splitlines()
    spans = _annotation_spans(source)
    tree = get_ast(source)
    nodes = list(ast_nodes(tree))
    starts = _line_offsets(source)
    found = []
    for name in operators:
        op = _operator(name)
        occurrence = -1
        for node in nodes:
            for index, (start, _end) in enumerate(list(op.mutation_positions(node))):
                occurrence += 1
                if any(s <= start < e for s, e in spans) or _marker(node):
                    continue
                mutated = _keep_lines(source, _splice(source, starts, node, op, index))
                if mutated is None or mutated == source:
                    continue
                line, col = start
                found.append(
                    Mutant(
                        id=mutant_id(relpath, name, occurrence),
                        module=module,
                        relpath=relpath,
                        operator=name,
                        occurrence=occurrence,
                        line=line,
                        col=col,
                        function=ASTQuery(node).get_definition_name(),
                        before=lines[line - 1].strip(),
                        after=mutated.splitlines()[line - 1].strip(),
                    )
                )
        assert tree.get_code() == source, f"{name} left the shared parse tree changed"
    return sorted(found, key=_order)


def _marker(node: Any) -> bool:
    """The bare ``*`` or ``/`` of a parameter list (``def f(self, *, x)``), which cosmic-ray
    8.7 takes for multiplication or division: ``def f(self, +, x)`` does not even parse."""
    return (
        getattr(node, "type", None) == "operator"
        and node.value in ("*", "/")
        and getattr(node.parent, "type", None) in ("parameters", "lambdef")
    )


def _line_offsets(source: str) -> list[int]:
    """Offset of each line's first character, lines split as parso splits them."""
    offsets = [0]
    for line in split_lines(source, keepends=True):
        offsets.append(offsets[-1] + len(line))
    return offsets


def _splice(source: str, starts: list[int], node: Any, op: Any, index: int) -> str:
    """What ``mutate_code(source, op, occurrence)`` returns, without parsing the file again.

    ``mutate_code`` parses the whole file for each mutant (0.12 s for the 2,101-line
    offloading scheduler, over 100 s for its ~860 positions). Here the one parse tree is
    shared: the operator mutates the node in place exactly as cosmic-ray's visitor would
    (the visitor puts the returned node, or nothing, where the node was), the node's new
    code is spliced into the source, and the node's subtree is put back as it was. The
    unit tests check the result equals ``mutate_code``'s for every mutant.
    """
    line, col = node.end_pos
    hi = starts[line - 1] + col
    lo = hi - len(node.get_code())
    assert source[lo:hi] == node.get_code(), "parse tree and source disagree"
    saved = _snapshot(node)
    try:
        new = op.mutate(node, index)
        code = "" if new is None else new.get_code()
    finally:
        for obj, attr, value in saved:
            setattr(obj, attr, value)
    return source[:lo] + code + source[hi:]


def _snapshot(node: Any) -> list[tuple[Any, str, Any]]:
    """The mutable state of a parso subtree: every node's children, every leaf's text."""
    saved: list[tuple[Any, str, Any]] = []
    for n in ast_nodes(node):
        if hasattr(n, "children"):
            saved.append((n, "children", list(n.children)))
        else:
            saved.extend(((n, "value", n.value), (n, "prefix", n.prefix)))
    return saved


_WS = re.compile(r"[ \t\f]*(?:\\?\r?\n[ \t\f]*)+")


def _keep_lines(source: str, mutated: str | None) -> str | None:
    """The mutant with the source's line count, or None if that cannot be had.

    cosmic-ray swaps a token together with the whitespace before it, so a comparison that
    starts a continuation line (``x\\n    <= y`` inside parentheses) is joined onto the line
    above, and ``ZeroIterationForLoop`` turns a multi-line iterable into ``[]``. Every line
    after would shift: ``after``, tracebacks and the "reached" check all use the original
    file's line numbers. The lost newlines are put back where Python ignores them (the
    original whitespace before the changed text, or before a closing bracket of it), and a
    repair is kept only if it parses to the very same AST as cosmic-ray's text.
    """
    if mutated is None:
        return None
    newlines = source.count("\n")
    if mutated.count("\n") == newlines:
        return mutated
    want = _dump(mutated)
    if want is None:
        return None
    p = _common(source, mutated, 1)
    s = _common(source[p:], mutated[p:], -1)
    old_mid, new_mid = source[p : len(source) - s], mutated[p : len(mutated) - s]
    head, tail = mutated[:p], mutated[len(mutated) - s :]
    carried = _WS.match(old_mid)
    if carried is not None:  # the whitespace the swapped token took with it
        new_mid = carried.group() + new_mid.lstrip(" \t")
    short = newlines - (head + new_mid + tail).count("\n")
    if short == 0:
        candidates = [head + new_mid + tail]
    else:  # before a closing bracket of the new text (or the one right after it)
        text, rest = new_mid + tail[:1], tail[1:]
        candidates = [
            head + text[:i] + "\n" * short + text[i:] + rest
            for i in reversed(range(len(text)))
            if text[i] in ")]}"
        ]
    for candidate in candidates:
        if candidate.count("\n") == newlines and _dump(candidate) == want:
            return candidate
    return None


def _common(a: str, b: str, step: int) -> int:
    """How many characters a and b share from the start (step 1) or the end (step -1)."""
    n, i = min(len(a), len(b)), 0
    while i < n and a[i if step > 0 else -1 - i] == b[i if step > 0 else -1 - i]:
        i += 1
    return i


def _dump(source: str) -> str | None:
    try:
        return ast.dump(ast.parse(source))
    except SyntaxError:
        return None


def _order(m: Mutant) -> tuple[int, int, str, int]:
    return (m.line, m.col, m.operator, m.occurrence)


def mutated_source(source: str, mutant: Mutant) -> str:
    """The whole file with this one mutant applied (text only; nothing is written), with the
    source's line numbers (see ``_keep_lines``)."""
    raw = mutate_code(source, _operator(mutant.operator), mutant.occurrence)
    mutated = _keep_lines(source, raw)
    if mutated is None:
        raise ValueError(f"mutant {mutant.id} ({mutant.operator}#{mutant.occurrence}) not found")
    return str(mutated)


def sample(mutants: Sequence[Mutant], n: int | None, seed: int) -> list[Mutant]:
    """n mutants chosen by seed (None: all), in file order. The draw depends only on the seed
    and the sorted mutant list, so every runner of a sharded session draws the same ones."""
    ordered = sorted(mutants, key=_order)
    if n is None or n >= len(ordered):
        return ordered
    if n < 0:
        raise BadInput(f"mutate sample size must be >= 0, got {n}")
    return sorted(random.Random(seed).sample(ordered, n), key=_order)
