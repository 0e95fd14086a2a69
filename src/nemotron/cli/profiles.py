"""`nemotron profiles ls | show`."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from nemotron.cli.console import stdout_console
from nemotron.cli.help import command
from nemotron.config.profiles import list_profiles, load_profile
from nemotron.core.redact import redact_tree

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)  # its help: cli.app.GROUPS
out = stdout_console()


@command(app, "ls", "nemotron profiles ls")
def ls(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Every profile: shipped templates and your env.toml."""
    rows = list_profiles()
    if as_json:
        print(json.dumps([{"name": n, "executor": e, "file": f} for n, e, f in rows], indent=2))
        return
    table = Table(title="profiles", title_justify="left")
    for col in ("name", "executor", "defined in"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    out.print(table)


@command(app, "show", "nemotron profiles show slurm_rlhf --json")
def show(
    name: str, as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False
) -> None:
    """A profile with `extends` resolved and secrets redacted."""
    profile = load_profile(name)
    data = redact_tree(profile.model_dump(mode="json", by_alias=True))
    if as_json:
        print(json.dumps(data, indent=2))
        return
    table = Table(title=f"profile {name} ({data.get('executor')})", title_justify="left")
    table.add_column("field")
    table.add_column("value", overflow="fold")
    for key, value in data.items():
        if value not in (None, "", [], {}):
            table.add_row(key, value if isinstance(value, str) else json.dumps(value))
    stdout_console().print(table)
