"""A PNG of a round trip: bytes stored/loaded and hits per phase, for reports and CI."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def phases_chart(phases: Sequence[dict[str, Any]], title: str, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    fig, (ax_bytes, ax_hits) = plt.subplots(1, 2, figsize=(10, 3.8))
    _paired_bars(ax_bytes, phases, ("stored", "loaded"), 1e6, "MB (per phase)", "offloaded bytes")
    _paired_bars(
        ax_hits,
        phases,
        ("GPU prefix-cache hits", "external (connector) hits"),
        1,
        "tokens (per phase)",
        "prefix hits",
    )
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


# Which phases.csv column each bar label plots.
_COLUMN = {
    "stored": "d_stored_bytes",
    "loaded": "d_loaded_bytes",
    "GPU prefix-cache hits": "d_gpu_hits",
    "external (connector) hits": "d_ext_hits",
}


def _paired_bars(
    ax: Any,
    phases: Sequence[dict[str, Any]],
    labels: tuple[str, str],
    scale: float,
    ylabel: str,
    title: str,
) -> None:
    """Two bars per phase side by side, so a stored/loaded or GPU/external gap shows."""
    width = 0.38
    x = range(len(phases))
    for offset, label in zip((-width / 2, width / 2), labels, strict=True):
        ax.bar(
            [i + offset for i in x], [p[_COLUMN[label]] / scale for p in phases], width, label=label
        )
    ax.set_xticks(list(x), [str(p["phase"]) for p in phases])
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
