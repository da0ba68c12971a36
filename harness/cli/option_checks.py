"""Parse-time checks of option values, given to typer as callbacks: a bad value is a
usage error (one line, exit 2) before anything runs."""

from __future__ import annotations

import math
import re
from pathlib import Path
from urllib.parse import urlsplit

import typer

from harness.server.server_lock import set_lock_wait


def check_url(value: str | None) -> str | None:
    """An http(s) URL with a host (and, if given, a port in range)."""
    if value is None:
        return None

    parts = urlsplit(value)
    try:
        port_ok = parts.port is None or 1 <= parts.port <= 65535
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise typer.BadParameter(
            f"{value!r} is not an http(s) URL with a host, e.g. http://127.0.0.1:8000"
        )
    return value


def check_positive(value: float | None) -> float | None:
    """A finite number above zero (click's ranges let nan through)."""
    if value is None:
        return None
    if not math.isfinite(value) or value <= 0:
        raise typer.BadParameter(f"{value} is not a positive number")
    return value


def check_duration(value: float | None) -> float | None:
    """Seconds from 1 to a day (the range said here, not in the help's value column)."""
    if value is None:
        return None
    if not math.isfinite(value) or not 1 <= value <= 86400:
        raise typer.BadParameter(f"{value} is not between 1 and 86400 seconds")
    return value


def check_fraction(value: float | None) -> float | None:
    """A fraction strictly between 0 and 1 (the range said in the help text)."""
    if value is None:
        return None
    if not math.isfinite(value) or not 0 < value < 1:
        raise typer.BadParameter(f"{value} is not between 0 and 1")
    return value


def check_results_dir(value: Path) -> Path:
    """A directory, or a path one can be created at (not a file, nor under one)."""
    if value.exists():
        if not value.is_dir():
            raise typer.BadParameter(f"{value} exists and is not a directory")
        return value
    parent = value.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise typer.BadParameter(f"{value} cannot be created: {parent} is not a directory")
    return value


def check_label(value: str | None) -> str | None:
    """``--label``: letters, digits, ``.``, ``_`` and ``-`` (others become ``-``), at
    most 40; a label with no letter or digit is refused."""
    if value is None:
        return None

    label = re.sub(r"-{2,}", "-", re.sub(r"[^A-Za-z0-9._-]+", "-", value)).strip("-._")[:40]
    if not re.search(r"[A-Za-z0-9]", label):
        raise typer.BadParameter(f"{value!r} has no letter or digit to name a run by")
    return label.rstrip("-._")


def no_wait(value: bool) -> bool:
    """``--no-wait``: the server lock is not waited for (this command only)."""
    if value:
        set_lock_wait(False)
    return value
