"""What the listings (`jobs ls`, `artifacts ls`) share: `--since` as users write it, and the line under a cut page."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import typer
from rich.console import Console

from nemotron.errors import UserError

err_console = Console(stderr=True)


def parse_since(text: str, at: datetime) -> str:
    """`--since` as the UTC ISO time records carry: a date (2026-11-01), a time (2026-11-01T12:00, UTC unless it
    says otherwise) or an age (30m, 12h, 7d, 2w)."""
    m = re.fullmatch(r"(\d+)([mhdw])", text.strip())
    if m:
        unit = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}[m.group(2)]
        when = at - timedelta(**{unit: int(m.group(1))})
    else:
        try:
            when = datetime.fromisoformat(text.strip())
        except ValueError:
            raise UserError(f"--since '{text}': expected a date (2026-11-01), a time (2026-11-01T12:00) or an age "
                            "(30m, 12h, 7d, 2w)") from None  # fmt: skip
        when = when if when.tzinfo else when.replace(tzinfo=UTC)
    return when.astimezone(UTC).isoformat(timespec="seconds")


def since_option(what: str) -> Any:
    """`--since` for a listing of `what` (e.g. "jobs created"): the command gets the time as parse_since writes it
    (now is when the command line is read), None without the option."""
    return typer.Option(
        help=f"only {what} since: 2026-11-01, 2026-11-01T12:00, 12h, 7d",
        callback=lambda text: parse_since(text, datetime.now(UTC)) if text else None,
    )


def more_note(more: int, what: str) -> None:
    """How many more match than the page shows, and how to see them (stderr, so JSON on stdout stays JSON)."""
    if more > 0:
        err_console.print(f"{more} more {what}, use --all (or --limit N)", highlight=False)
