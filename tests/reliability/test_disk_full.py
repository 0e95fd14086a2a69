"""A full disk (issue 29): $NEMOTRON_HOME on a small real tmpfs. A run that fills it is one line and exit 3 with the
path, the bytes it needed and what was free, no traceback and nothing half-written registered; the same run
finishes once space is freed; with no byte left, the commands that only read still answer and a new run is refused
in one line before any job dir exists. Mounting needs root (CAP_SYS_ADMIN): elsewhere these tests skip, saying so."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nemotron.errors import DiskFull, disk_full


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """small_disk(MIB): a tmpfs of that size, unmounted afterwards."""
    mounted: list[Path] = []

    def mount(mib: int) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(where)], capture_output=True
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip() or 'mount failed'})")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(disk: Path, leave: int) -> Path:
    """Fill the disk with one file until `leave` bytes are free."""
    filler = disk / "filler"
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    try:
        with filler.open("wb") as f:
            f.write(b"\0" * max(free - leave, 0))
    except OSError:
        pass  # exactly full
    return filler


def _env(home: Path) -> dict[str, str]:
    return {"NEMOTRON_HOME": str(home)}


def _home_on_a_full_disk(small_disk: Callable[[int], Path], mib: int, leave: int) -> tuple[Path, Path]:
    """A home on a fresh disk of `mib` MiB, filled until `leave` bytes are free: (the home, the filler file)."""
    disk = small_disk(mib)
    home = disk / "home"
    home.mkdir()
    return home, _fill(disk, leave)


def _disk_full_line(run_cli: Any, run: tuple[str, ...], home: Path, timeout: float) -> str:
    """`run` in `home` stopped by the full disk: exit 3, and the one error line it printed."""
    r = run_cli(*run, env=_env(home), timeout=timeout)
    assert r.code == 3, r.err[-3000:]
    return _one_error_line(r.err)


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


@pytest.mark.slow
def test_a_run_that_fills_the_disk_is_one_line_exit_3_and_finishes_once_space_is_freed(
    small_disk: Callable[[int], Path], run_cli: Any
) -> None:
    # the run's records fit, its 518 KiB checkpoint does not
    home, filler = _home_on_a_full_disk(small_disk, 3, leave=400 * 1024)
    run = ("steps", "run", "sft", "-c", "tiny", "trainer.max_steps=5")
    line = _disk_full_line(run_cli, run, home, timeout=300)
    assert line.startswith("error: disk full: cannot write the checkpoint ") and "/outputs/policy" in line, (
        line
    )
    assert "needs about 518.0 KiB;" in line and "free of 3.0 MiB there" in line, line
    assert line.endswith(
        "free space, then run it again (a step with checkpoints goes on from its last one: checkpoint.resume=auto)"
    )
    assert not [p for p in home.rglob("*") if ".tmp-" in p.name]  # the half-written checkpoint is gone
    listed = run_cli("artifacts", "ls", env=_env(home))
    assert listed.code == 0 and "tiny_sft_policy" not in listed.out  # nothing half-written registered
    state = run_cli("jobs", "ls", env=_env(home))
    assert state.code == 0 and "failed" in state.out

    filler.unlink()
    again = run_cli(*run, env=_env(home), timeout=300)
    assert again.code == 0, again.err[-3000:]
    listed = run_cli("artifacts", "ls", env=_env(home))
    assert "tiny_sft_policy:v1" in listed.out


@pytest.mark.slow
def test_an_rl_run_stopped_by_a_full_disk_resumes_from_its_last_whole_checkpoint(
    small_disk: Callable[[int], Path], run_cli: Any
) -> None:
    # room for the step-5 checkpoint (1.6 MiB), not for step 10's
    home, filler = _home_on_a_full_disk(small_disk, 8, leave=2400 * 1024)
    run = ("steps", "run", "rl/reinforce", "-c", "tiny", "trainer.max_steps=15", "checkpoint.save_interval=5")
    line = _disk_full_line(run_cli, run, home, timeout=600)
    assert line.startswith("error: disk full: cannot write the checkpoint of step 10 "), line
    assert "/checkpoints/step_000010 (no space left, needs about 1.6 MiB; " in line, line
    job = next((home / "jobs").iterdir())
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == ["latest", "step_000005"]  # no torn one
    assert run_cli("jobs", "status", job.name, env=_env(home)).out.strip() == f"{job.name}: failed (exit 3)"

    filler.unlink()
    again = run_cli(*run, "checkpoint.resume=true", env=_env(home), timeout=600)
    assert again.code == 0, again.err[-3000:]
    assert f"resumed from {job}/checkpoints/step_000005 at step 5" in again.err
    assert "tiny_reinforce_policy:v1" in run_cli("artifacts", "ls", env=_env(home)).out


def test_with_no_byte_free_reads_answer_and_a_run_is_refused_in_one_line(
    small_disk: Callable[[int], Path], run_cli: Any
) -> None:
    disk = small_disk(3)
    home = disk / "home"
    made = run_cli("steps", "run", "data/prep", "-c", "tiny", env=_env(home), timeout=300)
    assert made.code == 0, made.err[-2000:]
    job = next((home / "jobs").iterdir()).name
    _fill(disk, leave=0)
    assert os.statvfs(disk).f_bavail == 0
    for args in (
        ("artifacts", "ls"),
        ("artifacts", "show", "tiny_prompts:v1"),
        ("artifacts", "lineage", "tiny_prompts:v1"),
        ("jobs", "ls"),
        ("jobs", "status", job),
        ("jobs", "show", job),
    ):
        r = run_cli(*args, env=_env(home))
        assert r.code == 0 and "Traceback" not in r.err, f"{args}: {r.err[-2000:]}"
        assert "tiny_prompts" in r.out or job in r.out, (args, r.out)
    jobs_before = sorted(p.name for p in (home / "jobs").iterdir())
    r = run_cli("steps", "run", "sft", "-c", "tiny", env=_env(home))
    assert r.code == 3
    line = _one_error_line(r.err)
    # the first write of a run registers its path inputs: the store is where it stops
    assert line.startswith(
        f"error: disk full: cannot write the artifact store {home}/artifacts/index.sqlite "
    ), line
    assert line.endswith("(no space left; 0 B free of 3.0 MiB there)"), line
    assert (
        sorted(p.name for p in (home / "jobs").iterdir()) == jobs_before
    )  # no job dir, not even a temporary one


def test_a_full_disk_is_told_from_other_errors(tmp_path: Path) -> None:
    enospc = OSError(28, "No space left on device", "/data/x")
    assert str(disk_full(enospc)).startswith("disk full: /data/x (no space left; ")
    wrapped = RuntimeError("cannot save")
    wrapped.__cause__ = enospc
    assert isinstance(disk_full(wrapped), DiskFull)
    rust = RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert str(disk_full(rust, tmp_path)).startswith(f"disk full: {tmp_path} (no space left; ")
    assert disk_full(OSError(13, "Permission denied", "/data/x")) is None
    # torch's zip writer drops the errno: a full disk only where the place written to has (almost) no space
    assert (
        disk_full(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos"), tmp_path)
        is None
    )
