"""The mutation-testing CI, checked offline: ``.github/workflows/mutate.yml`` (a plan job
listing the shards, one matrix job per shard, a merge job) and the GPU nightly's worker
sample in ``nightly-gpu.yml``.

The schema, structure, bash-syntax and zizmor checks of ``test_ci_files.py`` cover
mutate.yml through its ``GH_FILES``; here each job's script is run as written: the plan's
with the inputs' defaults, each shard's against a stub ``offload-check`` that records its
arguments (and then the real CLI's dry run of them), the merge's with the real CLI on shard
sessions made here, then the summary and next week's compare on what it wrote.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
import stat
from pathlib import Path
from typing import Any

import pytest

from harness.commands.mutate.execute import SUITE
from harness.commands.mutate.mutants import Mutant, mutant_id
from harness.commands.mutate.session import Session
from tests.unit.repo.test_ci_files import (
    BIN,
    CLI,
    MUTATE,
    NIGHTLY,
    NIGHTLY_MUTATE,
    ROOT,
    dispatch_inputs,
    gh_steps,
    invocations,
    load,
    logical_lines,
    resolve_gh_value,
    run,
    workflow_problems,
    zizmor,
)

SCHEDULER = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"


# --- helpers -----------------------------------------------------------------------


def step(doc: dict[str, Any], job: str, name: str) -> dict[str, Any]:
    (found,) = [s for s in doc["jobs"][job]["steps"] if s.get("name") == name]
    return found


def step_env(doc: dict[str, Any], job: str, found: dict[str, Any]) -> dict[str, str]:
    """The step's environment on a run with the inputs' defaults (dispatch or schedule)."""
    inputs = dispatch_inputs(doc)
    env = {k: resolve_gh_value(v, inputs) for k, v in (doc["jobs"][job].get("env") or {}).items()}
    env.update({k: resolve_gh_value(v, inputs) for k, v in (found.get("env") or {}).items()})
    return env


def run_step(
    script: str, cwd: Path, env: dict[str, str], path: str | None = None
) -> tuple[int, str, str]:
    """A step's ``run:`` as GitHub runs it (bash -e -o pipefail), in ``cwd``."""
    full = {**os.environ, **env}
    if path is not None:
        full["PATH"] = path
    proc = run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=cwd, env=full
    )
    return proc.returncode, proc.stdout, proc.stderr


def stub(where: Path, code: int = 0) -> Path:
    """An ``offload-check`` that records its arguments, one per line, and exits ``code``."""
    where.parent.mkdir(parents=True, exist_ok=True)
    log = where.parent / "args.json"
    where.write_text(
        "#!/usr/bin/env python3\n"
        "import json, sys\n"
        f"open({str(log)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
        f"sys.exit({code})\n"
    )
    where.chmod(where.stat().st_mode | stat.S_IEXEC)
    return log


def plan_outputs(tmp_path: Path, shards: str) -> tuple[int, dict[str, str]]:
    doc = load(MUTATE)
    listing = step(doc, "plan", "List the shards")
    out = tmp_path / f"output-{shards}"
    env = {**step_env(doc, "plan", listing), "SHARDS": shards, "GITHUB_OUTPUT": str(out)}
    code, _, _ = run_step(listing["run"], tmp_path, env)
    lines = out.read_text().splitlines() if out.exists() else []
    return code, dict(line.split("=", 1) for line in lines)


# --- the workflow's shape ------------------------------------------------------------


