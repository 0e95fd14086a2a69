"""Local execution: the step runs as a child process; attached runs stream its logs, batch runs detach.

NeMo-Run's LocalExecutor is not used here: it cannot detach, and importing it costs ~3 s per command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from nemotron import warm
from nemotron.core.atomic import write_atomic
from nemotron.core.procs import Child, start
from nemotron.core.redact import redact_text, secret_values
from nemotron.jobs.dirs import now, update_status
from nemotron.runtime.progress import BOUNDS_ENV, DIR_ENV, RECORD_FILE, failure_text, overdue, read_beacons

if TYPE_CHECKING:
    from nemotron.config.profiles import LocalProfile


GRACE_S = 10.0


def step_env(job_dir: Path, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    env["NEMOTRON_JOB_DIR"] = str(job_dir)
    env["PYTHONUNBUFFERED"] = "1"
    # as the step's runtime sets it, from the start: the step and its reward server share a warm server
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault(warm.ENABLE_ENV, "1")  # local steps and their servers fork from the warm server
    env.setdefault("NEMOTRON_HOME", str(job_dir.parent.parent))
    return env


def _stop(proc: Child) -> None:
    """SIGTERM the step's process group, then SIGKILL it after a grace period."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(GRACE_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def run_step_process(
    job_dir: Path,
    cmd: list[str],
    env: dict[str, str],
    on_line: Callable[[str], None] | None = None,
) -> int:
    """Run the step to completion, teeing its output to logs/step.log; record the final state in status.json.

    SIGTERM or Ctrl-C (KeyboardInterrupt) stops the child cleanly and marks the job cancelled.
    Returns the exit code (130 when cancelled).
    """
    log_path = job_dir / "logs" / "step.log"
    cancelled = threading.Event()
    secrets = _known_secrets(job_dir, env)

    def on_term(signum: int, frame: FrameType | None) -> None:
        cancelled.set()
        raise KeyboardInterrupt

    previous = (
        signal.signal(signal.SIGTERM, on_term)
        if threading.current_thread() is threading.main_thread()
        else None
    )
    # The step dies with its launcher (a kill -9 of it included), so a job is never left running unrecorded; it
    # forks from the warm server when one is up (nemotron.warm).
    proc = start(cmd, env, subprocess.PIPE, stdin=None)
    update_status(
        job_dir, state="running", pid=proc.pid, pgid=proc.pid, launcher_pid=os.getpid(), started_at=now()
    )
    stdout = proc.stdout
    assert stdout is not None
    with log_path.open("ab") as log:
        logging = [True]

        def pump() -> None:
            for raw in iter(stdout.readline, b""):
                line = redact_text(raw.decode("utf-8", "replace"), secrets)  # a step that prints a secret
                if logging[0]:
                    try:
                        log.write(line.encode())
                        log.flush()
                    except (
                        OSError
                    ):  # a full disk: keep draining the pipe (the step would block) and streaming
                        logging[0] = False
                if on_line is not None:
                    on_line(line.rstrip("\n"))

        # The pipe is read on a thread, so a cancel can stop the child and still log its last words.
        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        stalled: dict[str, Any] | None = None
        beacons, look_at = env.get(DIR_ENV), time.monotonic()
        try:
            while reader.is_alive():
                reader.join(0.2)
                if beacons and time.monotonic() >= look_at:  # the progress watch looks once a second
                    look_at += 1.0
                    stalled = _stalled(Path(beacons))
                if stalled is not None:
                    _stop(proc)  # its ranks too: they are the step's process group
                    reader.join(5)
                    break
            code = proc.wait()
        except KeyboardInterrupt:
            cancelled.set()
            _stop(proc)
            reader.join(5)
            code = 130
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    if cancelled.is_set():
        update_status(job_dir, state="cancelled", exit_code=code, ended_at=now())
        return 130
    if stalled is not None:
        error = failure_text(stalled)
        write_atomic(job_dir / RECORD_FILE, json.dumps(stalled, indent=2) + "\n")
        print(f"nemotron: liveness: {error}; the step was stopped", file=sys.stderr, flush=True)
        update_status(job_dir, state="failed", exit_code=1, ended_at=now(), error=error, liveness=stalled)
        return 1
    update_status(job_dir, state="succeeded" if code == 0 else "failed", exit_code=code, ended_at=now())
    return code


def _known_secrets(job_dir: Path, env: dict[str, str]) -> set[str]:
    """Values to mask in the step's log: the job's secret config values and secret-named environment variables."""
    values = secret_values(environ=env)
    try:
        values |= {str(v) for v in json.loads((job_dir / ".secrets.json").read_text()).values() if v}
    except (OSError, ValueError):
        pass
    return values


def progress_env(profile: LocalProfile, job_dir: Path) -> dict[str, str]:
    """Where the step's ranks keep their progress beacons (one folder per start) and their bounds, when the profile
    watches progress (`progress_floor_s` > 0; off by default on this machine)."""
    from nemotron.launch.liveness import PROGRESS, progress_bounds

    bounds = progress_bounds(profile)
    if bounds is None:
        return {}
    folder = job_dir / PROGRESS / f"local-{time.time_ns()}"
    return {DIR_ENV: str(folder), BOUNDS_ENV: bounds.encode()}


def _stalled(folder: Path) -> dict[str, Any] | None:
    """The progress verdict over the step's beacons (runtime.progress.overdue)."""
    return overdue(list(read_beacons(folder).values()), time.time())


def start_detached(job_dir: Path, cmd: list[str], env: dict[str, str]) -> int:
    """Background a launcher (python -m nemotron.launch.local) that runs the step; return the launcher's pid."""
    launcher = [sys.executable, "-m", "nemotron.launch.local", str(job_dir), "--", *cmd]
    with (job_dir / "logs" / "launcher.log").open("ab") as log:
        proc = subprocess.Popen(
            launcher, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
        )
    update_status(job_dir, state="pending", launcher_pid=proc.pid)
    return proc.pid


def cancel(job_dir: Path, status: dict[str, object], wait_s: float = GRACE_S + 5) -> bool:
    """Ask the job's launcher to stop it (SIGTERM); fall back to the step's process group. True if it stopped."""
    target = status.get("launcher_pid") or status.get("pid")
    if not isinstance(target, int):
        return False
    try:
        os.kill(target, signal.SIGTERM)
    except ProcessLookupError:
        pgid = status.get("pgid")
        if isinstance(pgid, int):
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        update_status(job_dir, state="cancelled", ended_at=now())
        return True
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        from nemotron.jobs.record import read_status

        if read_status(job_dir).get("state") in ("cancelled", "failed", "succeeded"):
            return True
        time.sleep(0.1)
    return False


def _main(argv: list[str]) -> int:
    job_dir = Path(argv[0])
    cmd = argv[argv.index("--") + 1 :]
    return run_step_process(job_dir, cmd, dict(os.environ))


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
