"""What ``envs`` shows: each release environment made (a line as it is done, with a
spinner on a terminal, then the table), the environments on disk, and what a prune
removed. The line for one environment (``env_line``) stays in ``harness.ui.terminal``:
``sweep`` and ``bugs`` print it too when they make environments."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from harness.ui.terminal import ENV_STATE_STYLE, SpinnerLines, env_line, size_text


class EnvsProgress(SpinnerLines):
    """Release environments, one line per release when it is done."""

    def env_started(self, release: str, index: int, total: int) -> None:
        self._prefix = f"[{index}/{total}] {release}"
        if not self.live:
            self.console.print(f"{self._prefix} ...", highlight=False, markup=False)
        self._show("checking")

    def env_step(self, release: str, message: str) -> None:
        self._show(message)

    def env_finished(self, status: Any, index: int, total: int) -> None:
        self._line(env_line(f"[{index}/{total}] {status.release}", status))


def env_status_table(statuses: Sequence[Any]) -> Table:
    """What ``envs create`` did for each release."""
    table = Table(title="release environments", header_style="bold")
    for col in ("release", "state", "vLLM", "time", "disk", "python or reason"):
        table.add_column(col, overflow="fold")
    for s in statuses:
        table.add_row(
            s.release,
            Text(s.state, style=ENV_STATE_STYLE.get(s.state, "white")),
            s.vllm_version or "-",
            f"{s.seconds:.0f}s",
            size_text(s.disk_bytes),
            s.python if s.ok else s.reason,
        )
    return table


def envs_table(entries: Sequence[Any], total: Any, where: Path) -> Table:
    """``envs list``: each environment's disk three ways (see ``disk_usage.DiskUsage``)."""
    table = Table(
        title=f"release environments in {where}",
        header_style="bold",
        caption=(
            f"{len(entries)} environment(s): {size_text(total.allocated)} on disk together "
            f"(hard links once), {size_text(total.apparent)} apparent"
            if entries
            else "none"
        ),
    )
    for col in ("environment", "vLLM", "complete", "on disk", "apparent", "freed if removed"):
        table.add_column(col, overflow="fold")
    for e in entries:
        table.add_row(
            e.name,
            str(e.stamp.get("vllm_version") or "-"),
            Text("yes", style="green") if e.complete else Text("no (not reused)", style="red"),
            size_text(e.disk.allocated),
            size_text(e.disk.apparent),
            size_text(e.disk.exclusive),
        )
    return table


def prune_lines(removed: Sequence[Any], busy: Sequence[Any]) -> list[Text]:
    """``envs prune``: one line per environment removed or left (being built)."""
    lines = []
    for e in removed:
        what = "" if e.complete else " (incomplete)"
        lines.append(Text(f"removed {e.name}{what}: {size_text(e.disk.exclusive)} freed"))
    for e in busy:
        lines.append(Text(f"kept {e.name}: being built by another process", style="yellow"))
    freed = sum(e.disk.exclusive for e in removed)
    lines.append(Text(f"{len(removed)} removed, {size_text(freed)} freed", style="bold"))
    return lines