def test_mutate_workflow_shape() -> None:
    doc = load(MUTATE)
    assert doc["on"]["schedule"][0]["cron"]
    inputs = dispatch_inputs(doc)
    assert {k: v["default"] for k, v in inputs.items()} == {
        "target": SCHEDULER,
        "commands": "suite",
        "sample": 20,
        "seed": "1",
        "shards": 4,
    }
    assert doc["concurrency"]["cancel-in-progress"] is False
    jobs = doc["jobs"]
    assert list(jobs) == ["plan", "mutate", "merge"]
    assert jobs["plan"]["permissions"] == {}
    assert jobs["plan"]["outputs"] == {
        "shards": "${{ steps.list.outputs.shards }}",
        "count": "${{ steps.list.outputs.count }}",
    }
    assert step(doc, "plan", "List the shards")["id"] == "list"
    shard_job = jobs["mutate"]
    assert shard_job["needs"] == "plan"
    assert shard_job["strategy"]["fail-fast"] is False
    assert shard_job["strategy"]["matrix"] == {
        "shard": "${{ fromJSON(needs.plan.outputs.shards) }}"
    }
    mutating = step(doc, "mutate", "Mutate one shard")
    # i from the matrix, n from the plan's own count: the two cannot disagree.
    assert mutating["env"]["SHARD"] == "${{ matrix.shard }}"
    assert mutating["env"]["SHARDS"] == "${{ needs.plan.outputs.count }}"
    # The step stops before the job does, so the upload still runs.
    assert mutating["timeout-minutes"] < shard_job["timeout-minutes"]
    upload = step(doc, "mutate", "Upload this shard's results")
    assert upload["with"]["name"] == "mutate-shard-${{ matrix.shard }}"
    assert upload["with"]["path"].split() == ["results/", "!results/*/mutants/*/env/**"]
    make = [a for s in shard_job["steps"] for a in invocations(s.get("run", ""), {}, "make")]
    assert make == [["setup", "TORCH_INDEX=https://download.pytorch.org/whl/cpu"]]

    merge = jobs["merge"]
    assert merge["needs"] == "mutate" and merge["if"] == "always()"
    download = step(doc, "merge", "Download every shard's results")
    pattern = download["with"]["pattern"]
    assert pattern == "mutate-shard-*"
    assert all(fnmatch.fnmatch(f"mutate-shard-{i}", pattern) for i in range(16))
    assert not fnmatch.fnmatch("mutate-merged-1234", pattern)
    restore = step(doc, "merge", "Restore the previous run of this plan")
    save = step(doc, "merge", "Save it")
    assert restore["with"]["key"] == save["with"]["key"]
    assert save["with"]["key"].startswith(restore["with"]["restore-keys"].strip())
    junit = step(doc, "merge", "Publish JUnit results")
    assert junit["with"]["report_paths"] == "results/*/junit.xml"
    assert "checks" not in (jobs["mutate"]["permissions"] or {})


def test_mutate_workflow_passes_zizmor_and_the_structure_rules(tmp_path: Path) -> None:
    assert workflow_problems(load(MUTATE), MUTATE.read_text()) == []
    for persona in ("regular", "auditor"):
        code, findings, err = zizmor(MUTATE, "--persona", persona)
        assert (code, findings) == (0, []), err
    # An input pasted into the script is what both catch.
    text = MUTATE.read_text()
    assert '--target "$TARGET"' in text
    broken = tmp_path / MUTATE.name
    broken.write_text(text.replace('--target "$TARGET"', "--target ${{ inputs.target }}"))
    code, findings, _ = zizmor(broken)
    assert code != 0 and "template-injection" in {f["ident"] for f in findings}
    assert workflow_problems(load(broken), broken.read_text())


# --- the plan job -----------------------------------------------------------------


def test_plan_lists_the_shards(tmp_path: Path) -> None:
    doc = load(MUTATE)
    listing = step(doc, "plan", "List the shards")
    assert step_env(doc, "plan", listing)["SHARDS"] == "4"  # the default, dispatch or schedule
    code, out = plan_outputs(tmp_path, "4")
    assert code == 0
    assert out == {"count": "4", "shards": "[0, 1, 2, 3]"}
    assert plan_outputs(tmp_path, "1") == (0, {"count": "1", "shards": "[0]"})
    for bad in ("0", "17", "-2", "four"):
        code, out = plan_outputs(tmp_path, bad)
        assert code != 0 and out == {}, bad


# --- each shard ------------------------------------------------------------------------


def shard_args(tmp_path: Path, shard: str, count: str, code: int = 0) -> tuple[int, list[str]]:
    """What the shard step runs for matrix value ``shard`` of ``count``, by its real script."""
    doc = load(MUTATE)
    mutating = step(doc, "mutate", "Mutate one shard")
    env = {**step_env(doc, "mutate", mutating), "SHARD": shard, "SHARDS": count}
    work = tmp_path / f"shard-{shard}-{code}"
    log = stub(work / ".venv" / "bin" / "offload-check", code)
    status, _, err = run_step(mutating["run"], work, env)
    assert log.exists(), err
    return status, json.loads(log.read_text())


def test_each_shard_runs_its_part_of_one_plan(tmp_path: Path) -> None:
    _, out = plan_outputs(tmp_path, "4")
    shards, count = json.loads(out["shards"]), out["count"]
    assert shards == list(range(int(count)))  # every part once: together the whole sample
    for i in shards:
        status, args = shard_args(tmp_path, str(i), count)
        assert status == 0
        assert args == [
            "mutate",
            "--target",
            SCHEDULER,
            "--command",
            "suite",
            "--sample",
            "20",
            "--seed",
            "1",
            "--shard",
            f"{i}/{count}",
            "--results-dir",
            "results",
        ]


@pytest.mark.parametrize(("code", "step_code"), [(0, 0), (1, 0), (2, 2), (3, 3), (130, 130)])
def test_survivors_do_not_fail_a_shard_but_worse_does(
    tmp_path: Path, code: int, step_code: int
) -> None:
    assert shard_args(tmp_path, "0", "4", code)[0] == step_code


