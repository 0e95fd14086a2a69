"""`nemotron steps list | show | run`."""

from __future__ import annotations

import json
import sys
from datetime import date, time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nemotron.catalog import Catalog, Step, plain
from nemotron.cli.console import print_columns, stdout_console
from nemotron.cli.help import command
from nemotron.errors import UserError

if TYPE_CHECKING:  # the queries load with `list` and `show`, not with a run
    from nemotron.catalog.query import FlowNode

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)  # its help: cli.app.GROUPS
PASSTHROUGH: list[str] = []  # filled by cli.app.main from everything after `--`


def _summary(step: Step) -> dict[str, Any]:
    from nemotron.catalog.query import engines_of

    m = step.manifest
    return {
        "id": step.id,
        "name": m.step.name,
        "category": m.step.category,
        "consumes": [{"name": c.name, "type": c.type, "required": c.required} for c in m.consumes],
        "produces": [{"name": p.name, "type": p.type} for p in m.produces],
        "presets": step.presets(),
        "tags": m.step.tags,
        "engines": list(engines_of(step)),
    }


def _iso(value: Any) -> str:
    """A TOML date or time in a manifest's parameters, as JSON shows it (ISO 8601)."""
    if isinstance(value, date | time):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


LIST_EXAMPLES = (
    "nemotron steps list --consumes preference_jsonl --json\n  nemotron steps list --category rl --tree"
)


