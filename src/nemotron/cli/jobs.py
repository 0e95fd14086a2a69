"""`nemotron jobs ls | status | show | logs | cancel | plot`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from nemotron import jobs as records
from nemotron.cli.console import stdout_console
from nemotron.cli.help import epilog
from nemotron.errors import UserError

app = typer.Typer(help="Inspect and control jobs.", no_args_is_help=True)
out = stdout_console()


@app.command("ls", epilog=epilog("nemotron jobs ls --limit 10"))
def ls(
    as_json: Annotated[bool, typer.Option("--json")] = False,
    limit: Annotated[int, typer.Option(help="newest N")] = 50,
) -> None:
    """Jobs, newest first."""
    from nemotron.launch.executor import executor_named

    rows = []
    for job_id in records.list_job_ids()[:limit]:
        d = records.resolve_job_dir(job_id)
        rec, st = records.read_record(d), records.read_status(d)
        if st.get("state") not in ("succeeded", "failed", "cancelled"):
            executor = executor_named(str(rec.get("executor") or "local"))
            st = executor.refresh(d) if executor.cheap_refresh else st
        rows.append(
            {
                "job_id": job_id,
                "step": rec.get("step"),
                "preset": rec.get("preset"),
                "executor": rec.get("executor"),
                "state": st.get("state"),
                "created_at": rec.get("created_at"),
                "remote_id": st.get("remote_id"),
            }
        )
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    from nemotron.paths import jobs_dir

    table = Table(title=f"jobs in {jobs_dir()}", title_justify="left")
    for col in ("job id", "step", "preset", "executor", "state", "created"):
        table.add_column(col)
    colors = {"succeeded": "green", "failed": "red", "cancelled": "yellow", "running": "cyan"}
    for r in rows:
        state = str(r["state"])
        table.add_row(
            str(r["job_id"]),
            str(r["step"]),
            str(r["preset"]),
            str(r["executor"]),
            f"[{colors.get(state, 'white')}]{state}[/]",
            str(r["created_at"]),
        )
    out.print(table)


def _live_status(job_dir: Path) -> dict[str, object]:
    st = records.read_status(job_dir)
    if st.get("state") in ("succeeded", "failed", "cancelled"):
        return st
    from nemotron.launch.executor import executor_of

    return executor_of(job_dir).refresh(job_dir)


@app.command("status", epilog=epilog("nemotron jobs status JOB_ID --json"))
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


@app.command("show", epilog=epilog("nemotron jobs show JOB_ID"))
def show(job_id: str, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """A job's record, its last metrics, and the artifacts it consumed and produced."""
    from nemotron.artifacts.store import ArtifactStore
    from nemotron.paths import artifacts_dir

    d = records.resolve_job_dir(job_id)
    rec, st = records.read_record(d), _live_status(d)
    metrics = records.read_metrics(d)
    produced = [a.ref for a in ArtifactStore(artifacts_dir()).by_job(d.name)]
    info = {
        "job_id": d.name,
        "step": rec.get("step"),
        "preset": rec.get("preset"),
        "state": st.get("state"),
        "exit_code": st.get("exit_code"),
        "dir": str(d),
        "consumed": [
            f"{i['name']}: {i.get('artifact') or i.get('path') or i['ref']}" for i in rec.get("inputs", [])
        ],
        "produced": produced,
        "last_metrics": metrics[-1] if metrics else None,
        "git": rec.get("git"),
    }
    if as_json:
        print(json.dumps(info, indent=2))
        return
    for k, v in info.items():
        out.print(f"[bold]{k}[/]: {v}", markup=True, highlight=False)


@app.command("logs", epilog=epilog("nemotron jobs logs JOB_ID -f"))
def logs(job_id: str, follow: Annotated[bool, typer.Option("-f", "--follow")] = False) -> None:
    """Print a job's log; -f follows it until the job ends."""
    from nemotron.launch.executor import executor_of

    d = records.resolve_job_dir(job_id)
    executor_of(d).print_logs(d, follow)


@app.command("cancel", epilog=epilog("nemotron jobs cancel JOB_ID"))
def cancel(job_id: str) -> None:
    """Stop a running job (SIGTERM, then SIGKILL after a grace period)."""
    d = records.resolve_job_dir(job_id)
    st = records.read_status(d)
    if st.get("state") in ("succeeded", "failed", "cancelled"):
        raise UserError(f"job {d.name} already ended ({st.get('state')})")
    from nemotron.launch.executor import executor_of

    executor_of(d).cancel(d)
    out.print(f"{d.name}: cancelled")


@app.command("plot", epilog=epilog("nemotron jobs plot JOB_ID -o curves.png"))
def plot(
    job_id: str,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="PNG path (default: JOB_DIR/metrics.png)")
    ] = None,
) -> None:
    """Write a PNG of reward, KL and loss curves."""
    from nemotron.plotting import plot_metrics

    d = records.resolve_job_dir(job_id)
    rows = records.read_metrics(d)
    if not rows:
        raise UserError(f"job {d.name} has no metrics yet")
    path = plot_metrics(rows, output or d / "metrics.png", title=f"{d.name}")
    out.print(str(path))
