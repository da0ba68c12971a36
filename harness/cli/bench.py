"""``offload-check bench``: benchmarks as ratios measured side by side in one run."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from harness.cli import common
from harness.cli.options import RunOptions, run_options
from harness.cli.runs import lock_free
from harness.errors import HarnessError
from harness.results.run_directory import RunDirectory, new_run_dir
from harness.server.interpreters import host_platform
from harness.server.launcher import install_signal_handlers


class BenchPart(str, Enum):
    all = "all"
    launch = "launch"
    commands = "commands"
    crash_repro = "crash-repro"
    copy = "copy"
    roundtrip = "roundtrip"


@run_options("results_dir", "no_wait", "label")
def bench_cmd(
    repeats: Annotated[int, typer.Option(min=1, help="launches per side and case")] = 3,
    only: Annotated[
        list[BenchPart] | None,
        typer.Option(
            help="run only this part (repeatable: copy and roundtrip give the ledger's cost)"
        ),
    ] = None,
    config: Annotated[Path | None, typer.Option(help="model config (default: small-chunk)")] = None,
    *,
    opts: RunOptions,
) -> None:
    """Benchmarks as ratios measured side by side in one run (the machines are noisy).

    Harness overhead on crash-repro, host-backend copy throughput, round-trip filler and
    wall-time efficiency.
    """
    from harness.commands.bench.files import write_bench
    from harness.commands.bench.measure import run_bench
    from harness.scenario.crash_repro import load_crash_repro

    install_signal_handlers()
    lock_free()
    chosen = only or [BenchPart.all]
    parts = (
        {p.value for p in BenchPart if p is not BenchPart.all}
        if BenchPart.all in chosen
        else {p.value for p in chosen}
    )
    try:
        if config is not None and not config.is_file():
            raise HarnessError(f"--config {config}: no such model config")
        run_dir = RunDirectory(new_run_dir(opts.results_dir, "bench", opts.label), "bench")
        run_dir.update_meta(
            label=opts.label, platform=host_platform(), repeats=repeats, only=sorted(parts)
        )
        scen = load_crash_repro(common.default_scenario("crash-repro.toml"))
        figures = run_bench(
            parts,
            repeats,
            scen,
            common.default_scenario("roundtrip-cpu.toml"),
            str(config or scen.resolve("models/llama4-small-chunk.json")),
            run_dir.path,
            lambda msg: common.console.print(msg, highlight=False, markup=False),
        )
    except HarnessError as err:
        raise common.fail(err) from None
    write_bench(run_dir, figures)
    run_dir.finish("finished", 0)
    common.show(bench_table(figures))
    common.console.print(f"results: {run_dir.path}", highlight=False)


def bench_table(figures: Sequence[dict[str, Any]]) -> Table:
    """The benchmark figures, each with its target and verdict."""
    from harness.commands.bench.files import BENCH_FIGURES

    table = Table(title="benchmarks (ratios measured side by side in this run)")
    for col in BENCH_FIGURES.shown:
        table.add_column(col)
    for f in figures:
        ok = Text("yes", style="green") if f["ok"] else Text("no", style="red")
        table.add_row(str(f["figure"]), str(f["value"]), str(f["target"]), ok)
    return table
