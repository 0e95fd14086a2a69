"""The local executor: the step as a child process of this machine (attached with a progress bar, or detached
behind a small launcher). It runs our own step processes only; a Ray launch needs a cluster profile.

A dry run needs only `placement` and `render`: the job records, the process launcher and importlib.metadata
are imported by the methods that run, watch or cancel a job (tests/cli/test_cli.py keeps them off a dry run)."""

from __future__ import annotations

import re
import sys
import time
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemotron.compile import Job
from nemotron.config.profiles import LocalProfile
from nemotron.core.paths import jobs_dir
from nemotron.engines.base import HetJob, Launch, RayDriver
from nemotron.errors import UserError
from nemotron.launch import render
from nemotron.plan.placement import Placement

if TYPE_CHECKING:
    from rich.console import Console


@cache
def err() -> Console:
    """The one stderr console of a run (its progress bar and its lines share it); rich is imported when a job runs,
    not when a dry run renders one."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


class LocalExecutor:
    kind = "local"
    cheap_refresh = True
    profile = LocalProfile

    def placement(self, job: Job[LocalProfile]) -> Placement:
        return Placement(
            str(jobs_dir() / job.job_id), 1, 0, here=True, ranks_per_node=job.profile.nproc_per_node
        )

    def render(self, job: Job[LocalProfile], where: Placement, launch: Launch) -> str:
        if isinstance(launch, RayDriver):
            raise UserError(
                f"backend={job.config_tree.get('backend')} runs on a Ray cluster in its container ({launch.image}): use a Slurm "
                "or Lepton profile (-r/-b PROFILE); on this machine use backend=builtin"
            )
        if isinstance(launch, HetJob):
            raise UserError(
                f"backend={job.config_tree.get('backend')} runs as a heterogeneous Slurm job: use a Slurm profile "
                f"(-r/-b PROFILE); {launch.local_hint}"
            )
        refusal = cuda_refusal(job.config_tree)
        if refusal:
            raise UserError(refusal)
        return render.local_launch(job, where.job_dir, python=sys.executable)

    def submit(self, job: Job[LocalProfile], job_dir: Path, where: Placement, launch: Launch) -> int:
        from nemotron.launch import local

        cmd = render.local_command(job, str(job_dir), python=sys.executable)
        extra = dict(job.profile.env_vars)
        if job.profile.artifacts_root:
            extra["NEMOTRON_ARTIFACTS_ROOT"] = str(Path(job.profile.artifacts_root).expanduser())
        if job.profile.cpu_threads:
            extra["OMP_NUM_THREADS"] = str(job.profile.cpu_threads)
        extra |= local.progress_env(job.profile, job_dir)
        env = local.step_env(job_dir, extra)
        if job.mode == "batch":
            local.start_detached(job_dir, cmd, env)
            print(job.job_id)
            err().print(
                f"submitted {job.job_id} (local, detached). Follow it with: nemotron jobs logs {job.job_id} -f"
            )
            return 0
        err().print(f"[bold]job[/] {job.job_id}  [dim]{job_dir}[/]")
        started = time.monotonic()
        code = _attached(job, job_dir, cmd, env)
        took = time.monotonic() - started
        if code == 0:
            err().print(
                f"[green]✓[/] {job.step_id} finished in {took:.1f}s — nemotron jobs show {job.job_id}"
            )
        elif code == 130:
            err().print(f"[yellow]cancelled[/] {job.job_id}")
        else:
            err().print(
                f"[red]✗[/] {job.step_id} failed (exit {code}) — log: {job_dir / 'logs' / 'step.log'}"
            )
            _explain_failure(job, job_dir)
        return code

    def refresh(self, job_dir: Path) -> dict[str, Any]:
        """status.json, except that a job whose launcher and step are both gone without recording an end (kill -9,
        a reboot) is recorded as failed here, instead of staying `running` forever."""
        from nemotron.jobs.dirs import now, update_status
        from nemotron.jobs.record import FINAL, gone_without_an_end, read_status

        status = read_status(job_dir)
        if not gone_without_an_end(status):
            return status
        pids = [status.get(k) for k in ("launcher_pid", "pid") if status.get(k)]
        status = read_status(job_dir)  # the launcher may have recorded the end just now
        if status.get("state") in FINAL:
            return status
        return update_status(
            job_dir,
            state="failed",
            ended_at=now(),
            exit_code=None,
            error=f"the job's processes ({', '.join(map(str, pids))}) are gone without recording an end",
        )

    def print_logs(self, job_dir: Path, follow: bool) -> None:
        from nemotron.jobs.record import FINAL, read_status

        path = job_dir / "logs" / "step.log"
        pos = 0
        while True:
            if path.is_file():
                with path.open("rb") as f:
                    f.seek(pos)
                    chunk = f.read()
                    pos += len(chunk)
                if chunk:
                    sys.stdout.write(chunk.decode("utf-8", "replace"))
                    sys.stdout.flush()
            if not follow or read_status(job_dir).get("state") in FINAL:
                if follow and path.is_file() and path.stat().st_size > pos:
                    continue
                return
            time.sleep(0.2)

    def cancel(self, job_dir: Path) -> dict[str, Any]:
        from nemotron.jobs.record import read_status
        from nemotron.launch import local

        if not local.cancel(job_dir, read_status(job_dir)):
            raise UserError(
                f"job {job_dir.name} did not stop in time; its status: {read_status(job_dir).get('state')}"
            )
        return read_status(job_dir)


def cuda_refusal(config: dict[str, Any]) -> str | None:
    """Why `runtime.device=cuda` cannot run on this machine, found without importing torch (the step checks again
    with torch.cuda): a CPU-only torch build, or no NVIDIA driver device. None when CUDA may be there."""
    runtime = config.get("runtime")
    if not isinstance(runtime, dict) or runtime.get("device") != "cuda":
        return None
    import importlib.metadata

    try:
        build = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        build = "absent"
    if build.endswith("+cpu") or not Path("/dev/nvidiactl").exists():
        return (
            f"runtime.device=cuda, but this machine has no CUDA device (torch {build}"
            f"{'' if Path('/dev/nvidiactl').exists() else ', no NVIDIA driver'}): use runtime.device=auto or cpu, "
            "or submit to a GPU profile (-b PROFILE)"
        )
    return None


def _attached(job: Job[LocalProfile], job_dir: Path, cmd: list[str], env: dict[str, str]) -> int:
    """Stream the step's output; a progress bar tracks `step i/N` lines."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[stats]}"),
        console=err(),
        transient=True,
    )
    task = progress.add_task(job.step_id, total=None, stats="")

    def on_line(line: str) -> None:
        progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
        parsed = parse_step_line(line)
        if parsed:
            done, total, stats = parsed
            progress.update(task, completed=done, total=total, stats=stats)

    from nemotron.launch import local

    with progress:
        return local.run_step_process(job_dir, cmd, env, on_line)


