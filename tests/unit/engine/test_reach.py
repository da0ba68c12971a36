"""The engine-side line tracer mutate classifies survivors by: every line of the one
traced file that ran, in the process and its threads, and no line of any other file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.engine.reach import install, read_lines
from harness.names import ENV_COVER, ENV_COVER_OUT

MODULE = """\
import threading


def branch(x):
    if x > 0:
        return "pos"
    return "neg"


def in_thread():
    t = threading.Thread(target=branch, args=(-1,))
    t.start()
    t.join()


def never():
    return 1
"""


def test_the_lines_a_process_and_its_threads_ran_are_recorded(tmp_path):
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "target.py").write_text(MODULE)
    (site / "vllm" / "__init__.py").write_text("")
    out = tmp_path / "lines"
    code = (
        "import harness.engine.reach as r; assert r.install(); "
        "import vllm.target as t; t.branch(1); t.in_thread()"
    )
    env = {**os.environ, ENV_COVER: "vllm/target.py", ENV_COVER_OUT: str(out)}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(Path.cwd())])
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    lines = read_lines(out)
    assert {
        5,
        6,
        7,
    } <= lines  # both branches: the positive in the process, the negative in a thread
    assert {11, 12, 13} <= lines
    assert 17 not in lines  # never() never ran
    assert len(list(out.glob("*.lines"))) == 1


def test_without_a_file_to_trace_nothing_is_installed(monkeypatch):
    monkeypatch.delenv(ENV_COVER, raising=False)
    assert install() is False
    assert sys.gettrace() is None or "reach" not in repr(sys.gettrace())
    assert read_lines(Path("/nonexistent")) == set()
