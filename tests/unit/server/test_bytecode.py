"""Bytecode checks and repair on a real (small) environment: a venv holding a package
named vllm whose modules have no bytecode, as uv leaves them."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from harness.commands.doctor import variants
from harness.server import bytecode


@pytest.fixture
def bare_env(tmp_path, monkeypatch):
    """A venv whose site-packages holds ``vllm`` (3 modules) and no bytecode at all."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # as on these machines and CI
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    pkg = Path(site) / "vllm"
    (pkg / "entrypoints").mkdir(parents=True)
    (pkg / "__init__.py").write_text("X = 1\n")
    (pkg / "entrypoints" / "__init__.py").write_text("")
    (pkg / "entrypoints" / "api_server.py").write_text("def main():\n    return 0\n")
    return str(python), pkg


def test_an_environment_without_bytecode_is_missing_it(bare_env):
    python, pkg = bare_env
    state = bytecode.check(python)
    assert state.packages == {"vllm": (0, 3)}  # torch, transformers: not installed there
    assert state.missing == ["vllm"]
    assert not list(pkg.rglob("*.pyc"))


def test_doctor_warns_with_the_fix_then_ensure_compiles_it(bare_env):
    python, pkg = bare_env
    warn = variants.check_bytecode("current", python)
    assert warn.status == "warn"
    assert "no bytecode for vllm" in warn.detail and "twice the launch time" in warn.detail
    assert f"{python} -m harness.server.bytecode ensure" in warn.fix
    # The repair works although PYTHONDONTWRITEBYTECODE is set (compileall always writes).
    state = bytecode.ensure(python)
    assert state.packages == {"vllm": (3, 3)} and not state.missing
    assert len(list(pkg.rglob("*.pyc"))) == 3
    assert variants.check_bytecode("current", python).status == "ok"


def test_the_command_line_exits_1_while_missing_and_0_once_compiled(bare_env):
    python, _ = bare_env
    assert bytecode.main(["check", python]) == 1
    assert bytecode.main(["ensure", python]) == 0
    assert bytecode.main(["check", python]) == 0
    assert bytecode.main(["bogus"]) == 2


def test_this_checkouts_environment_was_compiled_at_setup():
    """make setup compiles (uv --compile-bytecode, then harness.server.bytecode ensure)."""
    if not Path(sysconfig.get_paths()["purelib"], "vllm").is_dir():
        pytest.skip("not run from a vLLM environment")
    assert bytecode.check(sys.executable).missing == []