def test_shard_command_is_accepted_by_the_cli(tmp_path: Path) -> None:
    """The last shard's command line, planned by the real CLI against this machine's build."""
    _, out = plan_outputs(tmp_path, "4")
    last = str(json.loads(out["shards"])[-1])
    _, args = shard_args(tmp_path, last, out["count"])
    proc = run([str(CLI), *args, "--dry-run", "--json"], cwd=ROOT)
    assert proc.returncode == 0, f"{args}\n{proc.stdout}\n{proc.stderr}"
    planned = json.loads(proc.stdout)
    assert planned["target"] == SCHEDULER
    assert planned["commands"] == list(SUITE)  # the default suite, in its order
    assert (planned["sample"], planned["seed"]) == (20, 1)
    assert planned["shard"] == [int(last), int(out["count"])]
    assert len(planned["mutants"]) == 20


# --- the merge job -----------------------------------------------------------------------

RELPATH = "vllm/v1/kv_offload/cpu/manager.py"
META = {
    "target": "vllm.v1.kv_offload.cpu.manager",
    "relpath": RELPATH,
    "source_sha256": "ab" * 32,
    "vllm_version": "0.32.0",
    "python": "/runner/work/.venv/bin/python",
    "commands": ["stress", "roundtrip"],
    "seed": 1,
    "sample": 6,
    "total_mutants": 223,
    "timeout_s": 1200.0,
}


def fake_mutants() -> list[Mutant]:
    op = "core/ReplaceComparisonOperator_Gt_LtE"
    return [
        Mutant(
            id=mutant_id(RELPATH, op, n),
            module=META["target"],
            relpath=RELPATH,
            operator=op,
            occurrence=n,
            line=100 + 10 * n,
            col=8,
            function="prepare_store",
            before=f"if x{n} > 0:",
            after=f"if x{n} <= 0:",
        )
        for n in range(6)
    ]


def shard_runs(root: Path, count: int) -> list[Mutant]:
    """``shards/mutate-shard-<i>/<run>/session.sqlite`` as the matrix jobs leave them (each
    the whole sample, verdicts for its part), and one shard that failed before its plan."""
    mutants = fake_mutants()
    for i in range(count):
        run_dir = root / "shards" / f"mutate-shard-{i}" / f"20270102-0304{i:02d}-mutate-ab{i:02d}"
        run_dir.mkdir(parents=True)
        with Session.create(run_dir / "session.sqlite", mutants, META) as s:
            for m in s.pending((i, count)):
                reached = "stress" if m.occurrence % 2 else ""
                verdict = "survived" if m.occurrence < 3 else "killed"
                command = "" if verdict == "survived" else "stress"
                s.record(m.id, verdict, command=command, reached=reached, seconds=30.0)
    (root / "shards" / f"mutate-shard-{count}" / "20270102-030500-mutate-dead").mkdir(parents=True)
    return mutants


def merge_env(doc: dict[str, Any], name: str) -> dict[str, str]:
    found = step(doc, "merge", name)
    return step_env(doc, "merge", found)


def test_merge_job_merges_every_shard_session(tmp_path: Path) -> None:
    doc = load(MUTATE)
    mutants = shard_runs(tmp_path, 3)
    merging = step(doc, "merge", "Merge into one report")
    path = f"{BIN}:{os.environ['PATH']}"  # the job pip-installs the harness: offload-check
    code, stdout, err = run_step(merging["run"], tmp_path, merge_env(doc, merging["name"]), path)
    assert code == 0, f"{stdout}\n{err}"
    (merged,) = sorted((tmp_path / "results").glob("*-mutate-*"))
    meta = json.loads((merged / "run.json").read_text())
    assert meta["status"] == "finished"
    assert len(meta["merged"]) == 3  # the shard without a session is left out
    assert all("mutate-dead" not in r for r in meta["merged"])
    with Session.open(merged / "session.sqlite") as s:
        assert s.pending() == []
        assert len(s.verdicts()) == len(mutants)
    assert (merged / "junit.xml").is_file() and (merged / "mutants.csv").is_file()
    assert "3/6 detected" in (merged / "report.md").read_text()

    # The summary step, as written, on what the merge left.
    (summary_line,) = logical_lines(step(doc, "merge", "Summary")["run"])
    target = tmp_path / "summary.md"
    code, _, err = run_step(summary_line, tmp_path, {"GITHUB_STEP_SUMMARY": str(target)}, path)
    assert code == 0, err
    text = target.read_text()
    assert f"## mutate `{merged.name}`: **" in text
    assert "merged from 3 shard run(s)" in text and "score: 3/6 detected (50%)" in text
    assert "### Survivors" in text and text.count("| prepare_store |") == 3
    # Reached survivors first (a change no check noticed), then those no run executed.
    assert text.index("`if x1 > 0:`") < text.index("`if x0 > 0:`") < text.index("`if x2 > 0:`")
    assert text.count("| not reached |") == 2

    # Keep it, and next week's merge compares with it.
    code, _, err = run_step(
        step(doc, "merge", "Keep this run for the next one")["run"], tmp_path, {}
    )
    assert code == 0, err
    assert (tmp_path / "previous" / merged.name / "mutants.csv").is_file()
    for old in (tmp_path / "results").iterdir():
        if old.name != "README.md":
            os.rename(old, tmp_path / f"shipped-{old.name}")
    code, stdout, err = run_step(merging["run"], tmp_path, merge_env(doc, merging["name"]), path)
    assert code == 0, err
    assert "0 row(s) changed, 0 regression(s)" in stdout


