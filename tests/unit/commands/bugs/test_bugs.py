"""The bug corpus's pure logic: entries load and plan, scripts are refused before launch
when they could not run, prompts are the same on every build, and every cell is judged
both ways (reproduced where the bug lived, passed where it was fixed). The engine runs
are in tests/integration/test_bugs_engine.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.commands.bugs import corpus as bugs
from harness.commands.bugs import script as bug_script
from harness.commands.bugs import steps as bs
from harness.commands.sweep import Build, SweepCell
from harness.errors import BadInput
from harness.results.records import StepRecord
from harness.scenario.bugs import Step, load_bug
from harness.server.metrics import Snapshot

ROOT = Path(__file__).resolve().parents[4]
CORPUS = ROOT / "scenarios" / "bugs"
CPU_RELEASES = ["0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0"]


def entry(name: str):
    return load_bug(CORPUS / f"{name}.toml")


def cell(outcome: str, version: str, **kw) -> SweepCell:
    return SweepCell(
        version, kw.pop("check", "c"), "crash-repro", "s", outcome, vllm_version=version, **kw
    )


# --- the corpus as shipped ------------------------------------------------------------------
def test_every_entry_loads_plans_and_lives_in_an_installable_release():
    entries = bugs.load_corpus(CORPUS)
    assert len(entries) >= 5 and entries[0].id == "49118"
    targets = bugs.plan_targets_for(entries)
    checks = {c for t in targets for c in t.checks}
    for e in entries:
        assert bugs.check_id(e) in checks
        assert e.reproduce.strip(), f"{e.id}: no reproduction outside the harness"
        # Proven both ways needs somewhere to reproduce: a release here, or a GPU/AMX host,
        # or (a bug that lived only in releases no index here offers) its fix undone by a
        # patch, which the nightly engine tests run.
        lived = [r for r in CPU_RELEASES if bugs.expected_on(e, r) == bugs.REPRODUCED]
        assert lived or e.seeded_by, e.id
        if e.trigger.kind == "steps":
            bs.check_script(e)


def test_entries_sharing_a_scenario_share_one_target():
    entries = [entry("51150"), entry("amx-sigill"), entry("57727")]
    targets = bugs.plan_targets_for(entries)
    kinds = sorted((t.kind, t.amx, t.checks) for t in targets)
    assert kinds == [
        ("bug-steps", "auto", ("bug/57727",)),
        ("crash-repro", "auto", ("llama4-issue-51150/connector-on",)),
        ("crash-repro", "off", ("llama4-small-chunk/connector-off",)),
    ]


def test_an_unknown_bug_id_lists_the_corpus():
    with pytest.raises(BadInput, match="--bug 99999: no such entry; there are: 49118, 51150"):
        bugs.load_corpus(CORPUS, ["99999"])
    assert [e.id for e in bugs.load_corpus(CORPUS, ["#51150", "51150"])] == ["51150"]


def test_an_entry_must_be_named_by_its_id(tmp_path):
    shutil.copy(CORPUS / "51150.toml", tmp_path / "51151.toml")
    with pytest.raises(BadInput, match="must be the file's name"):
        load_bug(tmp_path / "51151.toml")


def test_a_check_that_is_only_part_of_an_id_is_refused(tmp_path):
    text = (CORPUS / "51150.toml").read_text()
    text = text.replace('check = "llama4-issue-51150/connector-on"', 'check = "connector-on"')
    text = text.replace('"../crash-repro.toml"', f'"{ROOT}/scenarios/crash-repro.toml"')
    (tmp_path / "51150.toml").write_text(text)
    with pytest.raises(BadInput, match="give a whole id"):
        bugs.plan_targets_for([load_bug(tmp_path / "51150.toml")])


def test_host_requirements():
    amx = entry("amx-sigill")
    assert bugs.host_lacks(amx, {"avx512f"}, False) == "needs amx_tile, which this host lacks"
    assert bugs.host_lacks(amx, {"amx_tile"}, False) == ""
    gpu = entry("51150").model_copy(update={"requires": ["gpu"]})
    assert bugs.host_lacks(gpu, {"amx_tile"}, False) == "needs gpu, which this host lacks"
    assert bugs.host_lacks(gpu, set(), True) == ""
    run = bugs.plan_corpus([amx, entry("51150")], [Build("0.32.0", "0.32.0", True)], "x", [], False)
    assert run.skipped == {"amx-sigill": "needs amx_tile, which this host lacks"}
    assert [t.checks for t in run.sweep.targets] == [("llama4-issue-51150/connector-on",)]
    (skipped, *_) = run.cells()
    assert skipped.outcome == "skipped" and skipped.matched is None


# --- scripts --------------------------------------------------------------------------------
def script_entry(tmp_path, steps: str, failing: str = "[]"):
    text = f"""
