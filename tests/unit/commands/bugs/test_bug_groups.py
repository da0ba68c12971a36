"""Bug entries sharing one launch (harness.commands.bugs.groups): which entries group,
what each keeps of its own, and the runners' plumbing for a group (a shared server's
reset verdict, one drive process answering several entries)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.commands.bugs import scheduler as bsch
from harness.commands.bugs import script as bug_script
from harness.commands.bugs import steps as bs
from harness.commands.bugs.corpus import load_corpus, plan_targets_for
from harness.commands.bugs.groups import EntryGroup, group_by_launch, launch_key
from harness.commands.sweep import KIND_SCHEDULER, KIND_STEPS, Build, Job
from harness.commands.sweep.runners import variant_for
from harness.results.records import SweepCell
from tests.conftest import ROOT

BUGS = ROOT / "scenarios" / "bugs"


def entry(bug: str, **trigger: object):
    (e,) = load_corpus(BUGS, [bug])
    return e.model_copy(update={"trigger": e.trigger.model_copy(update=trigger)})


def test_the_shipped_scripts_share_one_server_and_the_drives_one_process():
    targets = plan_targets_for(load_corpus(BUGS))
    steps = [t for t in targets if t.kind == KIND_STEPS]
    drives = [t for t in targets if t.kind == KIND_SCHEDULER]
    assert [t.checks for t in steps] == [("bug/49118", "bug/54193", "bug/57596", "bug/57727")]
    assert [t.checks for t in drives] == [("bug/52170", "bug/52807", "bug/54759", "bug/55712")]
    assert steps[0].name == steps[0].slug == "bug-49118+54193+57596+57727"
    every = [c for t in targets for c in t.checks]
    assert len(every) == len(set(every))  # each entry's check runs once


@pytest.mark.parametrize(
    "change",
    [
        {"env": {"VLLM_SERVER_DEV_MODE": "1", "OTHER": "x"}},
        {"offload_config": {"offload_prompt_only": True}},
        {"server_args": ["--max-num-seqs", "2"]},
        {"geometry": "../models/llama4-roundtrip.json"},
        {"offload_block_size": 512},
    ],
)
def test_any_difference_in_the_launch_keeps_entries_apart(change):
    a, b = entry("57727"), entry("57596")
    assert launch_key(a) == launch_key(b)
    changed = b.model_copy(update={"trigger": b.trigger.model_copy(update=change)})
    assert launch_key(a) != launch_key(changed)
    groups = group_by_launch([a, changed, entry("54193")])
    assert [[e.id for e in g.entries] for g in groups] == [["57727", "54193"], ["57596"]]


def test_the_steps_not_the_launch_are_an_entrys_own():
    a = entry("57727")
    b = entry("57727", steps=entry("57596").trigger.steps)
    assert launch_key(a) == launch_key(b)


def test_a_group_names_its_entries_and_a_lone_entry_keeps_its_old_name():
    one = EntryGroup((entry("54193"),))
    two = EntryGroup((entry("54193"), entry("57727")))
    assert (one.name, one.source) == ("bug-54193", BUGS / "54193.toml")
    assert (two.name, two.source) == ("bug-54193+57727", Path("bug-54193+57727"))
    assert [e.id for e in two.chosen(["bug/57727", "bug/other"])] == ["57727"]


def test_two_entries_prompts_of_one_name_differ_and_each_is_stable():
    """Two scripts on one server each say "P": the entry's id seeds its tokens."""
    a = bug_script.prompt_tokens("P", 64, 1000, 0, "57727")
    assert a == bug_script.prompt_tokens("P", 64, 1000, 0, "57727")
    assert a[:8] != bug_script.prompt_tokens("P", 64, 1000, 0, "57596")[:8]


@pytest.mark.parametrize(
    ("status", "body", "ok"),
    [
        (200, '{"success": true}', True),
        (200, '{"success": false}', False),  # the server says it did not reset
        (200, "", True),  # older servers: a bare 200
        (200, "OK", True),
        (404, "", False),  # no dev endpoints: the next entry gets a fresh server
        (None, "", False),
    ],
)
def test_a_shared_server_serves_the_next_entry_only_after_an_accepted_reset(status, body, ok):
    assert bs.reset_accepted(status, body) is ok


# --- one drive process for several entries -------------------------------------------------
FAKE_DRIVE = """
import json, sys
print("vLLM logs to stdout too")
for case in sys.argv[1:]:
    if case == "missing-offload-key":
        continue  # as if the process died before this case
    outcome = "assert" if case == "swa-unaligned-hit" else "ok"
    print(json.dumps({"case": case, "vllm_version": "0.0.test", "outcome": outcome,
                      "exception": "AssertionError: x" if outcome == "assert" else None,
                      "frame": "manager.py:1 in prepare_load" if outcome == "assert" else None,
                      "figures": {"n": 1}, "steps": []}))
sys.exit(3)
"""


class Quiet:
    def status(self, message: str) -> None: ...


def test_one_drive_process_answers_each_entry_and_a_missing_answer_is_an_error(
    tmp_path, monkeypatch
):
    (tmp_path / "fake_drive.py").write_text(FAKE_DRIVE)
    monkeypatch.setattr(bsch, "DRIVE_MODULE", "fake_drive")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    entries = tuple(load_corpus(BUGS, ["55712", "52807", "52170"]))
    from harness.commands.sweep import Target

    target = Target(KIND_SCHEDULER, EntryGroup(entries), ("bug/55712", "bug/52807", "bug/52170"))
    build = Build("0.29.0", "0.29.0", True)
    seen: list[SweepCell] = []
    job = Job(
        target,
        build,
        variant_for(build, sys.executable),
        tmp_path / "out",
        Quiet(),  # type: ignore[arg-type]
        seen.append,
    )
    cells = bsch.run_scheduler(job)
    assert cells == seen
    assert [(c.check, c.outcome) for c in cells] == [
        ("bug/55712", "crashed"),
        ("bug/52807", "pass"),
        ("bug/52170", "error"),
    ]
    assert "printed no report (exit 3)" in cells[2].why
    assert cells[0].signature == "AssertionError: x at manager.py:1 in prepare_load"
    # Each entry keeps its own run directory and report; the process's output is kept once.
    assert (
        json.loads((tmp_path / "out" / "55712" / "drive.json").read_text())["outcome"] == "assert"
    )
    assert not (tmp_path / "out" / "52170" / "drive.json").exists()
    assert "vLLM logs" in (tmp_path / "out" / "drive.stdout").read_text()
    meta = json.loads((tmp_path / "out" / "52807" / "run.json").read_text())
    assert meta["bug"] == "52807" and meta["drive_argv"][-3:] == [
        "swa-unaligned-hit",
        "mamba-unhashed-block",
        "missing-offload-key",
    ]
