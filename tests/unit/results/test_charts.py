"""Charts are extras: drawn with matplotlib, skipped (never a failed run) without it.

The GPU loan's image reaches no index and has no matplotlib (scripts/gpu/); a round trip
there must still write every table and say why its chart is missing.
"""

from __future__ import annotations

import sys

import pytest

from harness.results import chart

PHASES = [
    {"phase": "cold", "d_stored_bytes": 1e6, "d_loaded_bytes": 0, "d_gpu_hits": 0, "d_ext_hits": 0},
    {
        "phase": "replay",
        "d_stored_bytes": 0,
        "d_loaded_bytes": 1e6,
        "d_gpu_hits": 0,
        "d_ext_hits": 9,
    },
]


def test_a_chart_is_drawn_where_matplotlib_is(tmp_path):
    out = chart.phases_chart(PHASES, "t", tmp_path / "phases.png")
    assert out is not None and out.read_bytes()[:4] == b"\x89PNG"


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError


def test_without_matplotlib_nothing_is_drawn_and_nothing_raises(tmp_path, no_matplotlib):
    assert chart.pyplot() is None
    assert chart.phases_chart(PHASES, "t", tmp_path / "phases.png") is None
    assert chart.sweep_heatmap([], ["0.32.0"], tmp_path / "heatmap.png") is None
    assert not list(tmp_path.iterdir())
