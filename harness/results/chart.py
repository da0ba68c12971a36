"""A PNG of a round trip: bytes stored/loaded and hits per phase, for reports and CI."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.results.markdown import sweep_grid

NO_MATPLOTLIB = "matplotlib is not installed where the harness runs"


def pyplot() -> Any | None:
    """matplotlib's pyplot on the Agg backend (no display on servers and CI), or None
    where matplotlib is not installed. A chart is an extra beside the tables: a harness
    installed without its dependencies into an image that reaches no index (the GPU
    loan's, scripts/gpu/) must still finish its run and write every table."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def phases_chart(phases: Sequence[dict[str, Any]], title: str, out: Path) -> Path | None:
    """The round trip's PNG; None (nothing written) without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
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


def sweep_heatmap(cells: Sequence[Any], builds: Sequence[str], out: Path) -> Path | None:
    """Release x check, a square per cell: green as expected, red not, grey not run; the
    outcome written in it. Colour says the verdict, text the behaviour, so a change of
    behaviour that was expected (a fix) reads differently from a regression. None
    (nothing written) without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    from matplotlib.colors import ListedColormap

    headers, rows = sweep_grid(cells, builds)
    columns = headers[1:]
    at = {(c.check, c.release): c for c in cells}
    code = {True: 2, False: 0, None: 1}
    grid = [[code[at[(r[0], b)].matched] if (r[0], b) in at else 1 for b in columns] for r in rows]
    width = max(4.0, 1.3 * len(columns) + 3.0)
    fig, ax = plt.subplots(figsize=(width, 0.6 * len(rows) + 1.6))
    ax.imshow(grid, cmap=ListedColormap(["#e06666", "#cccccc", "#93c47d"]), vmin=0, vmax=2)
    for y, r in enumerate(rows):
        for x, b in enumerate(columns):
            c = at.get((r[0], b))
            if c is not None:
                ax.text(x, y, c.state.replace(" ", "\n", 1), ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(columns)), columns, rotation=30, ha="right")
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    # White lines between squares, so a row of equal colour still reads as cells.
    ax.set_xticks([x - 0.5 for x in range(1, len(columns))], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, len(rows))], minor=True)
    ax.grid(which="minor", color="white", linewidth=2)
    ax.tick_params(which="minor", length=0)
    ax.set_title("offload-check sweep (green: as expected, red: not, grey: not run)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
