"""Every command's help in one shape: a one-line summary (its docstring's first paragraph, listed whole in its
group's --help), the rest of the docstring, then an example and what the exit codes mean. Help is click's plain
format (cli.app), which rewraps each paragraph to the terminal: the `\b` line keeps the example on one line, as it
is typed."""

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import typer

EXIT_CODES = "Exit codes: 0 done, 2 bad input, 3 a needed service failed after its retries, 130 cancelled."

Command = TypeVar("Command", bound=Callable[..., Any])


def epilog(example: str) -> str:
    return f"\b\nExample: {example}\n\n{EXIT_CODES}"


def summary(function: Callable[..., Any]) -> str:
    """The first paragraph of `function`'s docstring, on one line."""
    return " ".join((inspect.getdoc(function) or "").split("\n\n")[0].split())


def command(app: typer.Typer, name: str, example: str, **settings: Any) -> Callable[[Command], Command]:
    """`app.command(name)` with the shape above: click would cut a summary at the first sentence end or at the
    width left beside the command's name (with "..."), so the summary is given whole."""

    def register(function: Command) -> Command:
        decorate = app.command(name, short_help=summary(function), epilog=epilog(example), **settings)
        return decorate(function)

    return register
