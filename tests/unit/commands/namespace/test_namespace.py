"""The namespace matrix's pure parts: which changes a restart makes (each exactly one
thing), how a restarted server is judged against its own clean-cache control, and the
plan's refusals. The live matrix is tests/integration/test_namespace_live.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.commands.namespace import changes as ch
from harness.commands.namespace.judge import (
    HIT_ALL,
    MISSED,
    NO_REUSE,
    REUSED_SAME,
    WRONG_ANSWERS,
    WRONG_REUSE,
    Served,
    judge,
    noise,
)
from harness.commands.namespace.plan import plan_namespace
from harness.errors import BadInput
from harness.scenario.roundtrip import load_roundtrip
from harness.server.workload import Completion

SCENARIO = Path(__file__).resolve().parents[4] / "scenarios" / "roundtrip-namespace.toml"


def answer(first: float, tokens: tuple[int, ...] = (7, 8), name: str = "target-0") -> Completion:
    logprobs = {
        "token_logprobs": [first, -5.5],
        "top_logprobs": [{"t7": first}, {"t8": -5.5}],
        "tokens": [f"t{t}" for t in tokens],
        "text_offset": [0, 2],
    }
    return Completion("replay", name, 700, {}, "", list(tokens), logprobs)


def served(hit: float, replay: float, control: float = -6.0, again: float = -6.0, **kw):
    return Served(hit, hit * 1024, 0, [answer(replay, **kw)], [answer(control)], [answer(again)])


def test_the_unchanged_restart_must_hit_every_target_token_and_answer_right():
    assert judge(True, 1280, served(1280, -6.0))[:2] == (HIT_ALL, True)
    assert judge(True, 1280, served(0, -6.0))[:2] == (MISSED, False)
    assert judge(True, 1280, served(1280, -6.5))[:2] == (WRONG_ANSWERS, False)


def test_the_unchanged_restart_also_answers_as_the_server_that_wrote_the_tier():
    outcome, kept, answers, *_ = judge(True, 1280, served(1280, -6.0), [answer(-6.25)])
    assert (outcome, kept) == (WRONG_ANSWERS, False)
    assert answers.startswith("against the writing server")


def test_a_change_may_hit_nothing_or_answer_as_a_clean_cache():
    assert judge(False, 1280, served(0, -6.0))[:2] == (NO_REUSE, True)
    assert judge(False, 1280, served(512, -6.0))[:2] == (REUSED_SAME, True)


def test_stale_kv_that_changes_the_answers_is_wrong_reuse():
    outcome, kept, answers, tol, diffs = judge(False, 1280, served(1280, -6.0, tokens=(9, 8)))
    assert (outcome, kept) == (WRONG_REUSE, False)
    assert "token_ids differ from position 0" in answers and tol == 0.0
    assert diffs[0]["expected"] == [7, 8] and diffs[0]["observed"] == [9, 8]


def test_the_tolerance_is_four_times_the_engines_own_cached_vs_computed_noise():
    """An engine whose numerics depend on the cached split (1e-5 apart, the AMX MLA
    kernel) may stray 4e-5; a stale KV moves logprobs by orders more."""
    assert noise([answer(-6.0)], [answer(-6.00001)]) == pytest.approx(1e-5)
    assert judge(False, 1280, served(512, -6.00003, again=-6.00001))[:2] == (REUSED_SAME, True)
    assert judge(False, 1280, served(512, -6.0001, again=-6.00001))[:2] == (WRONG_REUSE, False)


def test_every_change_makes_exactly_one_difference_to_the_server():
    scn = load_roundtrip(SCENARIO)
    base = ch.Inputs(scn, {"variant": "current"})
    made = {c.name: c.apply(base) for c in ch.CHANGES}
    assert made["unchanged"] == base
    rope = made["rope-scaling"].options["extra_args"]
    assert rope[0] == "--hf-overrides" and json.loads(rope[1])["rope_scaling"]["factor"] == 8.0
    assert json.loads(rope[1])["rope_scaling"]["rope_theta"] == 500000.0  # the model's
    assert made["weight-seed"].weight_seed == 1 and made["weight-seed"].scenario is scn
    assert made["dtype"].options["extra_args"] == ["--dtype", "float32"]
    assert made["block-size"].scenario.server.block_size == scn.server.block_size // 2
    assert made["offload-chunk"].scenario.offload.block_size == 2 * scn.offload.block_size
    assert scn.server.block_size == 128 and scn.offload.block_size == 256  # not mutated
    assert made["tp"].options["tp"] == 2
    assert made["kv-layout"].env == {"VLLM_KV_CACHE_LAYOUT": "HND"}


def test_choosing_changes_keeps_the_unchanged_restart_first():
    assert [c.name for c in ch.choose(["tp", "rope-scaling"])] == [
        "unchanged",
        "rope-scaling",
        "tp",
    ]
    assert len(ch.choose([])) == len(ch.CHANGES)
    with pytest.raises(BadInput, match="unknown change 'rope'"):
        ch.choose(["rope"])


def test_the_plan_serves_every_server_one_model_path_and_names_what_cpu_cannot_change():
    plan = plan_namespace(load_roundtrip(SCENARIO), ch.CHANGES)
    (build,) = plan.builds
    assert build.writer.server is not None
    models = {build.writer.server.model} | {r.plan.server.model for r in build.readers if r.plan}
    assert models == {"<build dir>/model"}
    by = {r.change.name: r for r in build.readers}
    if build.device == "cpu":
        assert by["kv-layout"].plan is None and "one KV layout" in by["kv-layout"].skipped
    tp = by["tp"].plan
    assert tp is not None and tp.tensor_parallel == 2
    assert by["weight-seed"].weight_seed == 1
    assert by["offload-chunk"].plan is not None
    assert by["offload-chunk"].plan.tokens_per_chunk == 512


def test_a_scenario_without_a_disk_tier_or_with_a_targets_sized_tier_is_refused():
    scn = load_roundtrip(SCENARIO)
    with pytest.raises(BadInput, match="needs a disk tier"):
        plan_namespace(
            scn.model_copy(update={"offload": scn.offload.model_copy(update={"disk": None})}), ()
        )
    targets = scn.offload.model_copy(update={"cpu_bytes_to_use": "targets"})
    with pytest.raises(BadInput, match="another TP"):
        plan_namespace(scn.model_copy(update={"offload": targets}), ())


def test_a_known_bug_names_the_row_on_its_releases_and_says_when_it_stopped():
    from harness.commands.namespace.run import known_bug

    rope = ch.BY_NAME["rope-scaling"]
    assert known_bug(rope, "0.32.0", WRONG_REUSE).issue == 56311
    assert known_bug(rope, "0.28.0", WRONG_REUSE) is None  # before hashes were stable
    assert known_bug(rope, "0.32.0", NO_REUSE).issue == 56311  # fixed: said so
    assert known_bug(rope, "0.32.0", "not-started") is None
    assert known_bug(ch.BY_NAME["unchanged"], "0.28.0", MISSED).issue == 51875
    assert known_bug(ch.BY_NAME["dtype"], "0.32.0", WRONG_REUSE) is None


def test_halving_the_block_keeps_the_pool_in_tokens():
    scn = load_roundtrip(SCENARIO)
    half = ch.BY_NAME["block-size"].apply(ch.Inputs(scn)).scenario
    assert half.server.extra_args[-1] == "192" and scn.server.extra_args[-1] == "96"


def test_the_command_plans_on_dry_run_and_refuses_bad_input_in_one_line():
    from tests.unit.cli.cli_in_process import invoke, one_line

    code, out, _ = invoke("namespace", "--dry-run", "--json", "--change", "tp")
    assert code == 0
    plan = json.loads(out)
    assert plan["changes"] == ["unchanged", "tp"]
    (build,) = plan["builds"]
    assert build["expected_hit_tokens"] == 1280
    assert [r["change"] for r in build["readers"]] == ["unchanged", "tp"]
    code, _, err = invoke("namespace", "--dry-run", "--change", "rope")
    assert code == 2 and "unknown change 'rope'" in one_line(err)
    code, _, err = invoke("namespace", "--dry-run", "--releases", "0.19.0")
    assert code == 2 and "envs create 0.19.0" in one_line(err)
