"""`artifacts gc` as the user reads it: what would go (per name, or per artifact with --verbose), what an alias or a
running job keeps, and with --yes the batched delete (nemotron.artifacts.gc plans and deletes)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from nemotron.artifacts.gc import GcRun, remove_owned
from nemotron.artifacts.store import ArtifactStore
from nemotron.core.paths import nemotron_home

if TYPE_CHECKING:
    from rich.console import Console

# Lines each of "kept by an alias" and "kept by a running job" prints before it says how many more
SHOWN_KEPT = 50


def job_ended(job_id: str) -> bool:
    """Whether a job that pinned artifacts has ended, as this home recorded it (a job of another home, or one
    whose record is gone, keeps its pins: `nemotron jobs status JOB` records a remote job's end)."""
    from nemotron.core.paths import jobs_dir
    from nemotron.jobs.record import FINAL, read_status

    job_dir = jobs_dir() / job_id
    return job_dir.is_dir() and read_status(job_dir).get("state") in FINAL


def size_text(n: int) -> str:
    """A byte count as gc reports it: 3 B, 8.8 KB, 1.2 GB."""
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "TB":
            break
        size /= 1024
    else:
        unit = "TB"
    return f"{n} B" if n < 1024 else f"{size:.1f} {unit}"


def run_gc(store: ArtifactStore, keep: int, *, yes: bool, verbose: bool, out: Console) -> None:
    """Report what gc keeps and removes, and with `yes` remove it; Ctrl-C while deleting is exit 130 with the
    store consistent (each batch is its own transaction)."""
    home = nemotron_home().resolve()
    doing = "removing" if yes else "would remove"
    with GcRun(store, keep, write=yes and store.exists(), ended=job_ended) as run:
        if verbose:
            for a in run.removable():
                owned = Path(a.path).is_relative_to(home)
                what = (
                    "delete files + index entry"
                    if owned
                    else "drop index entry (files outside $NEMOTRON_HOME are left alone)"
                )
                out.print(f"{doing} {a.ref} ({a.type}): {what}", markup=False, highlight=False)
        else:
            names, more = run.summary()
            for n in names:
                what = (
                    f"{n.name}:v{n.first}"
                    if n.count == 1
                    else f"{n.count} versions of {n.name} (v{n.first}..v{n.last})"
                )
                out.print(f"{doing} {what}, {size_text(n.bytes)}", markup=False, highlight=False)
            if more:
                out.print(f"... and {more} more names (--verbose lists every artifact)", markup=False)
        _print_kept(
            out,
            [f"keeping {n}:v{v}: alias {n}@{al} points at it" for n, v, al in run.by_alias[:SHOWN_KEPT]],
            len(run.by_alias),
            "an alias",
        )
        _print_kept(
            out,
            [f"keeping {n}:v{v}: job {j} uses it as an input" for n, v, j in run.by_job[:SHOWN_KEPT]],
            len(run.by_job),
            "running jobs",
        )
        summary = (
            f"{run.kept} kept, {run.gone} {'removed' if yes else 'removable'} ({size_text(run.gone_bytes)})"
        )
        if not yes:
            out.print(summary + (" — run with --yes to remove" if run.gone else ""), markup=False)
            return
        try:
            done = run.delete(lambda paths: remove_owned(paths, home))
        except KeyboardInterrupt:
            out.print(
                "gc interrupted: the batches already deleted are gone, the store is consistent; run gc again to finish"
            )
            raise typer.Exit(130) from None
    out.print(
        summary
        if done == run.gone
        else f"{run.kept} kept, {done} removed ({run.gone - done} kept: an artifact registered or aliased meanwhile uses them)",
        markup=False,
    )


def _print_kept(out: Console, lines: list[str], total: int, kept_by: str) -> None:
    """The first SHOWN_KEPT of `total` artifacts kept by an alias or by a running job, and how many more."""
    for line in lines:
        out.print(line, markup=False, highlight=False)
    if total > SHOWN_KEPT:
        out.print(f"... and {total - SHOWN_KEPT} more artifacts kept by {kept_by}", markup=False)
