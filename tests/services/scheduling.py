"""How the suite is handed out to the pytest-xdist workers: each test in a group (its file's, or a group it names),
the groups longest first by tests/test_seconds.json, `--quick`'s selection, and the signal that the run's tail has
begun. tests/conftest.py binds the hooks here (the tests are not a package on sys.path: --import-mode=importlib)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

# pytest-xdist's loadgroup puts a test in its group by appending "@group" to the test's node id on the worker
# (item._nodeid); since pytest 9.2 a node id is derived from item._id, so that append changes nothing and every test
# was handed out alone: the Slurm tests ran on several workers at once, and each worker started its own MLflow
# server. So the workers write each test's group to a file (pytest_collection_modifyitems) and the controller's
# scheduler reads it: xdist's own LoadScopeScheduling with the group as the scope.
GROUPS_ENV = "NEMOTRON_TEST_GROUPS"


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # a venv without xdist (.venv-vllm) runs these tests too
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist", default=None) != "loadgroup" or not os.environ.get(GROUPS_ENV):
        return None
    from xdist.scheduler import LoadScopeScheduling

    # LoadScopeScheduling hands out the units with the most tests first unless told not to (--loadscope-reorder is
    # on by default): that undid the longest-first order below, and the tiny pipeline's one 5-minute test started
    # last and ran alone at the end of the run
    config.option.loadscopereorder = False

    class _XdistGroups(LoadScopeScheduling):  # type: ignore[misc]
        """Work units are the groups the workers recorded (an xdist_group marker, or the test itself)."""

        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:  # read once, when the workers have all collected
                path = Path(os.environ[GROUPS_ENV])
                self._groups = json.loads(path.read_text()) if path.exists() else {}
            return self._groups.get(nodeid, nodeid)

        def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
            super().mark_test_complete(node, item_index, duration)
            if not self.workqueue and not self._pending_of(self.assigned_work[node]):
                _signal_tail(
                    len(self.assigned_work)
                    - sum(not self._pending_of(w) for w in self.assigned_work.values())
                )

    return _XdistGroups(config, log)


# $NEMOTRON_TEST_TAIL_FILE: written once, when a worker has finished and nothing is left to hand out. .ci/run starts
# the vLLM part then, so that it runs on what the suite's last units leave of the two cores.
TAIL_ENV = "NEMOTRON_TEST_TAIL_FILE"


def _signal_tail(busy: int) -> None:
    path = os.environ.get(TAIL_ENV)
    if path and not os.path.exists(path):
        Path(path).write_text(f"{time.time():.0f} {busy} workers busy\n")


def _record_groups(items: list[pytest.Item]) -> None:
    """On an xdist worker: every test's group, for the controller's scheduler (written whole, then renamed)."""
    out = os.environ.get(GROUPS_ENV)
    if not out or not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    groups = {}
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            groups[item.nodeid] = str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    partial = Path(f"{out}.{os.environ['PYTEST_XDIST_WORKER']}")
    partial.write_text(json.dumps(groups))
    partial.replace(out)


def configure(config: pytest.Config) -> None:
    """On the controller of a `--dist loadgroup` run: the file the workers write each test's group to."""
    if not hasattr(config, "workerinput") and config.getoption("dist", default=None) == "loadgroup":
        # the workers, started after this, write each test's group here (see _XdistGroups below)
        os.environ[GROUPS_ENV] = str(Path(tempfile.mkdtemp(prefix="nemotron-test-groups-")) / "groups.json")


def unconfigure(config: pytest.Config) -> None:
    groups = os.environ.get(GROUPS_ENV)
    if groups and not hasattr(config, "workerinput"):
        shutil.rmtree(Path(groups).parent, ignore_errors=True)


