"""``offload-check validate``: scenario files and what they name, launching nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.cli.common import console, fail, print_json
from harness.cli.help_texts import opt
from harness.errors import HarnessError


def validate_cmd(
    paths: Annotated[list[Path], typer.Argument(help="scenario files to check")],
    as_json: Annotated[bool, opt("validate.json", "--json")] = False,
) -> None:
    """Check scenario files (crash-repro, roundtrip, matrix, bug entries) and what they
    name, launching nothing: variants, model configs, expectation rules, round-trip plans,
    bug triggers and scripts."""
    from harness.commands.validate import validate

    checked = []
    try:
        for path in paths:
            kind, summary = validate(path)
            checked.append({"file": str(path), "ok": True, "kind": kind, "summary": summary})
            if not as_json:
                console.print(f"{path}: ok ({kind}: {summary})", highlight=False)
    except HarnessError as err:
        raise fail(err) from None
    if as_json:
        print_json({"files": checked})