id = "1"
title = "t"
affected = ">=0.27"
[trigger]
kind = "steps"
scenario = "{ROOT}/scenarios/roundtrip-cpu.toml"
{steps}
[symptom]
outcome = "fail"
failing_checks = {failing}
"""
    path = tmp_path / "1.toml"
    path.write_text(text)
    return load_bug(path)


SEND_P = '[[trigger.steps]]\ndo = "send"\nname = "a"\nprompt = "P"\ntokens = 300\n'


@pytest.mark.parametrize(
    ("steps", "failing", "message"),
    [
        ('[[trigger.steps]]\ndo = "send"\nprompt = "P"\n', "[]", "is new, so it needs tokens"),
        (
            SEND_P + '[[trigger.steps]]\ndo = "expect"\nname = "x"\nwhat = "external_hits"\n'
            'since = "later"\nvalue = 0\n',
            "[]",
            "since 'later' names no earlier step",
        ),
        (
            SEND_P + '[[trigger.steps]]\ndo = "expect"\nname = "x"\nwhat = "external_hits"\n',
            "[]",
            "needs a value",
        ),
        (SEND_P, '["gone"]', "symptom names 'gone', which no expect step is"),
        (
            SEND_P + '[[trigger.steps]]\ndo = "expect"\nname = "x"\nwhat = "same_output"\n'
            'of = ["a"]\n',
            "[]",
            "same_output needs of = two named earlier sends",
        ),
        (
            SEND_P + '[[trigger.steps]]\ndo = "send"\nname = "b"\nprompt = "Q"\ntokens = 100\n'
            'prefix = "P"\nprefix_tokens = 200\n',
            "[]",
            "prefix_tokens 200 is longer than a prompt",
        ),
        (SEND_P + SEND_P, "[]", "name 'a' is used twice"),
        (
            SEND_P + '[[trigger.steps]]\ndo = "send"\nname = "b"\nprompt = "Q"\ntokens = 16\n'
            'after = "z"\n',
            "[]",
            "after 'z' names no earlier send",
        ),
        (
            SEND_P + '[[trigger.steps]]\ndo = "send"\nname = "b"\nprompt = "Q"\ntokens = 16\n'
            'after = "a"\nconcurrent = 2\n',
            "[]",
            "a next turn \\(after\\) is one request",
        ),
        (
            SEND_P + '[[trigger.steps]]\ndo = "evict"\nmax_tokens = 4\n',
            "[]",
            "max_tokens is not a field of evict steps",
        ),
        (
            SEND_P + '[[trigger.steps]]\ndo = "send"\nname = "b"\nprompt = "Q"\ntokens = 16\n'
            'abort = "queued"\nbackground = true\n',
            "[]",
            "an aborted send is one request of its own",
        ),
        (
            SEND_P + '[[trigger.steps]]\ndo = "send"\nname = "b"\nprompt = "Q"\ntokens = 16\n'
            'abort = "queued"\nconcurrent = 4\n',
            "[]",
            "an aborted send is one request of its own",
        ),
        (
            SEND_P + '[[trigger.steps]]\ndo = "expect"\nname = "x"\nwhat = "external_hits"\n'
            'value = 0\nabort = "queued"\n',
            "[]",
            "abort is not a field of expect steps",
        ),
    ],
)
def test_a_script_that_could_not_run_is_refused_before_launch(tmp_path, steps, failing, message):
    with pytest.raises(BadInput, match=message):
        bs.check_script(script_entry(tmp_path, steps, failing))


def test_prompts_are_the_same_everywhere_and_prefixes_are_shared():
    steps = [
        Step(do="send", prompt="P", tokens=500),
        Step(do="send", prompt="Q", tokens=400, prefix="P", prefix_tokens=300),
        Step(do="send", prompt="P"),
    ]
    a = bug_script.build_prompts(steps, 1000, 0)
    b = bug_script.build_prompts(steps, 1000, 0)
    assert a["P"].token_ids == b["P"].token_ids and len(a) == 2
    assert a["Q"].token_ids[:300] == a["P"].token_ids[:300]
    assert a["Q"].token_ids[300:] != a["P"].token_ids[300:400] and len(a["Q"].token_ids) == 400
    # the lower half of the vocabulary: evictions' fillers take the upper half
    assert max(a["P"].token_ids) < 508 and min(a["P"].token_ids) >= 16


def test_a_next_turn_sends_the_earlier_prompt_its_answer_and_its_own_tokens(monkeypatch):
    """``after``: what the named send sent and got back comes first (a chat's next turn,
    #54193's trigger); the offload_config reaches the connector's extra config."""
    from concurrent.futures import ThreadPoolExecutor

    from harness.results.records import StepRecord
    from harness.server.workload import Completion, Prompt

    sent: list[list[int]] = []

    def complete(base, model, prompt, phase, **kw):
        sent.append(prompt.token_ids)
        return Completion(phase, prompt.name, len(prompt.token_ids), {}, token_ids=[7, 8])

    monkeypatch.setattr(bug_script, "complete", complete)
    plan = type("P", (), {"served_name": "m"})()
    plan.scenario = type("S", (), {"workload": type("W", (), {"logprobs": 0, "seed": 0})()})()
    script = bug_script.Script(
        plan=plan, prompts={"A": Prompt("A", "target", [1, 2]), "B": Prompt("B", "target", [9])}
    )  # type: ignore[arg-type]
    ep = type("E", (), {"base": "http://127.0.0.1:1"})()
    with ThreadPoolExecutor(1) as pool:
        bug_script._send(
            script, ep, Step(do="send", prompt="A"), "first", pool, StepRecord(1, "send", "first")
        )
        rec = StepRecord(2, "send", "next")
        bug_script._send(script, ep, Step(do="send", prompt="B", after="first"), "next", pool, rec)
        bug_script._send(script, ep, Step(do="send", prompt="B", after="next"), "third", pool, rec)
    assert sent == [[1, 2], [1, 2, 7, 8, 9], [1, 2, 7, 8, 9, 7, 8, 9]]
    assert "after first's prompt and answer" in rec.detail or "after next's" in rec.detail
    entry = load_bug(ROOT / "scenarios" / "bugs" / "54193.toml")
    bs.check_script(entry)
    scn = bs.scenario_for(entry)
    assert scn.offload.extra_config["offload_prompt_only"] is False


def script_with(**before: Snapshot) -> bug_script.Script:
    s = bug_script.Script(plan=None, prompts={})  # type: ignore[arg-type]
    s.before.update(before)
    return s


def test_expect_reads_a_counter_since_a_step():
    s = script_with(start=Snapshot(), replay=Snapshot(ext_hits=512, ext_queries=600))
    now = Snapshot(ext_hits=1280, ext_queries=1300)
    step = Step(do="expect", name="x", what="external_hits", since="replay", value=0)
    got = bug_script._expect(s, step, now)
    assert not got.passed and got.observed == "external_hits since replay = 768"
    assert got.expected == "external_hits since replay == 0"
    assert bug_script._expect(s, step.model_copy(update={"op": ">"}), now).passed
    since_start = bug_script._expect(s, step.model_copy(update={"since": None, "value": 1280}), now)
    assert since_start.passed


@pytest.mark.parametrize(
    ("status", "body", "success"),
    [
        (200, '{"success": true}', 1.0),
        (200, '{"success": false}', 0.0),
        (200, "", 1.0),  # older servers answer a bare 200
        (404, '{"detail": "Not Found"}', 0.0),
    ],
)
def test_a_reset_answer_is_read_as_it_came(status, body, success):
    s = script_with()
    s.last_reset = StepRecord(1, "reset-prefix-cache", "r", http_status=status, body=body)
    assert (
        bug_script.observe(s, Step(do="expect", what="reset_success", value=1), Snapshot())
        == success
    )
    assert (
        bug_script.observe(s, Step(do="expect", what="http_status", value=200), Snapshot())
        == status
    )


def test_same_output_compares_token_ids():
    from harness.server.workload import Completion

    s = script_with()
    s.sent = {
        "a": [Completion("a", "P", 3, {}, token_ids=[1, 2])],
        "b": [Completion("b", "P", 3, {}, token_ids=[1, 3])],
    }
    step = Step(do="expect", name="same", what="same_output", of=["a", "b"])
    assert not bug_script._expect(s, step, Snapshot()).passed
    s.sent["b"][0].token_ids = [1, 2]
    assert bug_script._expect(s, step, Snapshot()).passed


# --- judging ----------------------------------------------------------------------------------
def test_a_crash_entry_is_judged_both_ways():
    e = entry("51150")
    lived = bugs.judge(e, cell("crashed", "0.27.1", known="#51150", signature="AssertionError"))
    assert (lived.outcome, lived.expected, lived.matched) == ("reproduced", "reproduced", True)
    fixed = bugs.judge(e, cell("started", "0.28.0"))
    assert (fixed.outcome, fixed.expected, fixed.matched) == ("passed", "passed", True)
    # The corpus cannot rot: a trigger that stops reproducing, or a fix that regresses.
    stopped = bugs.judge(e, cell("started", "0.27.1"))
    assert (
        stopped.matched is False
        and stopped.why == "did not reproduce on a release the bug lived in"
    )
    back = bugs.judge(e, cell("crashed", "0.30.0", known="#51150"))
    assert back.matched is False and back.why == "reproduced on a release with the fix"


def test_a_different_failure_is_an_error_not_a_reproduction():
    e = entry("51150")
    other = bugs.judge(e, cell("crashed", "0.27.1", signature="SIGSEGV in worker"))
    assert other.outcome == "error" and other.matched is False
    assert "a crash other than #51150" in other.why


def test_a_failing_checks_symptom_needs_exactly_its_checks():
    e = entry("57727")
    exact = cell("fail", "0.32.0", failing="reset-clears-offloaded")
    assert bugs.judge(e, exact).outcome == "reproduced"
    more = cell("fail", "0.32.0", failing="external-reset-clears,reset-clears-offloaded")
    judged = bugs.judge(e, more)
    assert judged.outcome == "error" and judged.matched is False
    assert bugs.judge(e, cell("pass", "0.32.0")).matched is False  # still open: must reproduce


def test_matrix_cells_and_crash_text():
    e = entry("54504")
    hit = bugs.judge(e, cell("started, fail", "0.32.0", failing="engine-survived"))
    assert hit.outcome == "reproduced" and hit.matched
    # 0.27-0.31 are neither affected nor fixed: judged by nothing, never unmatched
    before = bugs.judge(e, cell("started, pass", "0.31.0"))
    assert before.outcome == "passed" and before.matched is None and before.expected == ""


def test_cells_that_never_ran_are_not_judged():
    e = entry("51150")
    for outcome in ("unavailable", "not-run"):
        c = bugs.judge(e, cell(outcome, "0.26.0"))
        assert c.outcome == outcome and c.matched is None and c.expected == ""


def test_versions_and_reproduction_commands():
    e = entry("51150")
    assert bugs.expected_on(e, "0.27.0") == "reproduced"
    assert bugs.expected_on(e, "0.34.0.dev1") == "passed"
    assert bugs.expected_on(e, "") == ""
    assert bugs.reproduction(e, CPU_RELEASES) == (
        "offload-check bugs --bug 51150 --releases 0.27.1,0.28.0"
    )
    assert bugs.reproduction(entry("57727"), CPU_RELEASES).endswith("--releases 0.32.0")
    assert bugs.reproduction(e).endswith("--releases all")


def test_counts():
    cells = [
        bugs.BugCell("a", "r", "reproduced", matched=True),
        bugs.BugCell("a", "s", "passed", matched=False),
        bugs.BugCell("a", "t", "unavailable"),
    ]
    assert bugs.counts(cells) == (1, 1, 1)


def test_uninstallable_builds_leave_the_grid():
    from harness.results.markdown import sweep_grid, unavailable_builds

    cells = [
        bugs.BugCell("a", "0.8.5", "unavailable"),
        bugs.BugCell("amx", "0.8.5", "skipped"),
        bugs.BugCell("a", "0.32.0", "reproduced", matched=True),
        bugs.BugCell("amx", "0.32.0", "skipped"),
    ]
    assert unavailable_builds(cells, ["0.8.5", "0.32.0"]) == ["0.8.5"]
    headers, rows = sweep_grid(cells, ["0.8.5", "0.32.0"], row_of="bug", text_of="outcome")
    assert headers == ["bug", "0.32.0"] and rows == [["a", "reproduced"], ["amx", "skipped"]]


# --- scheduler-level triggers -----------------------------------------------------------------
def test_a_scheduler_drives_report_becomes_the_cell_the_corpus_judges():
    """An assertion is the build crashing, its text and vLLM's frame the signature (what
    a symptom's ``error`` matches); no assertion a pass; a drive that could not set up an
    error, never a pass."""
    from harness.commands.bugs import scheduler as bsch
    from harness.results.records import SweepCell

    def cell() -> SweepCell:
        return SweepCell("0.29.0", "bug/55712", "bug-scheduler", "55712", "")

    line = json.dumps(
        {
            "case": "swa-unaligned-hit",
            "vllm_version": "0.29.0",
            "outcome": "assert",
            "exception": "AssertionError: Block 7 not found in cache",
            "frame": "cpu/manager.py:141 in prepare_load",
            "figures": {"hit_tokens": 3904},
        }
    )
    report = bsch.parse_reports("INFO vLLM says hello\n" + line + "\n").get("swa-unaligned-hit")
    assert report is not None
    crashed = bsch.cell_from(report, cell())
    assert crashed.outcome == "crashed" and crashed.vllm_version == "0.29.0"
    assert (
        crashed.signature
        == "AssertionError: Block 7 not found in cache at cpu/manager.py:141 in prepare_load"
    )
    assert crashed.detail == "hit_tokens=3904"
    assert bsch.cell_from({**report, "outcome": "ok", "exception": None}, cell()).outcome == "pass"
    quiet = bsch.cell_from(
        {**report, "outcome": "fail", "exception": None, "failing": ["threshold-admits"]}, cell()
    )
    assert (quiet.outcome, quiet.failing, quiet.signature) == ("fail", "threshold-admits", "")
    err = bsch.cell_from({"outcome": "error", "exception": "no MambaSpec here"}, cell())
    assert err.outcome == "error" and "no MambaSpec here" in err.why
    assert bsch.parse_reports("no json at all\n{broken") == {}


def test_a_release_no_entry_of_a_check_judges_is_not_run_for_it():
    """#51875 names neither affected nor fixed for 0.27.x (its Llama 4 crashes at start
    there): its restart round trip is not launched on 0.27.1, but #51150's row is; on
    0.29.0 both run. A user's build runs everything (its version is not known yet)."""
    from harness.commands.sweep import NOT_JUDGED

    builds = [Build("0.27.1", "0.27.1", True), Build("0.29.0", "0.29.0", True)]
    run = bugs.plan_corpus([entry("51875"), entry("51150")], builds, "x", [], False)
    old, left = run.sweep.targets_for(builds[0])
    assert [t.checks for t in old] == [("llama4-issue-51150/connector-on",)]
    assert [(c.check, c.outcome) for c in left] == [("roundtrip/roundtrip-restart", NOT_JUDGED)]
    new, none_left = run.sweep.targets_for(builds[1])
    assert len(new) == 2 and not none_left
    mine, _ = run.sweep.targets_for(Build("my-build", "/x/python", False))
    assert len(mine) == 2
    judged = bugs.judge(entry("51875"), left[0])
    assert judged.outcome == NOT_JUDGED and judged.matched is None
