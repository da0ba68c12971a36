"""``offload-check namespace``: a disk tier written by one server and read by a restarted
one with exactly one change; KV reused across a change must not change the answers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from harness.cli import common, launch_checks
from harness.cli.help_texts import opt
from harness.cli.options import EngineArgs, RunOptions, run_options
from harness.cli.runs import guard, open_run
from harness.errors import ExitCode, HarnessError
from harness.server.release_envs import DEFAULT_DIST, env_name, list_envs, parse_releases

DEFAULT_SCENARIO = "roundtrip-namespace.toml"


@run_options()
def namespace_cmd(
    scenario: Annotated[
        Path | None, opt("namespace.scenario", show_default=f"scenarios/{DEFAULT_SCENARIO}")
    ] = None,
    change: Annotated[list[str] | None, opt("namespace.change", "--change")] = None,
    python: Annotated[list[str] | None, opt("namespace.python", "--python")] = None,
    releases: Annotated[str | None, opt("namespace.releases")] = None,
    engine_arg: EngineArgs = None,
    *,
    opts: RunOptions,
) -> None:
    """A disk tier written by one server, read by a restarted one with one change.

    One server writes the targets' KV through the CPU tier to vLLM's fs tier and stops;
    then, for each change (RoPE scaling, other weights under the same path, dtype, block
    size, offload chunk, TP, KV layout), a restarted server reads a copy of that
    directory. It must hit nothing, or answer exactly as its own clean cache does (the
    same prompts under a cache salt); the unchanged restart must hit every target chunk.
    Exit 0 when every row keeps that rule or is a known bug of its release; 1 when not.
    """
    from harness.commands.namespace.changes import choose
    from harness.commands.namespace.plan import plan_namespace
    from harness.scenario.roundtrip import load_roundtrip

    def make_plan() -> Any:
        scen = load_roundtrip(scenario or common.default_scenario(DEFAULT_SCENARIO))
        pythons = list(python or []) + release_pythons(releases)
        return plan_namespace(
            scen,
            choose(change or []),
            launch_checks.adhoc_variants(pythons) or None,
            list(engine_arg or []),
        )

    common.plan_and_run(make_plan, show_namespace_plan, lambda p: run_namespace(p, opts), opts)


def release_pythons(spec: str | None) -> list[str]:
    """The interpreters of the release environments ``spec`` names; one that does not
    exist here is refused with the command that makes it (a plan never installs)."""
    if not spec:
        return []

    here = {
        e.version: e.python
        for e in list_envs(measure=False)
        if e.python and e.version and e.name == env_name(DEFAULT_DIST, e.version)
    }
    given = [item.strip() for item in spec.split(",") if item.strip()]
    ranged = any(".." in item or item in ("all", "latest") for item in given)
    # A range or ``all`` spans the environments made here; a list names each exactly.
    versions = parse_releases(spec, sorted(here)) if ranged and here else given
    for version in versions:
        if version not in here:
            raise HarnessError(
                f"no environment for vLLM {version} here: `offload-check envs create "
                f"{version}` makes it"
            )
    return [str(here[v]) for v in versions]


def show_namespace_plan(console: Any, plan: Any) -> None:
    """``--dry-run``: per build, the writer and every restarted server's launch."""
    from harness.commands.namespace.plan import NamespacePlan

    assert isinstance(plan, NamespacePlan)
    console.print(
        f"[bold]namespace[/] {plan.scenario.name}: {len(plan.builds)} build(s) x "
        f"{len(plan.changes)} restarts",
        highlight=False,
    )
    for b in plan.builds:
        d = b.describe()
        console.print(
            f"  {b.label} (vLLM {b.vllm_version}, {b.device}): the writer hits "
            f"{d['expected_hit_tokens']} target tokens on an unchanged restart",
            highlight=False,
        )
        console.print(f"    writer: {' '.join(d['writer_argv'])}", highlight=False, markup=False)
        for r in d["readers"]:
            how = f"not runnable: {r['skipped']}" if r["skipped"] else r["what"]
            console.print(f"    {r['change']}: {how}", highlight=False, markup=False)


class _Progress:
    def status(self, text: str) -> None:
        common.console.print(f"  {text}", highlight=False, markup=False)

    def row_done(self, row: Any) -> None:
        from harness.commands.namespace.files import cell

        hits = "" if row.hit_tokens is None else f", {row.hit_tokens} hit tokens"
        self.status(f"{row.build} {row.change}: {cell(row)}{hits}")


def run_namespace(plan: object, opts: RunOptions) -> int:
    from harness.commands.namespace.files import write_namespace
    from harness.commands.namespace.judge import Row
    from harness.commands.namespace.plan import NamespacePlan
    from harness.commands.namespace.run import execute_namespace

    assert isinstance(plan, NamespacePlan)
    run_dir = open_run(opts, "namespace", plan.scenario)
    run_dir.update_meta(plan=plan.describe())
    rows: list[Row] = []

    def on_rows(done: list[Row]) -> None:
        rows[:] = done
        write_namespace(run_dir, plan, done)

    with guard() as outcome:
        execute_namespace(plan, run_dir.path, _Progress(), on_rows, port=opts.port)
        if any(r.passed is False for r in rows):
            outcome.code = ExitCode.MISMATCH
    code = outcome.code
    ok = code == ExitCode.OK
    run_dir.finish(outcome.status, int(code), passed=ok)
    word = "[green]every restart kept the rule[/]" if ok else "[red]KV reused wrongly[/]"
    common.console.print(f"{word}; results: {run_dir.path}", highlight=False)
    return int(code)
