"""`nemotron jobs ls | status | show | logs | cancel | plot | sync`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from nemotron.cli.console import TABLE_ROWS, print_columns, stdout_console
from nemotron.cli.help import command
from nemotron.cli.listing import more_note, since_option
from nemotron.errors import UserError
from nemotron.jobs import dirs as records
from nemotron.jobs.record import read_status

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)  # its help: cli.app.GROUPS
out = stdout_console()
err_console = Console(stderr=True)


# `jobs ls` asks the schedulers about unfinished jobs within a budget; a status checked this recently is shown as is.
LS_REFRESH_BUDGET_S = 10.0
LS_REFRESH_TTL_S = 30.0


def checked_recently(status: dict[str, object], at: datetime, ttl_s: float = LS_REFRESH_TTL_S) -> bool:
    """Whether a scheduler answered for this job less than `ttl_s` ago (status.json's `checked_at`)."""
    try:
        checked = datetime.fromisoformat(str(status.get("checked_at")))
    except ValueError:
        return False
    return (at - checked).total_seconds() < ttl_s


@command(app, "ls", "nemotron jobs ls --step rl/rlhf --since 7d --limit 10")
def ls(
    as_json: Annotated[bool, typer.Option("--json")] = False,
    limit: Annotated[int, typer.Option(min=1, help="newest N")] = 50,
    all_: Annotated[bool, typer.Option("--all", help="every job, not the newest --limit")] = False,
    step: Annotated[str | None, typer.Option(help="only jobs of this step (e.g. rl/rlhf)")] = None,
    state: Annotated[
        str | None, typer.Option(help="only jobs in this state (pending, running, succeeded, ...)")
    ] = None,
    since: Annotated[str | None, since_option("jobs created")] = None,
) -> None:
    """Jobs, newest first, with their state.

    This $NEMOTRON_HOME's, newest first by creation time, from the jobs index ($NEMOTRON_HOME/jobs.sqlite, or
    the team's PostgreSQL when $NEMOTRON_STORE_URL is set; brought up to date with the job dirs first). Unfinished
    jobs are refreshed from their executor (Slurm, Lepton) within 10 s in all; a state checked in the last 30 s is
    shown as is."""
    from nemotron.core.paths import jobs_dir
    from nemotron.jobs.index import JobsIndex

    page, more = JobsIndex().page(None if all_ else limit, step=step, state=state, since=since)
    rows, stale = [], 0
    deadline = time.monotonic() + LS_REFRESH_BUDGET_S
    for job in page:
        d = jobs_dir() / job.job_id
        row = job.as_dict()
        if job.state == "unreadable":  # one unreadable record must not hide the others
            err_console.print(f"note: {job.error}", markup=False, highlight=False, soft_wrap=True)
        elif job.state not in ("succeeded", "failed", "cancelled") and job.executor:
            # Imported only for unfinished jobs: the executors import the compiler (0.1 s).
            from nemotron.launch.executor import executor_named

            executor = executor_named(job.executor)
            st: dict[str, object] = {"state": job.state}
            if executor.cheap_refresh:
                st = executor.refresh(d)
            elif checked_recently(read_status(d), datetime.now(UTC)):
                pass
            elif time.monotonic() < deadline:
                st = _refresh_or_keep(executor.refresh, d, st)
            else:
                stale += 1
            row["state"] = st.get("state", job.state)
            row["remote_id"] = st.get("remote_id", job.remote_id)
        rows.append(row)
    if stale:
        err_console.print(f"note: {stale} unfinished job(s) not refreshed within {LS_REFRESH_BUDGET_S:.0f} s; "
                          "`nemotron jobs status JOB_ID` asks their executor")  # fmt: skip
    more_note(more, "jobs")
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    headers = ["job id", "step", "preset", "executor", "state", "created"]
    cells = [
        [str(r[k]) for k in ("job_id", "step", "preset", "executor", "state", "created_at")] for r in rows
    ]
    if len(cells) > TABLE_ROWS:
        print_columns(out, f"jobs in {jobs_dir()}", headers, cells, ["bold", "", "", "", "", ""])
        return
    table = Table(title=f"jobs in {jobs_dir()}", title_justify="left")
    for col in headers:
        table.add_column(col)
    colors = {"succeeded": "green", "failed": "red", "cancelled": "yellow", "running": "cyan"}
    for c in cells:
        table.add_row(*c[:4], f"[{colors.get(c[4], 'white')}]{c[4]}[/]", c[5])
    out.print(table)


def _refresh_or_keep(
    refresh: Callable[[Path], dict[str, object]], job_dir: Path, status: dict[str, object]
) -> dict[str, object]:
    """A scheduler that cannot answer (unreachable host, expired credentials) leaves the row as recorded: `jobs ls`
    lists every job; `jobs status` shows the error."""
    try:
        return refresh(job_dir)
    except Exception as e:  # any executor's failure: the listing must go on
        err_console.print(f"note: {job_dir.name}: status not refreshed ({type(e).__name__}: {e})")
        return status


def _live_status(job_dir: Path) -> dict[str, object]:
    st = read_status(job_dir)
    if st.get("state") in ("succeeded", "failed", "cancelled"):
        return st
    from nemotron.launch.executor import executor_of

    return executor_of(job_dir).refresh(job_dir)


@command(app, "status", "nemotron jobs status JOB_ID --json")
def status(job_id: str, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """A job's state."""
    d = records.resolve_job_dir(job_id)
    st = _live_status(d)
    if as_json:
        print(json.dumps({"job_id": d.name, **st}, indent=2))
    else:
        out.print(
            f"{d.name}: [bold]{st.get('state')}[/]"
            + (f" (exit {st['exit_code']})" if st.get("exit_code") is not None else "")
        )


@command(app, "show", "nemotron jobs show JOB_ID")
def show(job_id: str, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """A job: its record, last metrics, and the artifacts in and out."""
    from nemotron.artifacts.store import open_store
    from nemotron.errors import NotFound

    d = records.resolve_job_dir(job_id)
    rec, st = records.read_record(d), _live_status(d)
    metrics = records.read_metrics(d)
    store = open_store()
    produced = [a.ref for a in store.by_job(d.name)]

    def removed(artifact_id: int | None) -> bool:
        """An input version that gc removed since (a failed job lets go of its inputs)."""
        if artifact_id is None or not store.exists():
            return False
        try:
            store.get(artifact_id)
        except NotFound:
            return True
        return False

    info = {
        "job_id": d.name,
        "step": rec.step,
        "preset": rec.preset,
        "state": st.get("state"),
        "exit_code": st.get("exit_code"),
        "dir": str(d),
        "consumed": [
            f"{i.name}: {i.artifact or i.path or i.ref}{' (deleted)' if removed(i.artifact_id) else ''}"
            for i in rec.inputs
        ],
        "produced": produced,
        "last_metrics": metrics[-1] if metrics else None,
        "git": rec.git.model_dump(),
    }
    if as_json:
        print(json.dumps(info, indent=2))
        return
    for k, v in info.items():
        out.print(f"[bold]{k}[/]: {v}", markup=True, highlight=False)


@command(app, "logs", "nemotron jobs logs JOB_ID -f")
def logs(job_id: str, follow: Annotated[bool, typer.Option("-f", "--follow")] = False) -> None:
    """Print a job's log; -f follows it until the job ends."""
    from nemotron.launch.executor import executor_of

    d = records.resolve_job_dir(job_id)
    executor_of(d).print_logs(d, follow)


@command(app, "cancel", "nemotron jobs cancel JOB_ID")
def cancel(job_id: str) -> None:
    """Stop a running job (SIGTERM, then SIGKILL after a grace period)."""
    d = records.resolve_job_dir(job_id)
    st = read_status(d)
    if st.get("state") in ("succeeded", "failed", "cancelled"):
        raise UserError(f"job {d.name} already ended ({st.get('state')})")
    from nemotron.launch.executor import executor_of

    executor_of(d).cancel(d)
    out.print(f"{d.name}: cancelled")


@command(app, "plot", "nemotron jobs plot JOB_ID -o curves.png")
def plot(
    job_id: str,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="PNG path (default: JOB_DIR/metrics.png)")
    ] = None,
) -> None:
    """Write a PNG of reward, KL and loss curves."""
    from nemotron.cli.plotting import plot_metrics

    d = records.resolve_job_dir(job_id)
    rows = records.read_metrics(d)
    if not rows:
        raise UserError(f"job {d.name} has no metrics yet")
    path = plot_metrics(rows, output or d / "metrics.png", title=f"{d.name}")
    out.print(str(path))


@command(app, "sync", "nemotron jobs sync JOB_ID --to mlflow")
def sync(
    job_id: str,
    to: Annotated[
        str | None,
        typer.Option(help="mlflow, wandb or all (default: the trackers the job's config enables)"),
    ] = None,
    mlflow_uri: Annotated[
        str | None,
        typer.Option(
            help="the MLflow server to replay into instead of the job's tracking.mlflow.tracking_uri"
        ),
    ] = None,
) -> None:
    """Replay a finished job into MLflow / W&B.

    Its config, metrics.jsonl and registered artifacts with their inputs go to its experiment trackers, e.g. after a tracker was down while it ran. The job's run is found again by its id and
    gets only what it lacks: a second sync adds nothing. Exit 3 when a tracker still fails after retries."""
    from nemotron.errors import ServiceError
    from nemotron.tracking.sync import TRACKERS, sync_job

    if to is not None and to not in (*TRACKERS, "all"):
        raise UserError(f"--to {to}: not a tracker; use mlflow, wandb or all")
    d = records.resolve_job_dir(job_id)
    try:
        done = sync_job(d, to, mlflow_uri)
    except ServiceError as e:
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(ServiceError.exit_code) from None
    for s in done:
        rows = (f"{s.metric_rows} metric rows sent" if s.metric_rows == s.of_rows else
                f"{s.metric_rows} of {s.of_rows} metric rows sent: the run had the others")  # fmt: skip
        out.print(f"{d.name}: synced to {s.tracker} ({rows}; artifacts: {', '.join(s.artifacts) or 'none'})",
                  markup=False, highlight=False)  # fmt: skip
