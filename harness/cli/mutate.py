"""``offload-check mutate``: how much of vLLM's offloading code the harness's checks
would notice changing, one small edit at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from harness.cli import common, launch_checks
from harness.cli.help_texts import opt
from harness.cli.options import OnePython, RunOptions, VariantName, run_options
from harness.cli.runs import guard, open_run
from harness.errors import BadInput, ExitCode
from harness.results.run_directory import RunDirectory, read_json_object, utc_now

DEFAULT_SAMPLE = 20
DEFAULT_TIMEOUT_S = 1200.0  # seconds a command may take per mutant (execute.DEFAULT_TIMEOUT_S)


@run_options()
def mutate_cmd(
    target: Annotated[str | None, opt("mutate.target")] = None,
    command: Annotated[list[str] | None, opt("mutate.command", "--command")] = None,
    sample: Annotated[int | None, opt("mutate.sample", min=1)] = None,
    seed: Annotated[int, opt("mutate.seed", min=0)] = 0,
    every: Annotated[bool, opt("mutate.all", "--all")] = False,
    mutant: Annotated[list[str] | None, opt("mutate.mutant", "--mutant")] = None,
    variant: VariantName = None,
    python: OnePython = None,
    timeout: Annotated[float | None, opt("mutate.timeout", min=60.0)] = None,
    shard: Annotated[str | None, opt("mutate.shard")] = None,
    resume: Annotated[Path | None, opt("mutate.resume")] = None,
    merge: Annotated[list[Path] | None, opt("mutate.merge", "--merge")] = None,
    jobs: Annotated[int, opt("mutate.jobs", min=1, max=64)] = 1,
    run_unreached: Annotated[bool, opt("mutate.run-unreached", "--run-unreached")] = False,
    *,
    opts: RunOptions,
) -> None:
    """Change vLLM's offloading code one small edit at a time and count the edits some
    command notices.

    Each mutant (a cosmic-ray operator at one place of --target: `<` for `<=`, `+` for
    `-`, a number off by one, a `not` added) runs in its own copy of the build's
    environment, the original untouched, through each --command in turn until one fails
    it. Each command first runs once on the unmutated build with line coverage of the
    target, so a survivor is told apart as reached (the checks missed it) or not reached
    (no workload runs its line); a mutant runs only the commands that executed its line,
    and one no command reached is a survivor without a run (--run-unreached runs every
    command on every mutant). --resume continues a session; --shard and --merge split
    one across CI runners; --jobs runs mutants side by side, each on its share of the cores.
    """
    from harness.commands.mutate import plan as mp

    def make_plan() -> Any:
        if opts.port is not None:
            raise BadInput("--port does not apply to mutate: each command picks a free port")
        if merge:
            refuse_with(
                "--merge", target=target, command=command, sample=sample, every=every,
                mutant=mutant, variant=variant, python=python, shard=shard, resume=resume,
            )  # fmt: skip
            return mp.MergePlan.of(list(merge))
        launch_checks.check_jobs(jobs, None)
        if resume is not None:
            refuse_with(
                "--resume", target=target, command=command, sample=sample, every=every,
                mutant=mutant, variant=variant, python=python, run_unreached=run_unreached,
            )  # fmt: skip
            return resume_plan(resume, shard, timeout)
        if target is None:
            raise BadInput("mutate needs --target: a module of vLLM's offloading code")
        if sum(bool(x) for x in (sample is not None, every, mutant)) > 1:
            raise BadInput("give one of --sample N, --all and --mutant ID")
        if variant and python:
            raise BadInput("give --variant or --python, not both")
        mp.parse_shard(shard)
        interp = build_python(variant, python)
        planned = mp.plan_mutate(
            target,
            command or ["suite"],  # what a user runs to ask "is my build right?"
            interp,
            sample_size=None if every else (sample or DEFAULT_SAMPLE),
            seed=seed,
            timeout_s=timeout or DEFAULT_TIMEOUT_S,
            shard=shard,
            chosen=mutant or (),
        )
        planned.run_unreached = run_unreached
        return planned

    from harness.cli import mutate_show as show

    common.plan_and_run(make_plan, show.PLAN, lambda planned: run_mutate(planned, opts, jobs), opts)


def refuse_with(option: str, **given: object) -> None:
    """What a resumed or merged session already fixed cannot be given again."""
    named = launch_checks.given_flags(**given)
    if named:
        raise BadInput(
            f"{option} takes the session's own plan: {', '.join(named)} cannot change it"
        )


def build_python(variant: str | None, python: str | None) -> str:
    """The build's interpreter: ``--python``, else the variant's (default ``current``)."""
    if python:
        return str(launch_checks.interpreter(python, "--python").absolute())
    from harness.scenario.schema import load_variants

    variants = load_variants(common.default_scenario("variants.toml"))
    name = variant or "current"
    if name not in variants:
        raise BadInput(f"unknown variant {name!r}; known: {', '.join(variants)}")
    chosen = variants[name]
    if chosen.patch:
        raise BadInput(
            f"variant {name} applies patch {chosen.patch}: mutate mutates a build as installed"
        )
    return chosen.python


def resume_plan(run: Path, shard: str | None, timeout: float | None) -> Any:
    """The session's own plan again, from its file, refused if the build's file changed."""
    from harness.commands.mutate import plan as mp
    from harness.commands.mutate.session import Session

    path = run / "session.sqlite"
    if not path.is_file():
        raise BadInput(f"--resume {run}: no session.sqlite there (not a mutate run)")
    with Session.open(path) as session:
        meta = session.meta
        planned = mp.plan_mutate(
            meta["relpath"],
            meta["commands"],
            meta["python"],
            sample_size=meta["sample"],
            seed=meta["seed"],
            timeout_s=timeout or meta.get("timeout_s") or DEFAULT_TIMEOUT_S,
            shard=shard,
        )
        session.check_source(planned.sha256)
        planned.mutants = session.mutants()
        planned.run_unreached = bool(meta.get("run_unreached", False))
    planned.resume = run
    return planned


def survivors_mismatch(outcome: Any, survived: int) -> None:
    """A finished session with survivors exits 1, as a run whose checks did not all hold:
    each survivor is an edit of vLLM no command noticed (junit.xml fails each one)."""
    if survived and outcome.code == ExitCode.OK:
        outcome.code = ExitCode.MISMATCH


def run_mutate(plan: Any, opts: RunOptions, jobs: int = 1) -> int:
    from harness.commands.mutate import execute as ex
    from harness.commands.mutate import plan as mp
    from harness.commands.mutate.files import write_mutate
    from harness.commands.mutate.session import Session, merge

    if isinstance(plan, mp.MergePlan):
        run_dir = open_run(opts, "mutate", None)
        summary = "not merged"
        with guard() as outcome:
            sessions = [r / "session.sqlite" for r in plan.runs]
            with merge(sessions, run_dir.path / "session.sqlite") as merged:
                run_dir.update_meta(merged=[str(r) for r in plan.runs], plan=merged.meta)
                got = write_mutate(run_dir, merged)
                summary = got.text()
                survivors_mismatch(outcome, got.survived)
        run_dir.finish(outcome.status, int(outcome.code), passed=outcome.code == ExitCode.OK)
        common.console.print(f"merged {len(plan.runs)} sessions: {summary}; {run_dir.path}")
        return int(outcome.code)
    resumed = plan.resume
    if resumed is not None:
        run_dir = RunDirectory(resumed, "mutate")
        before = read_json_object(resumed / "run.json", "run.json")
        run_dir.meta = {**before, **run_dir.meta, "started_at": before.get("started_at")}
        run_dir.update_meta(resumed_at=utc_now())
    else:
        run_dir = open_run(opts, "mutate", None)
    run_dir.update_meta(
        plan={k: v for k, v in plan.describe().items() if k != "mutants"}, jobs=jobs
    )
    path = run_dir.path / "session.sqlite"
    common.console.print(
        f"[bold]mutate[/] {plan.module} (vLLM {plan.vllm_version}): {len(plan.mutants)} of "
        f"{plan.total} mutants, through {', '.join(c.name for c in plan.commands)}",
        highlight=False,
    )
    summary = ""
    with guard() as outcome:
        session = Session.open(path) if resumed else Session.create(path, plan.mutants, plan.meta())
        with session:
            write_mutate(run_dir, session)

            def rewrite() -> None:
                write_mutate(run_dir, session)

            try:
                ex.execute_session(plan, session, run_dir.path, Progress(), rewrite, jobs)
            finally:
                got = write_mutate(run_dir, session)
                summary = got.text()
            survivors_mismatch(outcome, got.survived)
    run_dir.finish(outcome.status, int(outcome.code), passed=outcome.code == ExitCode.OK)
    shown = f"score: {summary}; results" if summary else "results so far"
    common.console.print(f"{shown}: {run_dir.path}", highlight=False)
    return int(outcome.code)


class Progress:
    def status(self, message: str) -> None:
        common.console.print(f"  {message}", highlight=False, markup=False)