def test_merge_job_with_no_session_fails(tmp_path: Path) -> None:
    doc = load(MUTATE)
    (tmp_path / "shards" / "mutate-shard-0" / "20270102-030500-mutate-dead").mkdir(parents=True)
    merging = step(doc, "merge", "Merge into one report")
    log = stub(tmp_path / "bin" / "offload-check")
    code, _, err = run_step(merging["run"], tmp_path, {}, f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert code == 3 and "no shard left a mutate session" in err
    assert not log.exists()


def test_merge_passes_each_run_directory_once(tmp_path: Path) -> None:
    doc = load(MUTATE)
    shard_runs(tmp_path, 2)
    merging = step(doc, "merge", "Merge into one report")
    log = stub(tmp_path / "bin" / "offload-check", 1)
    code, _, err = run_step(merging["run"], tmp_path, {}, f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert code == 0, err  # exit 1, mutants survived: the summary's to say
    args = json.loads(log.read_text())
    runs = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("shards/*/*/session.sqlite"))
    expected = [a for r in runs for a in ("--merge", str(Path(r).parent))]
    assert args == ["mutate", *expected, "--results-dir", "results"]


def test_summary_of_a_shard_cut_short(tmp_path: Path) -> None:
    """A shard killed before its first table, or with a run.json of another shape, is a
    line in the summary, never a traceback."""
    from harness.ui import summary

    early = tmp_path / "20270102-030400-mutate-ab00"
    early.mkdir()
    plan = {"target": SCHEDULER, "commands": ["stress"], "shard": [1, 4]}
    (early / "run.json").write_text(
        json.dumps({"command": "mutate", "status": "running", "plan": plan})
    )
    odd = tmp_path / "20270102-030401-mutate-ab01"
    odd.mkdir()
    (odd / "run.json").write_text(
        json.dumps({"command": "mutate", "status": "finished", "plan": "x", "mutate": 3})
    )
    (odd / "mutants.csv").write_text("id,line,verdict\n")
    out = summary.render([early, odd])
    assert "Traceback" not in out and "UNREADABLE" not in out
    assert "**INCOMPLETE" in out and "shard 1/4" in out and "`mutants.csv` is missing" in out
    assert "`mutants.csv` has no rows yet" in out


# --- the GPU nightly's worker sample ----------------------------------------------------------


def test_nightly_mutates_the_gpu_worker(tmp_path: Path) -> None:
    doc = load(NIGHTLY)
    found = [(jid, s) for jid, _, s in gh_steps(doc) if "offload-check mutate" in s.get("run", "")]
    assert len(found) == 1
    jid, mutating = found[0]
    assert jid == "crash-repro"  # the 1-GPU runner: a small model, not Scout at TP 4
    assert mutating["if"] == "always()"
    (args,) = invocations(mutating["run"], {}, "offload-check")
    assert args == NIGHTLY_MUTATE
    assert args[args.index("--target") + 1] == "vllm.v1.kv_offload.cpu.gpu_worker"
    assert args[args.index("--command") + 1] == "roundtrip"
    assert shlex.split(mutating["run"].splitlines()[1])[0] == ".venv/bin/offload-check"
    steps = [s.get("name") for s in doc["jobs"][jid]["steps"]]
    upload = steps.index("Upload results")
    assert steps.index(mutating["name"]) < upload  # uploaded with the rest
    paths = doc["jobs"][jid]["steps"][upload]["with"]["path"].split()
    assert paths == ["results/", "!results/*/mutants/*/env/**"]
    for code, step_code in ((0, 0), (1, 0), (2, 2), (3, 3)):
        work = tmp_path / f"nightly-{code}"
        log = stub(work / ".venv" / "bin" / "offload-check", code)
        status, _, err = run_step(mutating["run"], work, {})
        assert status == step_code, err
        assert json.loads(log.read_text()) == NIGHTLY_MUTATE