def parse_step_line(line: str) -> tuple[int, int, str] | None:
    """`... step 3/30 rewards=0.41 ...` -> (3, 30, 'rewards=0.41 ...')."""
    marker = line.find("step ")
    if marker < 0:
        return None
    head, _, stats = line[marker + 5 :].partition(" ")
    done, sep, total = head.partition("/")
    if not sep or not done.isdigit() or not total.isdigit():
        return None
    return int(done), int(total), stats[:80]


def _explain_failure(job: Job[LocalProfile], job_dir: Path) -> None:
    """Match the failure's own lines against the manifest's known errors and print their recovery."""
    try:
        tail = (job_dir / "logs" / "step.log").read_text(errors="replace")[-20000:]
        manifest = job.catalog.get(job.step_id).manifest
    except (OSError, UserError):
        return
    for name, recovery in known_errors([(k.name, k.match, k.recovery) for k in manifest.errors], tail):
        err().print(f"[bold]known error[/] {name}: {recovery}")


_FAILURE_LINE = re.compile(r"^(error: |[A-Za-z_][\w.]*(Error|Exception)(: |$))")


def known_errors(rules: list[tuple[str, str | None, str]], log: str) -> list[tuple[str, str]]:
    """(name, recovery) of each rule whose `match` appears in a line that states the failure: run_step's
    `error: ...` or an uncaught exception's `SomeError: ...`. Ordinary progress lines never match, so a log
    that mentions the reward server starting does not blame it for an unrelated failure."""
    failures = [line.lower() for line in log.splitlines() if _FAILURE_LINE.match(line)]
    return [
        (name, recovery)
        for name, match, recovery in rules
        if match and any(match.lower() in line for line in failures)
    ]
