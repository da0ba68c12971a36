"""What fits the terminal: releases as ranges, a grid of many builds condensed into runs
of releases with the same state, and a table too wide for the terminal stacked one record
at a time. Nothing here is cut short: a cell wraps (or folds a word longer than the line),
never ends in ``…``."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from rich import box
from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

# A grid over more builds than this shows runs of releases, not a column per build.
MAX_BUILD_COLUMNS = 10


def release_ranges(members: Collection[str], order: Sequence[str]) -> str:
    """``members`` as runs of ``order``: ``0.8.5..0.26.0 (48), 0.28.0``; a member not in
    ``order`` (a user build) reads as itself, last."""
    runs: list[list[str]] = []
    prev = False
    for label in order:
        inside = label in members
        if inside:
            if prev:
                runs[-1].append(label)
            else:
                runs.append([label])
        prev = inside
    parts = [_run_text(r) for r in runs]
    parts += [m for m in members if m not in order]
    return ", ".join(parts)


def _run_text(run: Sequence[str]) -> str:
    if len(run) == 1:
        return run[0]
    if len(run) == 2:
        return f"{run[0]}, {run[1]}"
    return f"{run[0]}..{run[-1]} ({len(run)})"


def spans(
    cells: Sequence[tuple[str, Text]], releases: Collection[str]
) -> list[tuple[Text, list[str]]]:
    """Consecutive builds whose cells read (and are styled) alike, as (cell, builds); a
    build that is not a release (a user's) is a span of its own."""
    out: list[tuple[Text, list[str]]] = []
    for label, cell in cells:
        if out and label in releases and out[-1][1][-1] in releases:
            last, members = out[-1]
            if last.plain == cell.plain and last.style == cell.style:
                members.append(label)
                continue
        out.append((cell, [label]))
    return out


def span_cell(cells: Sequence[tuple[str, Text]], releases: Collection[str]) -> Text:
    """One line per span: ``0.8.5..0.27.1 (10): reproduced``."""
    text = Text()
    for i, (cell, members) in enumerate(spans(cells, releases)):
        if i:
            text.append("\n")
        text.append(f"{_run_text(members)}: ")
        text.append_text(cell)
    return text


def grid(
    title: str,
    heads: Sequence[str],
    rows: Sequence[tuple[Sequence[str | Text], Sequence[Text]]],
    builds: Sequence[str],
    releases: Collection[str],
    *,
    caption: str | None = None,
    width: int | None = None,
    show_lines: bool = True,
) -> Table:
    """A row per ``rows`` item (its ``heads`` cells, then one cell per build): a column
    per build when they are few and fit ``width``, else one column of runs of releases
    with the same cell (``span_cell``)."""
    table = Table(title=title, caption=caption, header_style="bold", show_lines=show_lines)
    for h in heads:
        table.add_column(h, overflow="fold")
    for b in builds:
        table.add_column(b, overflow="fold")
    for head, cells in rows:
        table.add_row(*head, *cells)
    if len(builds) <= MAX_BUILD_COLUMNS and (width is None or min_width(table) <= width):
        return table
    # Runs of releases: the row's cells in one column (the first in bold), then the runs.
    table = Table(title=title, caption=caption, header_style="bold", show_lines=show_lines)
    table.add_column(" / ".join(heads), overflow="fold")
    table.add_column(f"by build ({len(builds)}, runs of builds alike)", overflow="fold")
    for head, cells in rows:
        name = Text()
        for i, part in enumerate(head):
            if i:
                name.append("\n")
            bold = "" if i else "bold"
            name.append_text(part if isinstance(part, Text) else Text(part, style=bold))
        table.add_row(name, span_cell(list(zip(builds, cells, strict=True)), releases))
    return table


def _cell_range(cell: object) -> tuple[int, int]:
    """(longest word, longest line) of a cell's text."""
    text = cell.plain if isinstance(cell, Text) else str(cell)
    lines = text.splitlines() or [""]
    words = [cell_len(w) for line in lines for w in line.split()] or [0]
    return max(words), max(cell_len(line) for line in lines)


def _ranges(table: Table) -> list[tuple[int, int, int]]:
    """Per column: its longest word, its cells' longest line, with the header's too."""
    out = []
    for column in table.columns:
        body = [_cell_range(c) for c in column.cells] or [(0, 0)]
        head = _cell_range(column.header)
        lo = max(head[0], *(r[0] for r in body))
        hi_body = max(lo, *(r[1] for r in body))
        out.append((lo, hi_body, max(hi_body, head[1])))
    return out


def _frame(table: Table) -> int:
    """The columns a table's borders and padding take."""
    n = len(table.columns)
    borders = (n + 1) if table.box is not None else 0
    return borders + n * 2 * (1 if table.padding else 0)


def min_width(table: Table) -> int:
    """The fewest columns ``table`` takes without breaking a word."""
    return sum(lo for lo, _, _ in _ranges(table)) + _frame(table)


def _allot(table: Table, width: int) -> None:
    """Column widths that break no word: each its longest word, then what is left of
    ``width`` to the cells (so a row stays on one line before a header does), then to
    the headers (rich's own squeeze can fold a word in a column whose neighbours had
    room)."""
    ranges = _ranges(table)
    room = width - _frame(table)
    if sum(hi for _, _, hi in ranges) <= room:
        return
    widths = [lo for lo, _, _ in ranges]
    spare = room - sum(widths)
    for target in (1, 2):  # the cells' lines, then the headers'
        wants = [r[target] - w for r, w in zip(ranges, widths, strict=True)]
        # The least wanting first: each gets all it wants if an equal share of what is
        # left covers it, so short cells stay on one line and the long ones share the rest.
        order = sorted(range(len(wants)), key=lambda i: wants[i])
        for k, i in enumerate(order):
            more = min(wants[i], spare // (len(order) - k))
            widths[i] += more
            spare -= more
    for column, w in zip(table.columns, widths, strict=True):
        column.width = w


def stacked(table: Table) -> Table:
    """``table`` one record at a time: each row as ``header  value`` lines under its first
    cell, for a terminal too narrow for its columns (same title, same cells)."""
    out = Table(
        title=table.title, caption=table.caption, show_header=False, show_lines=False, box=None
    )
    out.add_column("field", style="bold", no_wrap=True)
    out.add_column("value", overflow="fold")
    columns = table.columns
    cells = [list(c.cells) for c in columns]
    for i in range(table.row_count):
        first = cells[0][i] if cells else ""
        out.add_row(Text(str(columns[0].header), style="bold"), first)
        for col, values in zip(columns[1:], cells[1:], strict=True):
            value = values[i]
            if isinstance(value, (str, Text)) and not str(value).strip():
                continue
            out.add_row(str(col.header), value)
        out.add_row("", "", end_section=True)
    return out


def fit(console: Console, table: Table) -> RenderableType:
    """``table`` as it is when its columns fit the console, else ``stacked``; drawn in
    ASCII when the output is not a terminal (a CI log, a file: a column is a byte there,
    for ``cut`` and ``awk``)."""
    if min_width(table) <= console.width:
        _allot(table, console.width)
        out = table
    else:
        out = stacked(table)
    if not console.is_terminal and out.box is not None:
        out.box = box.ASCII2
    return out
