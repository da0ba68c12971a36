"""The CPU stand-in for a CUDA wheel on a host without the NVIDIA driver: chosen only
there, and answered by the harness's platform plugin for builds that ignore
``VLLM_TARGET_DEVICE`` (0.26 and older), in no other process."""

from __future__ import annotations

import importlib
import importlib.metadata
import os

import pytest
import tomllib

from harness.engine import cuda_wheel
from harness.names import ENV_CPU_STAND_IN
from tests.conftest import ROOT


@pytest.fixture
def clean(monkeypatch):
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    monkeypatch.delenv(ENV_CPU_STAND_IN, raising=False)
    return monkeypatch


def test_a_cuda_wheel_without_a_driver_gets_the_cpu_platform_both_ways(clean):
    clean.setattr(importlib.metadata, "distribution", lambda name: object())

    def no_driver(name):
        raise OSError(f"{name}: cannot open shared object file")

    clean.setattr(cuda_wheel.ctypes, "CDLL", no_driver)
    assert cuda_wheel.cpu_stand_in_plugin() is None  # before: vLLM chooses
    assert cuda_wheel.choose_platform() == cuda_wheel.CPU_STAND_IN
    assert cuda_wheel.cpu_stand_in_plugin() == "vllm.platforms.cpu.CpuPlatform"
    assert os.environ["VLLM_TARGET_DEVICE"] == "cpu"


def test_nothing_is_stood_in_for_a_cpu_wheel_or_a_caller_s_choice(clean):
    clean.setattr(importlib.metadata, "distribution", lambda name: (_ for _ in ()).throw(
        importlib.metadata.PackageNotFoundError(name)))  # fmt: skip
    assert cuda_wheel.choose_platform() == "vLLM's own choice (not the CUDA wheel)"
    assert cuda_wheel.cpu_stand_in_plugin() is None
    clean.setenv("VLLM_TARGET_DEVICE", "cuda")
    assert "set by the caller" in cuda_wheel.choose_platform()
    assert cuda_wheel.cpu_stand_in_plugin() is None


def test_the_plugin_is_vllms_platform_entry_point():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    target = project["entry-points"]["vllm.platform_plugins"]["offload_check_cpu_stand_in"]
    module, func = target.split(":")
    assert getattr(importlib.import_module(module), func) is cuda_wheel.cpu_stand_in_plugin
