"""The CLI's stdout console. On a terminal rich fits tables to its width; piped or redirected, rich would assume 80
columns and cut every cell with "…", so there the console is wide enough for any row (COLUMNS still wins)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

PIPED_WIDTH = 400
TABLE_ROWS = 200  # above this many rows a listing prints padded columns (print_columns), not a rich Table


def stdout_console(*, markup: bool = True) -> Console:
    """stdout's console; `markup` False: strings print as written, `[...]` and `:name:` (emoji codes) included."""
    from rich.console import Console

    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(highlight=False, width=PIPED_WIDTH if piped else None, markup=markup, emoji=markup)


def plain_stdout() -> bool:
    """stdout is no terminal and nothing asks rich to treat it as one ($FORCE_COLOR, $TTY_COMPATIBLE): rich would
    print it as plain text, so a listing writes it without importing rich."""
    return not ({"FORCE_COLOR", "TTY_COMPATIBLE"} & os.environ.keys()) and not sys.stdout.isatty()


def print_columns(
    console: Console | None, title: str, headers: list[str], rows: list[list[str]], styles: list[str]
) -> None:
    """Rows in padded columns under a bold header: what a rich Table shows, at a cost linear in the rows (a Table
    measures and wraps every cell: 0.6 s for 1,000 rows). Cells are never cut. Piped, where rich would drop the
    styles anyway, it is plain text written at once. `console` None: stdout's, made only when it is a terminal."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths, strict=False)) + "  " + cells[-1]

    if plain_stdout() if console is None else not console.is_terminal:
        file = sys.stdout if console is None else console.file
        file.write("\n".join([title, line(headers), *(line(r) for r in rows)]) + "\n")
        return
    console = console or stdout_console()
    from rich.text import Text

    text = Text(f"{title}\n", style="italic")
    text.append(line(headers) + "\n", style="bold")
    for r in rows:
        for i, cell in enumerate(r):
            text.append(cell if i == len(r) - 1 else cell.ljust(widths[i]) + "  ", style=styles[i])
        text.append("\n")
    text.rstrip()
    console.print(text, soft_wrap=True, no_wrap=True, overflow="ignore", crop=False)
