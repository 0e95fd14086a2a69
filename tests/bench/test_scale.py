"""Listings cost a page, not the history, measured by the work SQLite does rather than by wall time: every statement
a listing runs is traced, and SQLite's virtual machine steps (`set_progress_handler`) are counted per statement, on
the states bench/scale.py builds (100 then 10,000 artifacts, 100 then 2,000 jobs). A page's statements cost about
the same at both sizes; the statements that are linear by design (the "N more" count, the jobs index's check of the
job dirs, gc's plan over every artifact) grow at most linearly. Counts of VM steps are the same on a loaded machine
as on an idle one, and contain no process start-up.

`bench/scale.py` itself (whole CLI processes, wall time, for docs/benchmarks.md) gets a smoke run at a tiny size."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from nemotron.artifacts.gc import GcRun
from nemotron.artifacts.store import ArtifactStore
from nemotron.jobs.index import JobsIndex

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = (100, 10_000)
JOBS = (100, 2_000)
LIMIT = 10  # a page that is full at both sizes, with every filter used here
# A page may cost a little more in a larger store (a deeper B-tree); a listing that reads the history grows with it.
PAGE_GROWTH = 2.0
# The statements that are linear by design: the "N more" count, and the jobs index's read of (id, mtimes), which
# it compares with the job dirs (they stay the record of truth; see docs/benchmarks.md).
LINEAR = ("SELECT COUNT(", "SELECT id, seen FROM jobs")


def _scale_module() -> ModuleType:
    """bench/scale.py as a module (it imports bench/cli_latency.py as a sibling)."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("bench_scale", REPO / "bench" / "scale.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "bench"))


class Meter:
    """VM steps per statement, on every connection attached to it."""

    def __init__(self) -> None:
        self.steps: Counter[str] = Counter()
        self._current = ""

    def attach(self, conn: sqlite3.Connection) -> None:
        conn.set_trace_callback(self._started)
        conn.set_progress_handler(self._step, 1)

    def _started(self, statement: str) -> None:
        self._current = " ".join(statement.split())
        self.steps[self._current] += 0

    def _step(self) -> int:
        self.steps[self._current] += 1
        return 0  # go on

    def split(self) -> tuple[int, int]:
        """(steps of the page's statements, steps of the statements linear by design)."""
        linear = sum(n for q, n in self.steps.items() if q.startswith(LINEAR))
        return sum(self.steps.values()) - linear, linear


class MeteredStore(ArtifactStore):
    def __init__(self, root: Path, meter: Meter) -> None:
        super().__init__(root)
        self.meter = meter

    @contextmanager
    def _connect(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        with super()._connect(write) as conn:
            self.meter.attach(conn)
            yield conn


class MeteredIndex(JobsIndex):
    def __init__(self, meter: Meter) -> None:
        super().__init__()
        self.meter = meter

    def _open_file(self) -> sqlite3.Connection:
        conn = super()._open_file()
        self.meter.attach(conn)
        return conn


def _gc_summary(store: ArtifactStore) -> object:
    with GcRun(store, 1) as run:  # the CLI's dry run: the plan, then the summary per name
        return run.summary()


# What each listing command calls (src/nemotron/cli/artifacts.py): its page, then the count behind "N more".
ARTIFACT_LISTINGS: dict[str, Callable[[ArtifactStore], object]] = {
    "artifacts ls": lambda s: (list(s.newest(LIMIT)), s.count()),
    "artifacts ls --type checkpoint_hf": lambda s: (
        list(s.newest(LIMIT, type_="checkpoint_hf")),
        s.count(type_="checkpoint_hf"),
    ),
    "artifacts ls --step sft": lambda s: (list(s.newest(LIMIT, step="sft")), s.count(step="sft")),
    "artifacts lineage loop_policy:latest": lambda s: s.lineage_graph(s.resolve("loop_policy").id),
}
JOB_LISTINGS: dict[str, Callable[[JobsIndex], object]] = {
    "jobs ls": lambda index: index.page(LIMIT),
    "jobs ls --step sft": lambda index: index.page(LIMIT, step="sft"),
    "jobs ls --state succeeded": lambda index: index.page(LIMIT, state="succeeded"),
}


def _artifact_costs(root: Path, listing: Callable[[ArtifactStore], object]) -> tuple[int, int]:
    meter = Meter()
    listing(MeteredStore(root, meter))
    return meter.split()


def _job_costs(listing: Callable[[JobsIndex], object]) -> tuple[int, int]:
    meter = Meter()
    listing(MeteredIndex(meter))
    return meter.split()


@pytest.mark.timeout(600)
def test_listings_cost_a_page_not_the_history(home: Path) -> None:
    scale = _scale_module()
    root = home / "artifacts"
    costs: dict[str, list[tuple[int, int]]] = {}
    gc_steps: list[int] = []
    for n in ARTIFACTS:
        scale.grow_artifacts(home, n)
        for name, listing in ARTIFACT_LISTINGS.items():
            costs.setdefault(name, []).append(_artifact_costs(root, listing))
        gc_steps.append(sum(_artifact_costs(root, _gc_summary)))
    template = scale.template_job(home)
    for n in JOBS:
        newest = scale.grow_jobs(home, template, n)
        JobsIndex().page(1)  # the first listing after the dirs were copied in reads them (linear, by design)
        for name, listing in JOB_LISTINGS.items():
            costs.setdefault(name, []).append(_job_costs(listing))
        assert JobsIndex().page(1)[0][0].job_id == newest  # the newest first at every size
    report = {name: {"page": [c[0] for c in by], "linear": [c[1] for c in by]} for name, by in costs.items()}
    print(json.dumps({**report, "gc (dry run)": gc_steps}, indent=1))
    for name, by_size in costs.items():
        rows = ARTIFACTS if name.startswith("artifacts") else JOBS
        (small_page, small_linear), (large_page, large_linear) = by_size
        assert 0 < large_page <= PAGE_GROWTH * small_page, (name, report[name])
        # At most linear in the rows (100x the artifacts, 20x the jobs), never worse.
        assert large_linear <= 1.2 * small_linear * rows[1] / rows[0], (name, report[name])
    # gc plans over every artifact (a window per name, a recursive query for the kept ancestors): linear, no worse.
    assert gc_steps[1] <= 1.2 * gc_steps[0] * ARTIFACTS[1] / ARTIFACTS[0], gc_steps


@pytest.mark.timeout(300)
def test_the_benchmark_script_runs(tmp_path: Path) -> None:
    """bench/scale.py at a tiny size, one run: its states, commands, checks and table (no timing asserted)."""
    out = tmp_path / "scale.json"
    args = ["--artifacts", "20", "--jobs", "20", "--steps", "--runs", "1", "--json", str(out)]
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "scale.py"), *args], capture_output=True, text=True,
                          cwd=REPO, timeout=280)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(out.read_text())
    assert data["checks"] == {"newest job first at 20 jobs": True}
    assert set(data["paged"]) <= set(data["best"])
    assert "| `nemotron artifacts ls` |" in proc.stdout and "newest job first at 20 jobs: yes" in proc.stdout
