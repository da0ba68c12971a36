"""The KV-cache spec family matrix against real vLLM servers (0.27.1 and 0.32.0).

`make test` runs a representative subset (see SUBSET); `make matrix` runs all of it.
The assertions are on the verdicts themselves (spec classes the engine reported,
crash signatures, exact bytes), so a scenario edited to expect something else cannot
make them pass; and a run seeded with a wrong expectation must fail.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.engine

# Chosen to cover the matrix's own verdict kinds in two launches, one server at a time,
# both on the stock build (0.27.1): MLA unsupported (the build cannot run the family), and
# a Gemma 3 style sliding-window round trip that fails exactly as expected (it stores
# window chunks no load can use) while loading exactly the window. The same two on the
# current build (passing, exact MLA bytes) run nightly; so do full attention, Mamba, plain
# sliding window and Llama 4 (whose #51150 crash and fixed round trip are the PR tier's
# crash-repro and roundtrip tests).
GEOMETRIES = ["--geometry", "deepseek-mla", "--geometry", "gemma3-interleaved", "--tier", "roomy"]
SUBSET = [*GEOMETRIES, "--variant", "stock"]
SUBSET_CURRENT = [*GEOMETRIES, "--variant", "current"]


def matrix(results: Path, *args: str, timeout: float = 2400) -> tuple[int, Path, str]:
    return run_cli(results, "matrix", *args, timeout=timeout)


def cells(run: Path) -> pd.DataFrame:
    return pd.read_csv(run / "matrix.csv", keep_default_na=False)


def cell(df: pd.DataFrame, geometry: str, variant: str, tier: str = "roomy") -> pd.Series:
    hit = df[(df.geometry == geometry) & (df.variant == variant) & (df.tier == tier)]
    assert len(hit) == 1, df[["geometry", "variant", "tier"]]
    return hit.iloc[0]


@pytest.fixture(scope="module")
def subset(tmp_path_factory):
    return matrix(tmp_path_factory.mktemp("matrix"), *SUBSET)


@pytest.fixture(scope="module")
def subset_current(tmp_path_factory):
    return matrix(tmp_path_factory.mktemp("matrix-current"), *SUBSET_CURRENT)


@pytest.mark.parametrize(
    "run_of", ["subset", pytest.param("subset_current", marks=pytest.mark.nightly)]
)
def test_subset_matches_every_expectation(request, run_of):
    code, run, out = request.getfixturevalue(run_of)
    assert code == 0, out
    df = cells(run)
    assert len(df) == 2 and df.matched.astype(str).eq("True").all(), df[["geometry", "why"]]
    meta = json.loads((run / "run.json").read_text())
    assert (meta["status"], meta["cells_matched"]) == ("finished", 2)


@pytest.mark.nightly
def test_llama4_crashes_on_stock_and_round_trips_on_current(rest_of_matrix):
    _, run, _ = rest_of_matrix
    df = cells(run)
    stock = cell(df, "llama4-roundtrip", "stock")
    assert (stock.startup, stock.known_issue, stock.vllm_version) == ("crashed", "51150", "0.27.1")
    assert "get_sliding_window_size_in_chunks" in stock.signature
    # The engine reported its groups before the connector asserted on them.
    assert stock.spec_classes == "ChunkedLocalAttentionSpec x3, FullAttentionSpec x1"
    current = cell(df, "llama4-roundtrip", "current")
    assert (current.startup, current.roundtrip) == ("started", "pass")
    assert current.spec_classes == "ChunkedLocalAttentionSpec x3, FullAttentionSpec x1"
    phases = pd.read_csv(Path(current.cell_dir) / "phases.csv").set_index("phase")
    assert phases.loc["replay", "d_loaded_bytes"] == 524_288
    assert phases.loc["replay", "d_ext_hits"] == 1280


def test_mla_unsupported_on_stock(subset):
    _, run, _ = subset
    stock = cell(cells(run), "deepseek-mla", "stock")
    assert stock.startup == "unsupported"
    assert "MLA is not supported on CPU" in stock.message
    assert stock.roundtrip == ""


@pytest.mark.nightly
def test_mla_exact_on_current(subset_current):
    _, run, _ = subset_current
    current = cell(cells(run), "deepseek-mla", "current")
    assert current.spec_classes == "MLAAttentionSpec x4"
    phases = pd.read_csv(Path(current.cell_dir) / "phases.csv").set_index("phase")
    # (512 latent + 64 rope) x 2 B x 4 layers = 4608 B/token; 512 + 768 tokens.
    assert phases.loc["cold", "d_stored_bytes"] == 4608 * 1280
    assert phases.loc["replay", "d_loaded_bytes"] == 4608 * 1280


# Loads on both builds: the full layer 1280 tokens x 256 B; the sliding layers only their
# window, 512 + 512 tokens x 768 B. 0.32 stores only what a window can reach; 0.27.1 also
# stores chunk 0 of the 1000-token prompt for the three sliding layers: 256 tokens x 768 B
# never loadable.
WINDOW_LOAD = 1280 * 256 + 1024 * 768
STORED = {"current": 1_114_112, "stock": 1_114_112 + 256 * 768}


@pytest.mark.parametrize(
    ("run_of", "variant"),
    [("subset", "stock"), pytest.param("subset_current", "current", marks=pytest.mark.nightly)],
)
def test_sliding_window_loads_only_the_window(request, run_of, variant):
    _, run, _ = request.getfixturevalue(run_of)
    row = cell(cells(run), "gemma3-interleaved", variant)
    assert row.spec_classes == "SlidingWindowSpec x3, FullAttentionSpec x1"
    phases = pd.read_csv(Path(row.cell_dir) / "phases.csv").set_index("phase")
    assert phases.loc["replay", "d_loaded_bytes"] == WINDOW_LOAD
    assert phases.loc["replay", "d_ext_hits"] == 1280
    assert phases.loc["cold", "d_stored_bytes"] == STORED[variant]
    expected = ("fail", "cold-stored-bytes") if variant == "stock" else ("pass", "")
    assert (row.roundtrip, row.failed_checks, str(row.matched)) == (*expected, "True")


def test_results_files(subset):
    _, run, _ = subset
    for name in ("run.json", "matrix.csv", "junit.xml", "report.md"):
        assert (run / name).is_file(), name
    suite = ET.parse(run / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "0"
    report = (run / "report.md").read_text()
    assert "every cell as expected" in report and "MLA is not supported on CPU" in report
    for d in cells(run).cell_dir:
        assert (Path(d) / "logs" / "server.log").is_file()


@pytest.mark.launches(1)
def test_a_wrong_expectation_fails_the_run_and_is_listed_first(tmp_path):
    """Seeded fault: Gemma 3 served with --disable-sliding-window, expected to pass.

    The engine then builds every layer as full attention; the kv-layout check must catch
    the reclassification, the cell must not match, and it must lead every output."""
    text = (ROOT / "scenarios" / "matrix.toml").read_text()
    text = text.replace(
        'roundtrip = "roundtrip-cpu.toml"', f'roundtrip = "{ROOT}/scenarios/roundtrip-cpu.toml"'
    )
    text = text.replace('geometry = "models/', f'geometry = "{ROOT}/scenarios/models/')
    # --disable-sliding-window also caps the model length at the window (512).
    text = text.replace(
        'about = "Gemma 3 style: 3 sliding-window layers (512) + 1 global layer"',
        'server_args = ["--enforce-eager", "--num-gpu-blocks-override", "96", '
        '"--disable-sliding-window"]\nmax_model_len = 512\ntarget_tokens = [300, 400]\n'
        "filler_tokens = 400",
    )
    path = tmp_path / "seeded.toml"
    path.write_text(text)
    results = tmp_path / "results"
    results.mkdir()
    code, run, out = matrix(
        results,
        "--scenario",
        str(path),
        "--geometry",
        "gemma3-interleaved",
        "--variant",
        "current",
        "--tier",
        "roomy",
    )
    assert code == 1, out
    df = cells(run)
    row = df.iloc[0]
    assert (row.geometry, str(row.matched)) == ("gemma3-interleaved", "False")
    assert row.spec_classes == "FullAttentionSpec x4"
    assert "kv-layout" in row.failed_checks.split()
    assert "NO:" in out and "some cells not as expected" in out


# The cells the PR tier leaves out: full attention (the base of every other test), the
# plain sliding window, the Mamba2 hybrid and Llama 4 (its #51150 crash and fixed round
# trip are the PR tier's crash-repro and roundtrip tests), on both builds.
REST = [
    "--tier",
    "roomy",
    "--geometry",
    "llama4-roundtrip",
    "--geometry",
    "llama3-full",
    "--geometry",
    "mistral-swa",
    "--geometry",
    "granite-hybrid-mamba",
]


@pytest.fixture(scope="module")
def rest_of_matrix(tmp_path_factory):
    return matrix(tmp_path_factory.mktemp("matrix-rest"), *REST)


@pytest.mark.nightly
def test_rest_of_matrix_matches_every_expectation(rest_of_matrix):
    code, run, out = rest_of_matrix
    assert code == 0, out
    df = cells(run)
    assert len(df) == 8 and df.matched.astype(str).eq("True").all(), df[["geometry", "why"]]
    stock_swa = cell(df, "mistral-swa", "stock")
    assert stock_swa.startup == "crashed" and "not divisible by tokens_per_hash" in (
        stock_swa.message
    )
    mamba = cell(df, "granite-hybrid-mamba", "current")
    assert (mamba.startup, mamba.roundtrip, mamba.failed_checks) == (
        "started",
        "fail",
        "engine-survived",
    )
    full = cell(df, "llama3-full", "current")
    assert (full.roundtrip, full.spec_classes) == ("pass", "FullAttentionSpec x4")


@pytest.mark.weekly
@pytest.mark.nightly
@pytest.mark.launches(2)
def test_two_families_under_pressure_load_no_evicted_chunk(tmp_path):
    """The matrix's pressure tier on Llama 4 (chunked-local + full) and Gemma 3 (sliding
    window + full) on current: a CPU tier of exactly the targets' chunks under LRU, so
    the filler's stores evict every target; each replay must hit and load nothing, store
    every chunk again and answer as the warm pass did, and the tier must have evicted.
    (The same round trip's lru-evicts-newest mutant: tests/integration/
    test_roundtrip_engine.py.)"""
    code, run, out = matrix(
        tmp_path,
        "--tier",
        "pressure",
        "--variant",
        "current",
        "--geometry",
        "llama4-roundtrip",
        "--geometry",
        "gemma3-interleaved",
    )
    assert code == 0, out
    df = cells(run)
    assert set(df.tier) == {"pressure"} and len(df) == 2
    for geometry in ("llama4-roundtrip", "gemma3-interleaved"):
        row = cell(df, geometry, "current", "pressure")
        assert (row.roundtrip, str(row.matched)) == ("pass", "True"), row.why
        checks = pd.read_csv(Path(row.cell_dir) / "checks.csv").set_index("name")
        assert {"tier-evicted", "replay-stored-bytes"} <= set(checks.index), geometry
        phases = pd.read_csv(Path(row.cell_dir) / "phases.csv").set_index("phase")
        assert phases.loc["replay", "d_ext_hits"] == 0, geometry
        assert phases.loc["replay", "d_loaded_bytes"] == 0, geometry
        assert phases.loc["replay", "d_stored_bytes"] == phases.loc["cold", "d_stored_bytes"]
