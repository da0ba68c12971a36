"""crash-repro against real vLLM servers (0.27.1 and 0.32.0 on CPU), one at a time.

These launch the real API server through the real OffloadingConnector; nothing is
faked. Each test asserts the verdicts themselves, not only that rows "matched",
so a scenario edited to expect the wrong thing cannot make them pass.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import psutil
import pytest

from harness.engine.amx import has_amx
from tests.conftest import CLI, ROOT, _shared_fixtures, run_cli, wait_for_engine

pytestmark = pytest.mark.engine
MODELS = ROOT / "scenarios" / "models"
# The default matrix: 2 models x 3 variants x connector on/off, plus current-no-amx on
# the small-chunk model (launched only on AMX hosts, skipped elsewhere). The PR tier runs
# the small-chunk model's rows with the connector on; the nightly tier the whole of
# `make crash-repro`, every control included (stock without the connector among them),
# and reads the small-chunk rows from it rather than launching them twice.
AMX_ROWS = {"small_chunk_matrix": 1, "default_matrix": 2}
ROWS = {"small_chunk_matrix": 3 + 1, "default_matrix": 20 + 2}
# Rows served by another row's launch: each model's stock+fix control by stock's.
SHARED = {"small_chunk_matrix": 0, "default_matrix": 2}
nightly = pytest.mark.nightly


def crash_repro(results: Path, *args: str, timeout: float = 1800) -> tuple[int, Path, str]:
    return run_cli(results, "crash-repro", *args, timeout=timeout)


def outcomes(run: Path) -> pd.DataFrame:
    return pd.read_csv(run / "outcomes.csv", keep_default_na=False)


@pytest.fixture(scope="module")
def default_matrix(tmp_path_factory):
    """The whole default matrix, as `make crash-repro` runs it: 12 rows in 10 launches
    (14 in 12 on AMX hosts), each stock+fix control served by the stock control's."""
    results = tmp_path_factory.mktemp("results")
    return crash_repro(results)


