"""Per-test wall and CPU time, for docs/testing.md (`python scripts/test_durations.py` reads what this writes).

With $NEMOTRON_TEST_TIMES set to a directory, each pytest process (each xdist worker) appends one JSON line per test
phase (setup, call, teardown) to `<dir>/<worker>.jsonl`: the test id, the phase, its wall seconds and its CPU seconds.
CPU counts this process and every child it waited for (`RUSAGE_CHILDREN`: the CLI subprocesses, step processes and
servers a test starts and stops), so a test that trains in a subprocess shows its training. A session fixture's
cost lands in the setup phase of the first test that needs it, as pytest's own `--durations` reports it.
After the call phase it also counts the jobs the test ran (`jobs`: the job dirs, each holding job.yaml, in the homes
under the test's own tmp_path; a run refused as bad input writes none): what a test costs is mostly its step
processes, each about 10 s of CPU importing torch and transformers before it trains. Runs a session or module
fixture makes (tests/conftest.py's shared runs) are not in a test's tmp_path and are not counted.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class PhaseTimes:
    """Writes one line per test phase to its worker's file."""

    def __init__(self, out_dir: Path, worker: str) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = (out_dir / f"{worker}.jsonl").open("a", buffering=1)
        self._worker = worker

    def record(self, nodeid: str, phase: str, wall_s: float, cpu_s: float, jobs: int = 0) -> None:
        row = {
            "test": nodeid,
            "phase": phase,
            "wall_s": round(wall_s, 3),
            "cpu_s": round(cpu_s, 3),
            "jobs": jobs,
        }
        self._file.write(json.dumps({**row, "worker": self._worker}) + "\n")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        yield from self._timed(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        yield from self._timed(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        yield from self._timed(item, "teardown")

    def _timed(self, item: pytest.Item, phase: str) -> Iterator[None]:
        wall, cpu = time.monotonic(), _cpu_seconds()
        yield
        wall, cpu = time.monotonic() - wall, _cpu_seconds() - cpu
        self.record(item.nodeid, phase, wall, cpu, _jobs_in(item) if phase == "call" else 0)


def _jobs_in(item: pytest.Item) -> int:
    """The job dirs in the homes under the test's tmp_path (home/jobs/ID, or one level deeper)."""
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if not isinstance(tmp, Path):
        return 0
    return sum(1 for pattern in ("*/jobs/*/job.yaml", "*/*/jobs/*/job.yaml") for _ in tmp.glob(pattern))


def register(config: pytest.Config) -> None:
    """Install the recorder when $NEMOTRON_TEST_TIMES names a directory."""
    out = os.environ.get("NEMOTRON_TEST_TIMES")
    if out:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        config.pluginmanager.register(PhaseTimes(Path(out), worker), "nemotron-test-times")
