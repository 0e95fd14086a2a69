"""The CLI's stdout console. On a terminal rich fits tables to its width; piped or redirected, rich would assume 80
columns and cut every cell with "…", so there the console is wide enough for any row (COLUMNS still wins)."""

from __future__ import annotations

import os
import sys

from rich.console import Console

PIPED_WIDTH = 400
TABLE_ROWS = 200  # above this many rows a listing prints padded columns (print_columns), not a rich Table


def stdout_console() -> Console:
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(highlight=False, width=PIPED_WIDTH if piped else None)


def print_columns(
    console: Console, title: str, headers: list[str], rows: list[list[str]], styles: list[str]
) -> None:
    """Rows in padded columns under a bold header: what a rich Table shows, at a cost linear in the rows (a Table
    measures and wraps every cell: 0.6 s for 1,000 rows). Cells are never cut. Piped, where rich would drop the
    styles anyway, it is plain text written at once."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths, strict=False)) + "  " + cells[-1]

    if not console.is_terminal:
        console.file.write("\n".join([title, line(headers), *(line(r) for r in rows)]) + "\n")
        return
    from rich.text import Text

    text = Text(f"{title}\n", style="italic")
    text.append(line(headers) + "\n", style="bold")
    for r in rows:
        for i, cell in enumerate(r):
            text.append(cell if i == len(r) - 1 else cell.ljust(widths[i]) + "  ", style=styles[i])
        text.append("\n")
    text.rstrip()
    console.print(text, soft_wrap=True, no_wrap=True, overflow="ignore", crop=False)
