"""The `nemotron` entry point: sub-apps, and the one place user errors become exit 2 without a traceback."""

from __future__ import annotations

import copy
import importlib
import sys
from typing import TYPE_CHECKING, Annotated

import typer
from typer.main import get_command_name
from typer.models import TyperInfo

from nemotron.core.paths import nemotron_home
from nemotron.errors import ServiceError, UserError, did_you_mean, disk_full

if TYPE_CHECKING:
    from rich.console import Console

# Command groups: module and one line of help. A group's module is imported only when that group runs: `nemotron
# steps list` loads nemotron.cli.steps alone, and the root's help lists the groups from here (docs/benchmarks.md).
GROUPS: dict[str, tuple[str, str]] = {
    "steps": ("nemotron.cli.steps", "Browse and run steps."),
    "jobs": ("nemotron.cli.jobs", "Inspect and control jobs."),
    "pipeline": ("nemotron.cli.pipeline", "Run declared pipelines of steps."),
    "profiles": ("nemotron.cli.profiles", "Execution profiles (env.toml)."),
    "artifacts": ("nemotron.cli.artifacts", "The artifact store and checkpoint lineage."),
}

# Every Typer app here prints click's plain help (rich_markup_mode=None): typer's rich help imports
# typer.rich_utils (rich.markdown, markdown_it, rich.traceback...), which made `nemotron --help` take 2.5x
# `import typer` (docs/benchmarks.md). Plain help is the same on a terminal and in a pipe, and prints `[...]` as
# written, so help texts use no rich markup; a block click must not rewrap starts after a `\b` line.
app = typer.Typer(
    name="nemotron",
    rich_markup_mode=None,
    help="A declarative steps runner for LLM alignment: typed steps, one config compiler, local/Slurm/Lepton executors, checkpoint lineage.",
    no_args_is_help=True,
    invoke_without_command=True,  # so `nemotron --version` needs no command
    add_completion=False,
    pretty_exceptions_enable=False,
)
_added: dict[str, TyperInfo] = {}  # group name -> its entry in the root app


def _mount(name: str, group: typer.Typer, help_line: str) -> None:
    """Group `name` served by `group`: added once, then swapped (a caller in one process may run several commands)."""
    if name in _added:
        _added[name].typer_instance = group
    else:
        app.add_typer(group, name=name, help=help_line)
        _added[name] = app.registered_groups[-1]


def _with_only(group: typer.Typer, command: str | None) -> typer.Typer:
    """`group` holding `command` alone, when it names one of its commands: typer builds every command of a group
    (reading each function's signature and types) before it runs one. Else the whole group (its help, a mistyped
    command's did-you-mean)."""
    ours = [
        c
        for c in group.registered_commands
        if (c.name or get_command_name(c.callback.__name__ if c.callback else "")) == command
    ]
    if not ours:
        return group
    alone = copy.copy(group)
    alone.registered_commands = ours
    return alone


def with_groups(only: str | None = None, command: str | None = None) -> typer.Typer:
    """The app with command group `only` added (holding `command` alone, when that names one of its commands), or
    every group."""
    for name, (module, help_line) in GROUPS.items():
        if only in (None, name):
            group = importlib.import_module(module).app
            _mount(name, _with_only(group, command) if only else group, help_line)
    return app


def with_group_names() -> typer.Typer:
    """The app with every group as its name and line of help, none of its commands: all that the root's help,
    `--version` and a mistyped group's did-you-mean read, without importing the groups' code."""
    for name, (_module, help_line) in GROUPS.items():
        if name not in _added:
            _mount(name, typer.Typer(no_args_is_help=True, rich_markup_mode=None), help_line)
    return app


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="nemotron's version and the engine versions it targets", is_eager=True
        ),
    ] = False,
) -> None:
    """A declarative steps runner for LLM alignment. Exit codes: 0 done, 2 bad input, 3 a needed service failed,
    130 cancelled. Example: nemotron steps run rl/reinforce -c tiny"""
    if version:
        from nemotron import __version__
        from nemotron.config.targets import NEMO_ALIGNER_VERSION, NEMO_RL_IMAGE, NEMO_RL_VERSION, VLLM_VERSION

        print(f"nemotron {__version__}")
        print(
            f"targets: NeMo-RL {NEMO_RL_VERSION} ({NEMO_RL_IMAGE}), NeMo-Aligner {NEMO_ALIGNER_VERSION}, vLLM {VLLM_VERSION}"
        )
        raise typer.Exit(0)


def _click_classes(name: str) -> tuple[type[BaseException], ...]:
    """Class `name` from every click the installed typer may raise from: its vendored copy (typer >= 0.26 vendors
    click as typer._click, Abort in typer.exceptions) and the separate package (older typer)."""
    found = []
    for module in ("typer._click.exceptions", "typer.exceptions", "click.exceptions"):
        try:
            cls = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


def usage_error_lines(e: BaseException) -> tuple[int, list[str]] | None:
    """(exit code, lines) for a click error of any flavour: the help for a bare group (exit 0), or one `error:` line
    and where to look (exit 2). None: not a click error."""
    if isinstance(e, _click_classes("Abort")):
        return 130, ["interrupted"]
    if isinstance(e, _click_classes("NoArgsIsHelpError")):
        return 0, [str(e.format_message())]  # type: ignore[attr-defined]
    if not isinstance(e, _click_classes("ClickException")):
        return None
    ctx = getattr(e, "ctx", None)
    path = getattr(ctx, "command_path", "") or "nemotron"
    message = str(e.format_message())  # type: ignore[attr-defined]
    command = getattr(ctx, "command", None)
    if message.startswith("No such command") and command is not None and hasattr(command, "list_commands"):
        word = message.split("'")[1] if "'" in message else ""
        if "did you mean" not in message.lower():
            message = message.rstrip(".") + did_you_mean(word, command.list_commands(ctx)) + "."
    return 2, [f"error: {message}", f"try '{path} --help'"]


def _stderr() -> Console:
    """Where errors go; rich is imported only when there is one to print."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    # Everything after `--` belongs to the step itself; keep it away from click.
    if "--" in args:
        from nemotron.cli import steps

        i = args.index("--")
        args, steps.PASSTHROUGH[:] = args[:i], args[i + 1 :]
    if not args:
        # bare `nemotron`: the help, exit 0 (asking what there is is not an error)
        with_group_names()(args=["--help"], prog_name="nemotron", standalone_mode=False)
        sys.exit(0)
    cli = (
        with_groups(args[0], args[1] if len(args) > 1 else None) if args[0] in GROUPS else with_group_names()
    )
    try:
        code = cli(args=args, prog_name="nemotron", standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except UserError as e:
        from rich.text import Text

        _stderr().print(Text("error: ", style="bold red") + Text(e.render()), soft_wrap=True)
        sys.exit(e.exit_code)
    except ServiceError as e:  # a service the command needs (the team store) failed after its retries
        from rich.text import Text

        _stderr().print(Text("error: ", style="bold red") + Text(str(e)), soft_wrap=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        _stderr().print("interrupted")
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as e:
        full = disk_full(e, nemotron_home())
        if full is not None:  # one line, exit 3: nothing half-written is registered (outputs register last)
            from rich.text import Text

            _stderr().print(Text("error: ", style="bold red") + Text(str(full)), soft_wrap=True)
            sys.exit(full.exit_code)
        shown = usage_error_lines(e)
        if shown is None:
            raise
        code, lines = shown
        if code == 0:
            print("\n".join(lines))
        else:
            err = _stderr()
            for line in lines:
                err.print(line, markup=False, highlight=False, soft_wrap=True)
        sys.exit(code)