def group_and_order(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test into its xdist group, and the run ordered longest first.

    Under pytest-xdist (`scripts/test.sh` runs `-n 3 --dist loadgroup`) the tests marked `slurm` run on two
    workers, one per group: `slurm` (Ray across both nodes, the liveness tests that stop node2's processes, rm/serve
    on the whole cluster) and those marked `slurm(group="single")` (one job of one or two one-CPU tasks at a time).
    The local cluster has 4 CPUs per node (scripts/slurm-up.sh), so a job of one group never waits for the other's.
    Every other test not in a group of its own goes in its file's group: loadgroup hands each ungrouped test out
    alone, so a file's module fixtures (tiny models, fine-tuned policies, servers) were built once on every worker
    that ran one of its tests; the tests that use the MLflow server join the `mlflow` group."""
    if config.getoption("--quick"):
        _quick_selection(config, items)
    for item in items:
        slurm = item.get_closest_marker("slurm")
        if slurm is not None:
            group = slurm.kwargs.get("group")
            item.add_marker(pytest.mark.xdist_group(f"slurm-{group}" if group else "slurm"))
        elif item.get_closest_marker("xdist_group") is None:
            # the MLflow server is a session fixture: its users on one worker start it once (about 15 s of CPU)
            group = (
                "mlflow"
                if "mlflow_server" in getattr(item, "fixturenames", ())
                else item.nodeid.split("::")[0]
            )
            item.add_marker(pytest.mark.xdist_group(group))
    _record_groups(items)
    _slowest_first(items)


# Recorded wall seconds of each test file, and of each test that took 2 s or more: `python scripts/test_durations.py
# DIR --label after --seconds` rewrites it from a run recorded with $NEMOTRON_TEST_TIMES=DIR (docs/testing.md).
TEST_SECONDS = Path(__file__).resolve().parent.parent / "test_seconds.json"


def _recorded_seconds() -> dict[str, dict[str, float]]:
    if not TEST_SECONDS.exists():
        return {"files": {}, "tests": {}}
    recorded: dict[str, dict[str, float]] = json.loads(TEST_SECONDS.read_text())
    return recorded


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        help="the inner loop (scripts/test.sh --quick): leave out the Slurm tests and every test recorded at 2 s "
        "or more in tests/test_seconds.json, except those marked `smoke` (one tiny step end to end)",
    )


def _quick_selection(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = _recorded_seconds()["tests"]
    kept, left_out = [], []
    for item in items:
        heavy = item.get_closest_marker("slurm") is not None or item.nodeid in slow
        (left_out if heavy and item.get_closest_marker("smoke") is None else kept).append(item)
    config.hook.pytest_deselected(items=left_out)
    items[:] = kept


def _slowest_first(items: list[pytest.Item]) -> None:
    """Order the run longest first, so the workers end together instead of one finishing the pipeline test alone:
    xdist hands out work units in collection order. The unit is an xdist group (a test file, or a group a test
    names, like a `slurm` group, which one worker runs in sequence); its cost is the sum of its tests'
    recorded seconds, a test too quick to be listed taking an even share of what its file's total leaves. A unit
    tests/test_seconds.json does not know goes last, in collection order."""
    recorded = _recorded_seconds()
    files, tests = recorded["files"], recorded["tests"]
    unlisted: dict[str, int] = {}
    for item in items:
        if item.nodeid not in tests:
            file = item.nodeid.split("::")[0]
            unlisted[file] = unlisted.get(file, 0) + 1
    listed_in: dict[str, float] = {}
    for nodeid, s in tests.items():
        listed_in[nodeid.split("::")[0]] = listed_in.get(nodeid.split("::")[0], 0.0) + s

    def seconds(item: pytest.Item) -> float:
        if item.nodeid in tests:
            return tests[item.nodeid]
        file = item.nodeid.split("::")[0]
        return max(files.get(file, 0.0) - listed_in.get(file, 0.0), 0.0) / unlisted[file]

    def unit(item: pytest.Item) -> str:
        group = item.get_closest_marker("xdist_group")
        if group is None:
            return item.nodeid.split("::")[0]
        return str(group.args[0] if group.args else group.kwargs.get("name", "default"))

    cost: dict[str, float] = {}
    for item in items:
        cost[unit(item)] = cost.get(unit(item), 0.0) + seconds(item)
    rank = {name: r for r, name in enumerate(sorted(cost, key=lambda n: -cost[n]))}  # stable: ties keep order
    position = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank[unit(item)], position[id(item)]))
