"""Copy-on-write copies of a Python environment, one per mutant under test.

A mutant must never touch the installed environment: its files are hard links shared with
every other environment built from the same uv cache (0.32.0's ``cpu/manager.py`` has 11
links), so an in-place write would mutate them all, and a crash mid-run would leave them
mutated. A copy costs a fraction of a second instead of gigabytes: every top-level entry
of the environment is a symlink back to the original, except the directories on the path
down to ``site-packages/<package>``, which are real, and the package's files, which are
hard links (same inode, no bytes copied). ``replace_module`` then swaps one file for a new
inode, so the original and its other links never see the mutant.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path, PurePosixPath

from harness.errors import BadInput

# Left in every copy, so that remove_copy can refuse to delete anything else (say, the
# original environment passed by mistake).
MARKER = ".offload-check-copy"
# Hard links that cannot be made: another filesystem (EXDEV), a filesystem or kernel
# policy that refuses them (EPERM: fs.protected_hardlinks, files of another user), a file
# already at its link limit (EMLINK).
_NO_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK)


def env_prefix(python: str) -> Path:
    """The interpreter's ``sys.prefix``: the environment to copy (a venv's, not its base's)."""
    try:
        proc = subprocess.run(
            [python, "-c", "import sys; print(sys.prefix)"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise BadInput(f"cannot run interpreter {python}: {err}") from err
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BadInput(f"interpreter {python} failed ({proc.returncode}): {tail}")
    return Path(proc.stdout.strip())


def make_copy(prefix: Path, dest: Path, site_rel: str, package: str = "vllm") -> Path:
    """A copy of the environment at ``prefix`` in ``dest`` (which must not exist) whose
    ``site_rel/package`` (``lib/python3.11/site-packages`` and ``vllm``) may be changed.

    ``bin/`` is a real directory holding only the interpreter's links (``python``,
    ``python3``, ``python3.11``), recreated as they are: CPython finds ``pyvenv.cfg`` next
    to the directory of the path it was started by, without resolving symlinks, so
    ``dest/bin/python`` reports ``sys.prefix == dest`` and imports from the copy's
    site-packages. The console scripts are left out on purpose: their shebangs name the
    original interpreter, so running one would run the unmutated environment; launch with
    ``dest/bin/python -m ...``. ``pyvenv.cfg`` is copied (it is a few bytes, and the copy
    stays a venv even if the original is rebuilt). A symlink of the environment with a
    relative target (``lib64 -> lib``) is recreated as it is, so it points inside the copy.

    The package's files are hard links. Where the copy is on another filesystem than the
    environment (or links are refused), they are copied instead, which is slower (the
    0.32.0 vllm tree is ~60 MB) but just as safe.
    """
    if dest.exists() or dest.is_symlink():
        raise FileExistsError(f"{dest} exists (remove_copy it first)")
    parts = (*PurePosixPath(site_rel).parts, package)
    if ".." in parts or PurePosixPath(site_rel).is_absolute():
        raise ValueError(f"site_rel must be relative to the prefix: {site_rel!r}")
    if not (prefix / PurePosixPath(*parts)).is_dir():
        raise BadInput(f"{prefix} has no {PurePosixPath(*parts)} to copy")
    dest.mkdir(parents=True)
    (dest / MARKER).write_text(f"copy of {prefix}\n")
    for entry in os.scandir(prefix):
        if entry.name == parts[0]:
            continue
        if entry.name == "bin" and entry.is_dir(follow_symlinks=False):
            _copy_bin(Path(entry.path), dest / "bin")
        elif entry.name == "pyvenv.cfg":
            shutil.copy2(entry.path, dest / entry.name)
        else:
            _mirror(Path(entry.path), dest / entry.name)
    src, dst = prefix, dest
    for i, part in enumerate(parts):
        src, dst = src / part, dst / part
        if i == len(parts) - 1:
            _link_tree(src, dst)
            break
        dst.mkdir()
        for entry in os.scandir(src):
            if entry.name != parts[i + 1]:
                _mirror(Path(entry.path), dst / entry.name)
    return dest


def _mirror(src: Path, dst: Path) -> None:
    """dst -> src, or src's own relative link target (so ``lib64 -> lib`` stays inside)."""
    if src.is_symlink() and not os.path.isabs(target := os.readlink(src)):
        os.symlink(target, dst)
    else:
        os.symlink(src, dst)


def _copy_bin(src: Path, dst: Path) -> None:
    """The interpreter's entries of bin/: symlinks as they are, a copied interpreter
    (``venv --copies``) hard-linked."""
    dst.mkdir()
    for entry in os.scandir(src):
        if not entry.name.startswith("python"):
            continue
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), dst / entry.name)
        elif entry.is_file():
            _link_or_copy(Path(entry.path), dst / entry.name)


def _link_tree(src: Path, dst: Path) -> None:
    """src's tree again under dst: directories made anew, files hard-linked, symlinks kept."""
    for root, dirs, files in os.walk(src):
        here = dst / os.path.relpath(root, src)
        here.mkdir(exist_ok=True)
        for name in list(dirs):  # os.walk lists symlinked directories but does not enter them
            if os.path.islink(os.path.join(root, name)):
                os.symlink(os.readlink(os.path.join(root, name)), here / name)
                dirs.remove(name)
        for name in files:
            path = os.path.join(root, name)
            if os.path.islink(path):
                os.symlink(os.readlink(path), here / name)
            else:
                _link_or_copy(Path(path), here / name)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError as err:
        if err.errno not in _NO_LINK:
            raise
        shutil.copy2(src, dst)


def replace_module(copy: Path, site_rel: str, relpath: str, text: str) -> None:
    """Put ``text`` in place of ``relpath`` (relative to site-packages) in the copy.

    The file in the copy is a hard link to the original, so it is never opened for
    writing: the text goes to a new file in the same directory, which ``os.replace`` then
    renames over the link (a new inode; the original and its other links keep theirs).
    The module's ``.pyc`` files in the copy's ``__pycache__`` are hard links to the
    original's bytecode and are unlinked, so Python compiles the mutant (an
    unchecked-hash pyc would otherwise be loaded without a look at the source); Python
    writes bytecode by rename too, so that never reaches the original either.
    """
    site = copy / PurePosixPath(site_rel)
    target = site / PurePosixPath(relpath)
    _refuse_symlinks(copy, target.parent)
    if not target.is_file() or target.is_symlink():
        raise ValueError(f"{relpath} is not a file of the copy's {site_rel}")
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        os.chmod(tmp, target.stat().st_mode & 0o777)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    for pyc in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
        pyc.unlink()


def _refuse_symlinks(copy: Path, directory: Path) -> None:
    """Every directory from the copy down to ``directory`` must be the copy's own: a rename
    inside a symlinked one would replace the original environment's file."""
    rel = directory.relative_to(copy)
    here = copy
    for part in rel.parts:
        here = here / part
        if here.is_symlink() or not here.is_dir():
            raise ValueError(f"{here} is shared with the original environment; cannot replace")


def file_sha256(path: Path) -> str:
    """The file's SHA-256, hex: proof that the original is byte-identical after a run."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def remove_copy(dest: Path) -> None:
    """Delete a copy made by ``make_copy`` (nothing if it is gone). Symlinks are removed,
    never followed, and hard links only drop a count, so the original is untouched; a
    directory without the copy marker is refused."""
    if not dest.exists() and not dest.is_symlink():
        return
    if dest.is_symlink() or not (dest / MARKER).is_file():
        raise ValueError(f"{dest} is not a copy made by make_copy; not removing it")
    shutil.rmtree(dest)