def _session_runs(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether any test this session selected uses ``fixture`` (as the launch budget
    counts it: tests/conftest.py)."""
    return any(fixture in _shared_fixtures(item) for item in request.session.items)


@pytest.fixture(scope="module")
def small_chunk_matrix(request, tmp_path_factory):
    """Every variant on the small-chunk model with the connector on (3 launches, 4 on AMX):
    the #51150 crash, its fix, the current build, and the AMX row. A session that runs the
    whole matrix too (the nightly tier) reads these rows from that run: the same servers,
    launched once."""
    if _session_runs(request, "default_matrix"):
        return request.getfixturevalue("default_matrix")
    results = tmp_path_factory.mktemp("results")
    return crash_repro(
        results, "--config", str(MODELS / "llama4-small-chunk.json"), "--connector", "on"
    )


def served_by_whole_matrix(run: Path) -> bool:
    return len(outcomes(run)) == ROWS["default_matrix"]


def matrix_outcomes(matrix: str, run: Path) -> pd.DataFrame:
    """The rows a matrix fixture stands for: the small-chunk view keeps its model's
    connector-on rows when the whole matrix served it."""
    df = outcomes(run)
    if matrix == "small_chunk_matrix":
        df = df[(df.model == "llama4-small-chunk") & (df.connector == "on")]
    return df.reset_index(drop=True)


def row(df: pd.DataFrame, model: str, variant: str, connector: str) -> pd.Series:
    hit = df[(df.model == model) & (df.variant == variant) & (df.connector == connector)]
    assert len(hit) == 1, df[["model", "variant", "connector"]]
    return hit.iloc[0]


@pytest.mark.parametrize(
    ("matrix", "model"),
    [
        ("small_chunk_matrix", "llama4-small-chunk"),
        pytest.param("default_matrix", "llama4-issue-51150", marks=nightly),
        pytest.param("default_matrix", "llama4-small-chunk", marks=nightly),
    ],
)
def test_matrix_verdicts(request, matrix, model):
    code, run, stdout = request.getfixturevalue(matrix)
    assert code == 0, stdout
    df = matrix_outcomes(matrix, run)
    assert len(df) == ROWS[matrix]

    stock = row(df, model, "stock", "on")
    assert stock.outcome == "crashed"
    assert stock.exception == "AssertionError"
    assert stock.frame.endswith("offloading/scheduler.py:get_sliding_window_size_in_chunks")
    assert int(stock.known_issue) == 51150
    assert stock.vllm_version == "0.27.1"

    fixed = row(df, model, "stock+fix", "on")
    assert fixed.outcome == "started" and str(fixed.answered) == "True"
    assert fixed.patch == "chunked-local-fix" and fixed.patch_status == "applied"

    current = row(df, model, "current", "on")
    assert current.outcome == "started" and str(current.answered) == "True"
    assert current.vllm_version == "0.32.0"
    # Which attention kernel ran is recorded, whatever this CPU made vLLM choose.
    assert current.kernels.startswith("CPUAttentionBackend/"), current.kernels

    if matrix == "default_matrix":
        for variant in ("stock", "stock+fix", "current"):
            control = row(df, model, variant, "off")
            assert control.outcome == "started" and str(control.answered) == "True", variant
        # The two stock controls were one server: one launch served both rows.
        assert row(df, model, "stock+fix", "off").launch == row(df, model, "stock", "off").launch
        assert row(df, model, "stock+fix", "off").patch == "none"
        launched = df[df.outcome != "skipped"]
        assert launched.launch.nunique() == len(launched) - 2  # one shared control per model
        assert len(json.loads((run / "run.json").read_text())["launches"]) == df.launch.max()
    else:
        assert set(df.connector) == {"on"}
    assert all(str(m) == "True" for m in df.matched)


@nightly
@pytest.mark.parametrize("model", ["llama4-scout-narrow", "llama4-maverick-narrow"])
def test_the_family_at_its_real_kv_layout_crashes_on_stock_and_starts_on_current(
    default_matrix, model
):
    """Scout's and Maverick's KV layouts (48 layers, chunk 8192) on narrow bodies: #51150
    on stock with the connector, every control and current starting and answering."""
    code, run, stdout = default_matrix
    assert code == 0, stdout
    df = outcomes(run)
    stock = row(df, model, "stock", "on")
    assert stock.outcome == "crashed" and int(stock.known_issue) == 51150
    assert stock.frame.endswith("offloading/scheduler.py:get_sliding_window_size_in_chunks")
    for variant, connector in (("stock", "off"), ("current", "on"), ("current", "off")):
        started = row(df, model, variant, connector)
        assert started.outcome == "started" and str(started.answered) == "True"
    assert df[df.model == model].variant.nunique() == 2  # stock and current only


def test_amx_sigill_row_follows_the_host(small_chunk_matrix):
    """The upstream AMX SIGILL (not an offloading bug): reproduced with the harness's fix
    switched off where the CPU has AMX, skipped with the reason where it has none."""
    _, run, _ = small_chunk_matrix
    df = matrix_outcomes("small_chunk_matrix", run)
    rows = df[df.variant == "current-no-amx"]
    assert list(rows.model) == ["llama4-small-chunk"] and list(rows.connector) == ["on"]
    for _, r in rows.iterrows():
        assert str(r.matched) == "True"
        if has_amx():
            assert r.expected == "crashed-on-first-request"
            assert r.outcome == "crashed-on-first-request", r.why
            # The frame of the AMX kernel the host reached first (attention or MoE),
            # never a helper thread's; or none, where the worker was killed before its
            # dump reached a vLLM frame (seen twice in a row on one AMX host,
            # 2026-12-06: `Thread 0x... (most recent call first):` then `  File ` and
            # nothing more). The crash is then known by the kernel the worker reported.
            # Or no dump at all, the worker killed before its handler wrote a line (the
            # same host, the next run): known by its kernel, the death as vLLM saw it. A
            # dump torn before even its process was named reads "(unknown)" (the same
            # host, a fresh clone's `make test`, 2026-12-06).
            cut_before_vllm = r.signature in (
                "SIGILL (worker) (known: amx-sigill)",
                "SIGILL (unknown) (known: amx-sigill)",
            )
            no_dump = r.signature.startswith("VllmWorker-0 died unexpectedly (no stack") and (
                r.signature.endswith("(known: amx-sigill, by its reported kernel)")
            )
            assert cut_before_vllm or no_dump or r.signature.startswith("SIGILL in vllm/"), (
                r.signature
            )
            assert "death_pipe_monitor" not in r.signature, r.signature
            assert r.known_issue == "amx-sigill"
        else:
            # The SIGILL rule holds only on CPUs with AMX: here the catch-all's, unlaunched.
            assert r.expected == "started"
            assert r.outcome == "skipped"
            assert "needs a CPU with amx_tile" in r.why


@pytest.mark.launches(1)
def test_worker_sigsegv_is_a_first_request_crash_with_its_stack(tmp_path):
    """Seeded fault: the host backend reads address 0 in the worker's first step. The
    verdict must name the signal, the dying vLLM frame and the process, not report a
    server that merely "did not answer"."""
    scen = tmp_path / "segv.toml"
    scen.write_text(f"""
name = "segv"
variants_file = "{ROOT}/scenarios/variants.toml"
variants = ["current"]
models = ["{MODELS}/llama4-small-chunk.json"]
connector = ["on"]
[server]
load_format = "dummy"
extra_args = ["--enforce-eager"]
[offload]
cpu_bytes_to_use = 268435456
extra_config = {{ offload_check_fault = "segv-in-worker" }}
[[expectations]]
outcome = "crashed-on-first-request"
""")
    code, run, stdout = crash_repro(tmp_path / "results", "--scenario", str(scen))
    df = outcomes(run)
    assert code == 0, stdout
    r = df.iloc[0]
    assert r.outcome == "crashed-on-first-request"
    assert r.exception == "SIGSEGV"
    assert r.frame == (
        "vllm/distributed/kv_transfer/kv_connector/v1/offloading/worker.py:get_finished"
    )
    assert r.signature.endswith("(worker)"), r.signature
    assert "Fatal Python error: Segmentation fault" in Path(r.log).read_text()


@pytest.mark.parametrize(
    "matrix", ["small_chunk_matrix", pytest.param("default_matrix", marks=nightly)]
)
def test_matrix_results_files(request, matrix):
    _, run, stdout = request.getfixturevalue(matrix)
    if matrix == "small_chunk_matrix" and served_by_whole_matrix(run):
        pytest.skip("the whole matrix served these rows: its own files are checked by [default]")
    rows = ROWS[matrix]
    # One log per launch: rows that shared a launch (the stock+fix controls) share its log.
    df = outcomes(run)
    launched = df[df.outcome != "skipped"].launch.nunique()
    assert launched == rows - (0 if has_amx() else AMX_ROWS[matrix]) - SHARED[matrix]
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "finished" and meta["exit_code"] == 0
    assert meta["variants"]["stock"]["vllm_version"] == "0.27.1"
    assert meta["variants"]["current"]["vllm_version"] == "0.32.0"
    assert meta["variants"]["current"]["torch"] and meta["variants"]["current"]["transformers"]
    assert meta["scenario"]["name"] == "crash-repro"
    assert meta["platform"]["cpu"]
    suite = ET.parse(run / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == str(rows)
    assert suite.get("failures") == "0"
    logs = list((run / "logs").glob("*.log"))
    assert len(logs) == launched
    assert meta["host"]["amx_permission"] == ("requested" if has_amx() else "not-needed")
    assert "all rows as expected" in stdout


@nightly
@pytest.mark.launches(1)
def test_floor_mutant_starts_on_stock(tmp_path):
    """The mutant is not a crash: only the round trip can catch it."""
    code, run, _ = crash_repro(
        tmp_path,
        "--variant",
        "stock",
        "--patch",
        "chunked-local-floor",
        "--config",
        str(MODELS / "llama4-small-chunk.json"),
        "--connector",
        "on",
    )
    df = outcomes(run)
    assert code == 0
    assert df.outcome.tolist() == ["started"] and df.patch_status.tolist() == ["applied"]


@nightly
@pytest.mark.launches(1)
def test_no_chunked_layers_starts_on_stock(tmp_path):
    """Expectations follow the config: attention_chunk_size null means no #51150."""
    code, run, _ = crash_repro(
        tmp_path,
        "--variant",
        "stock",
        "--config",
        str(MODELS / "llama4-no-chunk.json"),
        "--connector",
        "on",
    )
    df = outcomes(run)
    assert code == 0
    assert df.outcome.tolist() == ["started"] and str(df.answered[0]) == "True"


# Nightly: the PR tier proves a wrong crash-repro rule is caught through the same judge
# (harness.server.crash_signatures via crash_repro.execute) in
# tests/integration/test_sweep_engine.py.
@nightly
@pytest.mark.launches(1)
def test_wrong_expectation_is_reported_as_a_mismatch(tmp_path):
    """Seeded fault: a stock build where the scenario expects a start must fail the run."""
    scen_dir = tmp_path / "scen"
    scen_dir.mkdir()
    text = (ROOT / "scenarios" / "crash-repro.toml").read_text()
    head, _, _ = text.partition("# Expectations:")
    (scen_dir / "s.toml").write_text(
        head.replace(
            'variants_file = "variants.toml"', f'variants_file = "{ROOT}/scenarios/variants.toml"'
        ).replace('"models/', f'"{ROOT}/scenarios/models/')
        + '\n[[expectations]]\noutcome = "started"\n'
    )
    results = tmp_path / "results"
    code, run, _ = crash_repro(
        results,
        "--scenario",
        str(scen_dir / "s.toml"),
        "--variant",
        "stock",
        "--connector",
        "on",
        "--config",
        str(MODELS / "llama4-small-chunk.json"),
    )
    assert code == 1
    df = outcomes(run)
    assert df.outcome.tolist() == ["crashed"] and str(df.matched[0]) == "False"
    failure = ET.parse(run / "junit.xml").getroot().find(".//failure")
    assert failure is not None and "expected started, got crashed" in failure.get("message", "")


@pytest.mark.launches(1)
def test_startup_timeout_tears_everything_down(tmp_path):
    code, run, _ = crash_repro(
        tmp_path,
        "--variant",
        "current",
        "--connector",
        "off",
        "--config",
        str(MODELS / "llama4-small-chunk.json"),
        "--timeout",
        "4",
    )
    df = outcomes(run)
    assert code == 1
    assert df.outcome.tolist() == ["timeout"]


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.launches(1)
def test_ctrl_c_stops_servers_and_keeps_results(tmp_path):
    proc = subprocess.Popen(
        [
            *CLI,
            "crash-repro",
            "--results-dir",
            str(tmp_path),
            "--variant",
            "current",
            "--connector",
            "off",
            "--config",
            str(MODELS / "llama4-small-chunk.json"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A terminal's Ctrl-C, whatever started this test session: a test runner launched
        # in the background of a shell without job control inherits SIGINT ignored, and
        # Python keeps an inherited SIG_IGN, so the harness would never see the signal.
        preexec_fn=_sigint_default,
    )
    # Wait until the engine has spawned children, so there is a tree to tear down.
    ours = wait_for_engine(proc)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    _, alive = psutil.wait_procs(ours, timeout=30)
    assert not alive, [p.pid for p in alive]
    run = next(tmp_path.iterdir())
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "interrupted"


@pytest.mark.launches(1)
def test_sigkilled_harness_leaves_no_server(tmp_path):
    """Even a harness killed with SIGKILL (no handler runs) takes its server with it."""
    proc = subprocess.Popen(
        [
            *CLI,
            "crash-repro",
            "--results-dir",
            str(tmp_path),
            "--variant",
            "current",
            "--connector",
            "off",
            "--config",
            str(MODELS / "llama4-small-chunk.json"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ours = wait_for_engine(proc)
    proc.kill()
    proc.wait()
    _, alive = psutil.wait_procs(ours, timeout=60)
    assert not alive, [p.pid for p in alive]
