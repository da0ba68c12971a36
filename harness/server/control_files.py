"""Control files: how the harness switches what a running server does between rounds
(the host backend's fault, the pressure tier's policy), with no restart. The engine side
re-reads the file (``harness.engine``); the harness writes it while the server is idle."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path


def control_path(what: str) -> Path:
    """A fresh path for a control file, outside the results (it is scratch, not
    evidence: every round's setting is in the run's tables). Created at launch, removed
    after, with its directory."""
    return Path(tempfile.gettempdir()) / f"offload-check-{what}-{uuid.uuid4().hex[:12]}" / what


def write_control(path: Path, value: str) -> None:
    """Switch the setting: written whole, then renamed, so no process reads half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(value + "\n")
    tmp.replace(path)