@command(app, "list", LIST_EXAMPLES)
def list_steps(
    category: Annotated[
        str | None, typer.Option(help="only steps of this category (sft, rm, rl, ...)")
    ] = None,
    tag: Annotated[str | None, typer.Option(help="only steps whose manifest has this tag")] = None,
    consumes: Annotated[
        str | None,
        typer.Option(help="only steps with an input that accepts this artifact type (is_a counts)"),
    ] = None,
    produces: Annotated[
        str | None, typer.Option(help="only steps with an output usable as this artifact type (is_a counts)")
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(help="only steps this engine (a `backend` value) can run; types as it reads them"),
    ] = None,
    tree: Annotated[
        bool, typer.Option("--tree", help="the steps joined by the artifact types that flow between them")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """The step catalog; the filters combine (every one must match)."""
    from nemotron.catalog.query import Query, check, flow, flow_json, select

    catalog = Catalog()
    query = Query(category, tag, consumes, produces, engine)
    check(catalog, query)
    steps = select(catalog, query)
    if tree:
        nodes = flow(catalog, steps, engine)
        if as_json:
            print(json.dumps(flow_json(nodes), indent=2))
        elif steps:
            _print_tree(nodes)
    elif as_json:
        print(json.dumps([_summary(s) for s in steps], indent=2))
    elif steps:
        rows = []
        for s in steps:
            m = s.manifest
            # each type once: rl/dpo reads two checkpoints and two preference files
            ins = ", ".join(dict.fromkeys(c.type for c in m.consumes)) or "—"
            outs = ", ".join(dict.fromkeys(p.type for p in m.produces)) or "—"
            rows.append([s.id, f"{ins} → {outs}", ", ".join(s.presets()), m.step.name])
        print_columns(None, "nemotron steps", ["id", "consumes → produces", "presets", "name"], rows,
                      ["bold cyan", "", "green", ""])  # fmt: skip
    if not steps and not as_json:  # stderr: a query may match nothing, which is no error (exit 0)
        print("no step matches", file=sys.stderr)


def _print_tree(nodes: list[FlowNode]) -> None:
    """The flow as a rich Tree: each step under the step whose output it waits for last, with the type that flows
    and where its other required inputs come from ("yours": no listed step makes it)."""
    from rich.text import Text
    from rich.tree import Tree

    def label(node: FlowNode) -> Text:
        text = Text()
        if node.via:
            text.append(f"{node.via.type} → ", style="green")
        text.append(node.step.id, style="bold cyan")
        text.append(f"  {node.step.manifest.step.name}")
        if node.also:
            others = ", ".join(f"{f.type} ← {f.source or 'yours'}" for f in node.also)
            text.append(f"  ({'also' if node.via else 'reads'} {others})", style="dim")
        return text

    def grow(branch: Tree, children: list[FlowNode]) -> None:
        for child in children:
            grow(branch.add(label(child)), child.children)

    root = Tree(Text("nemotron steps, joined by the artifacts that flow between them", style="italic"))
    grow(root, nodes)
    stdout_console(markup=False).print(root)


@command(app, "show", "nemotron steps show rl/reinforce")
def show(
    step_id: Annotated[str, typer.Argument(metavar="ID")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """A step: inputs, outputs, parameters, presets, known errors.

    Its strategies too, as its manifest declares them."""
    from nemotron.catalog.query import engines_of

    step = Catalog().get(step_id)
    m = step.manifest
    if as_json:
        print(json.dumps({**_summary(step), "manifest": plain(m)}, indent=2, default=_iso))
        return
    from rich.table import Table
    from rich.text import Text

    # Every text as written: manifest text is no rich markup ("[...]" in a description stays) and parsing it as
    # markup, emoji codes included, was a third of the time this command takes to print.
    out = stdout_console(markup=False)
    out.print(Text.assemble((step.id, "bold cyan"), f" — {m.step.name}"))
    out.print(m.step.description)
    out.print(
        f"launch: {m.step.launch}   engines: {', '.join(engines_of(step))}   entry: {step.entry_path}   "
        f"presets: {', '.join(step.presets())}"
    )
    if m.step.services:
        out.print(f"runs beside: {', '.join(m.step.services)}")
    io = Table(title="artifacts", title_justify="left")
    for col in ("direction", "name", "type", "config key", "description"):
        io.add_column(col)
    for c in m.consumes:
        io.add_row(
            "consumes" + ("" if c.required else " (optional)"),
            c.name,
            c.type_text(),
            c.config_key,
            c.description,
        )
    for p in m.produces:
        io.add_row("produces", p.name, p.type, p.config_key, p.description)
    out.print(io)
    if m.parameters:
        params = Table(title="parameters (pass as key=value)", title_justify="left")
        for col in ("key", "default", "description"):
            params.add_column(col)
        for param in m.parameters:
            extra = f" choices: {param.choices}" if param.choices else ""
            params.add_row(param.key, json.dumps(param.default), param.description + extra)
        out.print(params)
    for s in m.strategies:
        out.print(Text.assemble(("strategy", "bold"), f" when {s.when}: {s.then}"))
    for e in m.errors:
        out.print(Text.assemble(("known error", "bold"), f" {e.name}: {e.recovery}"))
    if m.resources:
        out.print(
            "resources: "
            + "; ".join(
                f"{k}: {v.nodes} node(s) × {v.gpus_per_node} GPU, {v.cpus} CPU, {v.time}"
                for k, v in m.resources.items()
            )
        )


@command(
    app,
    "run",
    "nemotron steps run rl/reinforce -c tiny trainer.max_steps=20 --dry-run",
    context_settings={"allow_interspersed_args": True},
)
def run(
    step_id: Annotated[str, typer.Argument(metavar="ID")],
    overrides: Annotated[
        list[str] | None, typer.Argument(metavar="[KEY=VALUE]...", help="config overrides (dotlist)")
    ] = None,
    config: Annotated[
        list[str] | None,
        typer.Option(
            "-c",
            "--config",
            help="preset name or YAML path (once; a YAML file may extend presets with `defaults: [tiny]`)",
        ),
    ] = None,
    run_profile: Annotated[
        str | None, typer.Option("-r", "--run", help="profile to run attached (logs stream)")
    ] = None,
    batch_profile: Annotated[
        str | None, typer.Option("-b", "--batch", help="profile to submit detached")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("-d", "--dry-run", help="print what would be submitted; write nothing")
    ] = False,
    force_squash: Annotated[
        bool, typer.Option("--force-squash", help="re-import the container image into .sqsh")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="with --dry-run: the resource plan and the launch as JSON")
    ] = False,
) -> None:
    """Compile a step into a job and run it, or print it (--dry-run).

    The job is STEP + preset + profile + overrides; args after `--` go to the step."""
    if run_profile and batch_profile:
        raise UserError(
            "-r/--run and -b/--batch are mutually exclusive: -r runs attached, -b submits detached"
        )
    if as_json and not dry_run:
        raise UserError("--json goes with --dry-run (it prints the plan instead of submitting)")
    if config and len(config) > 1:
        raise UserError(
            f"-c given {len(config)} times ({', '.join(config)}): give one preset; to combine them, write a "
            "YAML file with `defaults: [first, second]` and pass that"
        )
    preset = config[0] if config else "default"
    from nemotron.compile import compile_job
    from nemotron.launch import submit

    job = compile_job(
        Catalog(),
        step_id,
        preset,
        overrides=list(overrides or []),
        profile_name=run_profile or batch_profile,
        mode="batch" if batch_profile else "attached",
        passthrough=list(PASSTHROUGH),
        force_squash=force_squash,
        argv=["nemotron", *sys.argv[1:]],
        dry_run=dry_run,
    )
    if dry_run and as_json:
        print(json.dumps(submit.dry_run_json(job), indent=2))
        return
    if dry_run:
        sys.stdout.write(submit.dry_run(job))
        return
    for note in job.notes:  # one line each, before the run's own output
        print(f"note: {note}", file=sys.stderr, flush=True)
    code = submit.submit(job)
    if code:
        raise typer.Exit(code)
