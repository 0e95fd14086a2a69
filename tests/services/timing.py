"""Per-test wall and CPU time, for docs/testing.md (`python scripts/test_durations.py` reads what this writes).

With $NEMOTRON_TEST_TIMES set to a directory, each pytest process (each xdist worker) appends one JSON line per test
phase (setup, call, teardown) to `<dir>/<worker>.jsonl`: the test id, the phase, its wall seconds and its CPU seconds.
CPU counts this process and every child it waited for (`RUSAGE_CHILDREN`: the CLI subprocesses, step processes and
servers a test starts and stops), so a test that trains in a subprocess shows its training. A session fixture's
cost lands in the setup phase of the first test that needs it, as pytest's own `--durations` reports it.
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

    def record(self, nodeid: str, phase: str, wall_s: float, cpu_s: float) -> None:
        row = {"test": nodeid, "phase": phase, "wall_s": round(wall_s, 3), "cpu_s": round(cpu_s, 3)}
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
        self.record(item.nodeid, phase, time.monotonic() - wall, _cpu_seconds() - cpu)


def register(config: pytest.Config) -> None:
    """Install the recorder when $NEMOTRON_TEST_TIMES names a directory."""
    out = os.environ.get("NEMOTRON_TEST_TIMES")
    if out:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        config.pluginmanager.register(PhaseTimes(Path(out), worker), "nemotron-test-times")
