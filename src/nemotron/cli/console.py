"""The CLI's stdout console. On a terminal rich fits tables to its width; piped or redirected, rich would assume 80
columns and cut every cell with "…", so there the console is wide enough for any row (COLUMNS still wins)."""

from __future__ import annotations

import os
import sys

from rich.console import Console

PIPED_WIDTH = 400


def stdout_console() -> Console:
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(highlight=False, width=PIPED_WIDTH if piped else None)
