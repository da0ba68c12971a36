"""The NVIDIA driver in a run's record: asked of nvidia-smi, absent without one."""

from __future__ import annotations

import os
import stat

from harness.server import interpreters


def fake_smi(tmp_path, body: str) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{body}\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)


def test_the_driver_is_nvidia_smis_first_line(tmp_path, monkeypatch):
    fake_smi(tmp_path, 'echo "580.159.04"; echo "580.159.04"')  # one line per GPU
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert interpreters.gpu_driver() == "580.159.04"
    assert interpreters.host_platform()["gpu_driver"] == "580.159.04"


def test_no_driver_is_no_key(tmp_path, monkeypatch):
    fake_smi(tmp_path, 'echo "NVIDIA-SMI has failed" >&2; exit 9')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert interpreters.gpu_driver() is None
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert "gpu_driver" not in interpreters.host_platform()
