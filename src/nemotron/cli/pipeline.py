"""`nemotron pipeline run NAME`."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from nemotron.cli.console import stdout_console
from nemotron.cli.help import command
from nemotron.errors import UserError

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)  # its help: cli.app.GROUPS
err = Console(stderr=True, highlight=False)
out = stdout_console()


@command(app, "run", "nemotron pipeline run tiny --until sft")
def run(
    name: Annotated[
        str, typer.Argument(help="pipeline name (manifests/pipelines/NAME.toml) or a .toml path")
    ],
    force: Annotated[bool, typer.Option("--force", help="rerun steps whose outputs already exist")] = False,
    until: Annotated[str | None, typer.Option(help="stop after this pipeline step id")] = None,
    batch_profile: Annotated[
        str | None, typer.Option("-b", "--batch", help="with --dry-run: the profile every step compiles for")
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "-d",
            "--dry-run",
            help="compile every step, each input bound to its upstream step's planned output; print what each "
            "would submit; run and write nothing",
        ),
    ] = False,
) -> None:
    """Run a pipeline's steps in order, skipping those already done.

    A step is done when it ran before with the same inputs and config."""
    from nemotron.catalog import Catalog
    from nemotron.launch.pipeline import load_pipeline

    catalog = Catalog()
    pipe = load_pipeline(name, catalog)
    if dry_run:
        _dry_run(pipe, catalog, batch_profile, until)
        return
    if batch_profile:
        raise UserError(
            "-b/--batch goes with --dry-run: a pipeline runs its steps one after the other on this machine, "
            "each waiting for the one before"
        )
    _run(pipe, catalog, force, until)


def _dry_run(pipe: Any, catalog: Any, profile: str | None, until: str | None) -> None:
    """Every step's `steps run --dry-run` text, in order, under a header naming the step and what it is bound to."""
    import sys

    from nemotron.launch.pipeline import plan_pipeline

    for p in plan_pipeline(pipe, catalog, profile, until=until):
        sys.stdout.write(f"# ==== pipeline {pipe.pipeline.name}, step {p.id}: {p.step}\n")
        for name, path in sorted(p.outputs.items()):
            sys.stdout.write(f"# planned output {p.id}.{name}: {path}\n")
        sys.stdout.write(p.text)


def _run(pipe: Any, catalog: Any, force: bool, until: str | None) -> None:
    from nemotron.artifacts.store import open_store
    from nemotron.core.paths import artifacts_dir, check_writable, jobs_dir
    from nemotron.launch import submit
    from nemotron.launch.pipeline import PipelineStep, eval_reports, run_pipeline, verdict, verdict_cells

    check_writable(jobs_dir(), "jobs directory")  # before the first step's header, not after it
    store = open_store(artifacts_dir())

    def on_event(kind: str, step: PipelineStep, payload: Any) -> None:
        if kind == "skip":
            err.print(
                f"[dim]skip[/] {step.id} ({step.step}): outputs exist: {', '.join(a.ref for a in payload.values())}"
            )
        elif kind == "start":
            err.rule(f"{step.id}: {step.step} -c {step.preset}")

    t0 = time.monotonic()
    results = run_pipeline(pipe, catalog, store, submit.submit, force=force, on_event=on_event, until=until)
    out.print(report_table(pipe.pipeline.name, time.monotonic() - t0, results, pipe.pipeline.report))
    reports = eval_reports(pipe, results)
    if pipe.pipeline.compare and reports:  # none when --until stopped before the eval steps
        record = verdict(reports, pipe.pipeline.compare, store, jobs_dir())
        header, rows = verdict_cells(record)
        table = Table(title=f"pipeline {pipe.pipeline.name}: eval reports", title_justify="left")
        for i, column in enumerate(header):
            table.add_column(column, justify="left" if i < 2 else "right")
        for row in rows:
            table.add_row(*row)
        out.print(table)
        rule = record["rule"]
        out.print(
            f"mean [{rule['level']:.0%} bootstrap interval]; Δ: the difference from {rows[0][0]} over the same "
            f"prompts ({rule['test']} bootstrap, {rule['resamples']} resamples), higher / lower when its interval "
            f"excludes 0. More: nemotron artifacts compare {' '.join(r.ref for r in reports)}",
            markup=False,
            highlight=False,
        )


def report_table(name: str, seconds: float, results: list[Any], report: list[str]) -> Table:
    """One row per step: ran or skipped, outputs, and each reported metric as before -> after."""
    from nemotron.jobs import dirs as records

    table = Table(title=f"pipeline {name}: {seconds:.0f}s", title_justify="left")
    table.add_column("step")
    table.add_column("run")
    table.add_column("outputs")
    pairs = list(dict.fromkeys(k.removeprefix("eval_").rsplit("_", 1)[0] for k in report))
    for metric in pairs:
        table.add_column(f"{metric} before → after", justify="right")
    for r in results:
        metrics: dict[str, Any] = {}
        job_id = r.job_id or next((a.job_id for a in r.outputs.values() if a.job_id), None)
        if job_id:
            try:
                for row in records.read_metrics(records.resolve_job_dir(job_id)):
                    metrics.update(row)
            except UserError:  # the job dir was cleaned away: report what the store knows
                metrics = {}
        cells = []
        for metric in pairs:
            b, a = metrics.get(f"eval_{metric}_before"), metrics.get(f"eval_{metric}_after")
            cells.append(f"{b:.3f} → {a:.3f}" if isinstance(b, float) and isinstance(a, float) else "")
        ran = "skipped (done)" if r.skipped else f"{r.seconds:.0f}s"
        table.add_row(r.step, ran, "\n".join(a.ref for a in r.outputs.values()), *cells)
    return table
