"""A PNG of a round trip: bytes stored/loaded and hits per phase, for reports and CI."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def phases_chart(phases: Sequence[dict[str, Any]], title: str, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    names = [str(p["phase"]) for p in phases]
    x = range(len(names))
    fig, (ax_bytes, ax_hits) = plt.subplots(1, 2, figsize=(10, 3.8))
    width = 0.38
    ax_bytes.bar(
        [i - width / 2 for i in x],
        [p["d_stored_bytes"] / 1e6 for p in phases],
        width,
        label="stored",
    )
    ax_bytes.bar(
        [i + width / 2 for i in x],
        [p["d_loaded_bytes"] / 1e6 for p in phases],
        width,
        label="loaded",
    )
    ax_bytes.set_xticks(list(x), names)
    ax_bytes.set_ylabel("MB (per phase)")
    ax_bytes.set_title("offloaded bytes")
    ax_bytes.legend()
    ax_hits.bar(
        [i - width / 2 for i in x],
        [p["d_gpu_hits"] for p in phases],
        width,
        label="GPU prefix-cache hits",
    )
    ax_hits.bar(
        [i + width / 2 for i in x],
        [p["d_ext_hits"] for p in phases],
        width,
        label="external (connector) hits",
    )
    ax_hits.set_xticks(list(x), names)
    ax_hits.set_ylabel("tokens (per phase)")
    ax_hits.set_title("prefix hits")
    ax_hits.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
