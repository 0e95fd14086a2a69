"""Jobs on a scheduler after submission: submit, status, logs, cancel and attached runs, shared by the Slurm
and Lepton executors. The job's record in status.json (launch/records.py: one model per launch shape) answers the
few questions for its scheduler; the rest is here: the grace of a job the scheduler does not know yet, outputs
registered after success (`register`), a watchdog's record kept when one failed the job.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from nemotron.core.paths import nemotron_home
from nemotron.errors import UserError
from nemotron.launch.records import RemoteRecord

log = logging.getLogger("nemotron")
# The job records (nemotron.jobs: pydantic models) are imported by the functions that read or write them: a dry run
# imports this module for its executor's classes and reads no record.
# sacct lags squeue by up to a second or two and knows nothing of a job in that time: pending, not lost.
UNKNOWN_GRACE_S = 120.0
_EXIT_LINE = re.compile(r"job exited with code (\d+)")
APP_STATES = {
    "UNSUBMITTED": "pending",
    "SUBMITTED": "pending",
    "PENDING": "pending",
    "RUNNING": "running",
    "SUCCEEDED": "succeeded",
    "FAILED": "failed",
    "CANCELLED": "cancelled",
    "UNKNOWN": "unknown",
}


def nemorun_home() -> Path:
    # Not `.../nemo_run`: without a container NeMo-Run rewrites every "/nemo_run" in the script.
    return nemotron_home() / "nemorun"


@contextmanager
def nemo_run() -> Iterator[ModuleType]:
    """`import nemo_run` with NEMORUN_HOME set first, and the root logger's handlers restored after NeMo-Run's
    `logging.basicConfig(force=True)` (called on import and by every Experiment)."""
    home = str(nemorun_home())
    loaded: Any = sys.modules.get("nemo_run.config")
    if loaded is not None and loaded.get_nemorun_home() != home:
        raise UserError(
            f"nemo_run was imported with NEMORUN_HOME={loaded.get_nemorun_home()}, not {home}: "
            "run one nemotron home per process"
        )
    os.environ["NEMORUN_HOME"] = home
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        import nemo_run as run

        for name in ("nemo_run", "torchx"):
            logging.getLogger(name).setLevel(logging.WARNING)
        yield run
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def runner(run: ModuleType) -> Any:
    from nemo_run.run.torchx_backend.runner import get_runner

    return get_runner()


# ----------------------------------------------------------------------------- the executors' shared part


class SchedulerJobs(ABC):
    """`refresh`, `print_logs` and `cancel` of an executor whose jobs run on a scheduler: each reads the job's
    record (`record`: one of the executor's shapes) and asks it."""

    @abstractmethod
    def record(self, status: dict[str, Any], job_dir: Path) -> RemoteRecord:
        """The record in a submitted job's status.json, as the shape it was submitted as."""

    def refresh(self, job_dir: Path) -> dict[str, Any]:
        return refresh_status(job_dir, self.record)

    def print_logs(self, job_dir: Path, follow: bool) -> None:
        print_logs(job_dir, follow, self.record)

    def cancel(self, job_dir: Path) -> dict[str, Any]:
        return cancel(job_dir, self.record)


# how remote.py reads a job's record from its status.json and job dir (an executor's `record`)
Reader = Callable[[dict[str, Any], Path], RemoteRecord]


def _age_s(status: dict[str, Any]) -> float:
    try:
        return (datetime.now(UTC) - datetime.fromisoformat(str(status.get("submitted_at")))).total_seconds()
    except ValueError:
        return 0.0


def exit_line_code(remote_dir: str | None, pattern: str) -> int | None:
    """The batch script's last words: `job exited with code N` in the first file matching `pattern`."""
    if not remote_dir:
        return None
    for path in Path(remote_dir).glob(pattern):
        found = last_exit_code(path.read_text(errors="replace"))
        if found is not None:
            return found
    return None


def last_exit_code(log: str) -> int | None:
    """N of the last `job exited with code N` line of a log, if any."""
    found = _EXIT_LINE.findall(log)
    return int(found[-1]) if found else None


# ----------------------------------------------------------------------------- submit and status


def submit_remote(job: Any, job_dir: Path, submit_job: Callable[[], RemoteRecord], record: Reader) -> int:
    """Hand the job to its scheduler; `-b` prints the job id, `-r` streams the step's log and Ctrl-C cancels."""
    from rich.console import Console

    from nemotron.jobs.dirs import now, update_status

    err = Console(stderr=True, highlight=False)
    try:
        submitted = submit_job()
    except UserError:
        update_status(job_dir, state="failed", ended_at=now(), error="refused before submission")
        raise
    except Exception as e:
        update_status(job_dir, state="failed", ended_at=now(), error=str(e)[-2000:])
        raise UserError(f"submitting {job.job_id} to '{job.profile.name}' failed: {e}") from e
    update_status(
        job_dir, state="pending", submitted_at=now(), **submitted.model_dump(mode="json", by_alias=True)
    )
    where = f"{job.profile.executor} job {submitted.remote_id}"
    if job.mode == "batch":
        print(job.job_id)
        err.print(f"submitted {job.job_id} ({where}). Follow it with: nemotron jobs logs {job.job_id} -f")
        return 0
    err.print(f"[bold]job[/] {job.job_id}  [dim]{where}; Ctrl-C cancels it[/]")
    started = time.monotonic()
    code = attach(
        job_dir, record, lambda line: err.print(line, markup=False, highlight=False, soft_wrap=True)
    )
    if code == 0:
        err.print(
            f"[green]✓[/] {job.step_id} finished in {time.monotonic() - started:.1f}s — nemotron jobs show {job.job_id}"
        )
    elif code == 130:
        err.print(f"[yellow]cancelled[/] {job.job_id}")
    else:
        err.print(f"[red]✗[/] {job.step_id} failed (exit {code}) — nemotron jobs logs {job.job_id}")
    return code


def refresh_status(job_dir: Path, record: Reader) -> dict[str, Any]:
    """Ask the scheduler for the job's state, record it in status.json, return the status. A job that succeeded
    with outputs to register (`register`) has them registered once, before it is recorded as succeeded."""
    from nemotron.jobs.dirs import now, update_status
    from nemotron.jobs.record import FINAL, read_status

    status = read_status(job_dir)
    if status.get("state") in FINAL or not status.get("handle"):
        return status
    job = record(status, job_dir)
    seen = job.state()
    state = seen.state
    if state == "unknown" and _age_s(status) < UNKNOWN_GRACE_S:
        state = "pending"
    fields: dict[str, Any] = {"state": state, "checked_at": now()}
    if state in FINAL:
        fields |= {"ended_at": now(), "exit_code": job.exit_code()}
        if state == "succeeded" and fields["exit_code"] is None:
            fields["exit_code"] = 0
        if state == "succeeded" and job.outputs:
            fields |= _register_outputs(job_dir, dict(job.outputs))
        if state == "failed":
            fields |= _liveness_failure(job_dir, seen.liveness)
    return update_status(job_dir, **fields)


def _liveness_failure(job_dir: Path, reported: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the job's watchdog saw when it failed the job (launch/liveness.py, launch/ray_watchdog.py), as the
    status's `error`: its record in the job dir, or the one the scheduler `reported` from a job dir this machine
    does not see (Lepton: the Ray job's log), then kept in the job dir here."""
    from nemotron.core.atomic import write_atomic
    from nemotron.runtime.progress import RECORD_FILE, failure_text

    if reported is not None:
        write_atomic(job_dir / RECORD_FILE, json.dumps(reported, indent=2) + "\n")
    try:
        seen = json.loads((job_dir / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {"error": failure_text(seen), "liveness": seen}


def _register_outputs(job_dir: Path, paths: dict[str, str]) -> dict[str, Any]:
    """Record what a remote engine's run registered on the cluster, else register what it left where this machine
    sees it; a run that left an output missing fails (nothing is registered)."""
    from nemotron.artifacts.lineage import job_store, register_job_outputs
    from nemotron.jobs.dirs import read_record

    record = read_record(job_dir)
    store = job_store(record)
    done = store.by_job(record.job_id) if store.exists() else []
    if done:
        return {"registered": [a.ref for a in done]}
    if not any(Path(path).parent.parent.is_dir() for path in paths.values()):
        return {
            "registration": "the outputs stay in the job dir on the cluster's storage, which this machine does not "
            "see, and the run could not register them there (nemotron not importable by it)"
        }
    missing = [f"{name}: {path}" for name, path in sorted(paths.items()) if not Path(path).exists()]
    if missing:
        return {
            "state": "failed",
            "exit_code": 1,
            "error": "the run ended without its outputs: " + "; ".join(missing),
        }
    from nemotron.errors import EngineOutputError

    try:
        arts = register_job_outputs(record, {k: Path(v) for k, v in paths.items()}, store=store)
    except EngineOutputError as err:
        return {"state": "failed", "exit_code": 1, "error": f"{err}; nothing registered"}
    return {"registered": [a.ref for a in arts]}


# ----------------------------------------------------------------------------- logs


def step_log_files(remote_dir: str | None, role: str | None) -> list[Path]:
    """The srun output files of one group (`role`) in the job's log dir."""
    if not role or not remote_dir:
        return []
    return sorted(Path(remote_dir).glob(f"log-nemotron.{role}_*.out"))


class LogTail:
    """New lines of the files `files()` names, across calls (files may appear late)."""

    live = True

    def __init__(self, files: Callable[[], list[Path]]) -> None:
        self.files = files
        self.offsets: dict[Path, int] = {}

    def read(self) -> str:
        chunks = []
        for path in self.files():
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            # hold back a partial last line until it is complete
            cut = data.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + cut
            chunks.append(data[:cut].decode("utf-8", "replace"))
        return "".join(chunks)


class WholeLog:
    """A log the scheduler gives whole, once the job is over (an API's answer, not a file to tail)."""

    live = False

    def __init__(self, text: Callable[[], str]) -> None:
        self.text, self.done = text, False

    def read(self) -> str:
        if self.done:
            return ""
        self.done = True
        return self.text()


def print_logs(job_dir: Path, follow: bool, record: Reader) -> None:
    """`nemotron jobs logs [-f]` for a remote job."""
    from nemotron.jobs.record import FINAL, read_status

    job = record(read_status(job_dir), job_dir)
    reader = job.log_reader(job_dir)
    while True:
        sys.stdout.write(reader.read())
        sys.stdout.flush()
        if not follow or not reader.live or refresh_status(job_dir, record).get("state") in FINAL:
            sys.stdout.write(reader.read())
            break
        time.sleep(1.0)
    for path in job.side_logs():
        print(f"(reward server log: {path})", file=sys.stderr)


# ----------------------------------------------------------------------------- cancel and attached runs


def cancel(job_dir: Path, record: Reader, wait_s: float = 30.0) -> dict[str, Any]:
    """Cancel the remote job and wait (a little) until the scheduler says so."""
    from nemotron.jobs.dirs import now, update_status
    from nemotron.jobs.record import FINAL, read_status

    status = read_status(job_dir)
    if not status.get("handle"):
        raise UserError(f"job {job_dir.name} was never submitted (no scheduler handle in status.json)")
    record(status, job_dir).cancel()
    deadline = time.monotonic() + wait_s
    asked = time.monotonic()
    while time.monotonic() < deadline:
        status = refresh_status(job_dir, record)
        if status.get("state") in FINAL:
            break
        if time.monotonic() - asked > 3.0:
            # a cancel that did not take: NeMo-Run (torchx) cancels only a job its scheduler query finds, and a job
            # submitted a moment ago may not be in Slurm's accounting yet (seen under load: the job ran to its end)
            record(status, job_dir).cancel()
            asked = time.monotonic()
        time.sleep(0.5)
    if status.get("state") not in FINAL:
        status = update_status(job_dir, state="cancelled", ended_at=now())
    return status


def attach(job_dir: Path, record: Reader, on_line: Callable[[str], None], poll_s: float = 0.5) -> int:
    """Stream the step's log until the job ends; Ctrl-C cancels it. Returns the exit code (130 if cancelled)."""
    from nemotron.jobs.record import FINAL, read_status

    reader = record(read_status(job_dir), job_dir).log_reader(job_dir)

    def emit(final: bool) -> None:
        if reader.live or final:
            for line in reader.read().splitlines():
                on_line(line)

    try:
        while True:
            emit(False)
            status = refresh_status(job_dir, record)
            if status.get("state") in FINAL:
                emit(True)
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        cancel(job_dir, record)
        return 130
    state = status.get("state")
    if state == "cancelled":
        return 130
    code = status.get("exit_code")
    return int(code) if isinstance(code, int) else (0 if state == "succeeded" else 1)
