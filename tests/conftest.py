"""Shared fixtures: an isolated $NEMOTRON_HOME, a helper that runs the real CLI in a subprocess, the figures the
scripts/ record for the docs, the local Slurm cluster for tests marked `slurm` (tests/slurm and the vLLM
judge's hetjob in tests/vllm), and a real MLflow tracking server (`mlflow_server`, for the tracking tests)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURE_STEPS = Path(__file__).resolve().parent / "fixtures" / "steproot"


def _load_service(name: str) -> ModuleType:
    """tests/services/NAME.py as a module (the tests are not a package on sys.path: --import-mode=importlib)."""
    path = Path(__file__).resolve().parent / "services" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"nemotron_test_services_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


_pg = _load_service("postgres")
PostgresServer = _pg.PostgresServer


def pytest_configure(config: pytest.Config) -> None:
    # A suite started in the background (`cmd &` in a script, nohup) inherits SIGINT ignored, and so would every
    # process it starts (an ignored signal stays ignored across exec): the Ctrl-C tests' SIGINT would do nothing. Here
    # Ctrl-C is Python's KeyboardInterrupt again, so the xdist workers and the CLIs they start get it as a user does.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # $NEMOTRON_TEST_TIMES=DIR records each test's wall and CPU time (scripts/test_durations.py, docs/testing.md)
    _load_service("timing").register(config)
    if not hasattr(config, "workerinput") and config.getoption("dist", default=None) == "loadgroup":
        # the workers, started after this, write each test's group here (see _XdistGroups below)
        os.environ[GROUPS_ENV] = str(Path(tempfile.mkdtemp(prefix="nemotron-test-groups-")) / "groups.json")


def pytest_unconfigure(config: pytest.Config) -> None:
    groups = os.environ.get(GROUPS_ENV)
    if groups and not hasattr(config, "workerinput"):
        shutil.rmtree(Path(groups).parent, ignore_errors=True)


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


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    h = tmp_path / "home"
    monkeypatch.setenv("NEMOTRON_HOME", str(h))
    monkeypatch.delenv("NEMOTRON_ENV_FILE", raising=False)
    monkeypatch.delenv("NEMOTRON_STEPS_PATH", raising=False)
    monkeypatch.setenv(
        "NEMOTRON_CACHE_DIR", str(tmp_path / "cache")
    )  # the manifest cache, off the user's ~/.cache
    monkeypatch.chdir(tmp_path)
    yield h


def nemotron_argv(*args: str, python_flags: Sequence[str] = ()) -> list[str]:
    """The argv of `python [PYTHON_FLAGS] -m nemotron ARGS` in this interpreter, for tests that drive the process
    themselves (signals, streaming)."""
    return [sys.executable, *python_flags, "-m", "nemotron", *args]


def cli(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
    python_flags: Sequence[str] = (),
) -> Result:
    """Run `python -m nemotron ARGS` for real: exit code, stdout and stderr as a user sees them."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    if python_flags:  # what this process itself imports is measured: it runs here, not in a warm child
        full_env.pop("NEMOTRON_WARM_CLI", None)
    proc = subprocess.run(
        nemotron_argv(*args, python_flags=python_flags),
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


# Runs `python -m nemotron ARGS` as -m does and writes sys.modules when the process exits. `cli` puts "-m nemotron"
# after this code; sys.argv is then ["-c", "-m", "nemotron", *ARGS].
_MODULES_AT_EXIT = (
    "import atexit, os, runpy, sys\n"
    "def dump():\n"
    "    with open(os.environ['NEMOTRON_TEST_MODULES_OUT'], 'w') as f:\n"
    "        f.write('\\n'.join(sys.modules))\n"
    "atexit.register(dump)\n"
    "sys.argv = sys.argv[2:]\n"
    "runpy.run_module('nemotron', run_name='__main__', alter_sys=True)\n"
)


def cli_imports(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> tuple[Result, set[str]]:
    """`cli`, and every module the command had imported when it exited: sys.modules, so a step's schema, which the
    catalog executes from its file, counts too (`-X importtime` does not see it)."""
    fd, out = tempfile.mkstemp(prefix="nemotron-modules-")
    os.close(fd)
    try:
        r = cli(
            *args,
            timeout=timeout,
            env={**(env or {}), "NEMOTRON_TEST_MODULES_OUT": out},
            python_flags=("-c", _MODULES_AT_EXIT),
        )
        modules = set(Path(out).read_text().split())
    finally:
        os.unlink(out)
    assert modules, f"the command wrote no module list: {r.err[-2000:]}"
    return r, modules


@pytest.fixture
def fixture_steps(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put the test-only steps (test/count) on the search path."""
    monkeypatch.setenv("NEMOTRON_STEPS_PATH", str(FIXTURE_STEPS))
    return FIXTURE_STEPS


# ----------------------------------------------------------------------------- scripts/ and the figures they record


def load_script(name: str) -> ModuleType:
    """scripts/NAME.py as a module (its main() not run)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recorded_figures(name: str, *keys: str) -> tuple[ModuleType, dict[str, Any]]:
    """scripts/NAME.py and the record it wrote to its FIGURES file, once its PAGE is seen to show that record
    as the script renders it (no hand edit, nothing left unshown) and the record to name each of `keys`."""
    script = load_script(name)
    record = json.loads(script.FIGURES.read_text())
    page = script.PAGE.read_text()
    assert script.update_page(page, record) == page, f"run `python scripts/{name}.py`"
    for key in keys:
        assert record[key] not in (None, ""), key
    return script, record


# ----------------------------------------------------------------------------- the helpers, as fixtures


def tiny_model(out: Path, family: str = "llama") -> Path:
    """A tiny model of `family` with random weights and the shipped tokenizer, written to `out` the way the docs
    tell a user to make one (python -m nemotron.models.tiny)."""
    cmd = [sys.executable, "-m", "nemotron.models.tiny", "--family", family, str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def make_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """The `tiny_model` helper, made once per family in the whole run and copied to each `out` (a test may edit
    its copy): the command imports torch and transformers, about 10 s of CPU each time. The pytest-xdist workers
    share one made model through their common temporary directory, a file lock letting one make it."""
    from filelock import FileLock

    shared = _shared_root(tmp_path_factory) / "tiny-models"
    shared.mkdir(parents=True, exist_ok=True)

    def copy_of(out: Path, family: str = "llama") -> Path:
        made = shared / family
        with FileLock(str(shared / f"{family}.lock")):
            if not made.exists():
                partial = shared / f"{family}.partial"
                shutil.rmtree(partial, ignore_errors=True)  # a make that died half way
                tiny_model(partial, family).rename(made)
        shutil.copytree(made, out)
        return out

    copy_of.__doc__ = tiny_model.__doc__
    return copy_of


def tokenizer_variant(base: Path, out: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of the model at `base` in `out` whose tokenizer.json is `edit(tree)` (made once: kept if `out` exists)."""
    if not out.exists():
        shutil.copytree(base, out)
        tree = json.loads((out / "tokenizer.json").read_text())
        edit(tree)
        (out / "tokenizer.json").write_text(json.dumps(tree, ensure_ascii=False))
    return out


def permute_vocab(tree: dict[str, Any]) -> None:
    """A tokenizer.json tree edit: the same tokens in a shuffled order (seed 0); special tokens keep their ids 0-2."""
    import random

    vocab: dict[str, int] = tree["model"]["vocab"]
    moved = sorted(i for i in vocab.values() if i >= 3)
    shuffled = moved[:]
    random.Random(0).shuffle(shuffled)
    new_id = dict(zip(moved, shuffled, strict=True))
    tree["model"]["vocab"] = {t: new_id.get(i, i) for t, i in vocab.items()}


def _helper_fixture(helper: Callable[..., Any]) -> Any:
    """A fixture whose value is `helper`: test modules cannot import conftest under --import-mode=importlib, so
    they take its helpers as fixtures (the fixture's name is the name it is bound to below)."""

    def fixture() -> Callable[..., Any]:
        return helper

    fixture.__doc__ = f"The `{helper.__name__}` helper: {helper.__doc__}"
    return pytest.fixture(scope="session")(fixture)  # a plain function: any fixture may take it


run_cli = _helper_fixture(cli)
run_cli_imports = _helper_fixture(cli_imports)
nemotron_cmd = _helper_fixture(nemotron_argv)
script_module = _helper_fixture(load_script)
script_figures = _helper_fixture(recorded_figures)
make_tokenizer_variant = _helper_fixture(tokenizer_variant)
shuffle_vocab = _helper_fixture(permute_vocab)


# ----------------------------------------------------------------------------- the local Slurm cluster


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`scripts/test.sh` runs `-n 3 --dist loadgroup`) the tests marked `slurm` run on two
    workers, one per group: `slurm` (Ray across both nodes, the liveness tests that stop node2's processes, rm/serve
    on the whole cluster) and those marked `slurm(group="single")` (one job of one or two one-CPU tasks at a time).
    The local cluster has 4 CPUs per node (scripts/slurm-up.sh), so a job of one group never waits for the other's.
    Every other test not in a group of its own goes in its file's group: loadgroup hands each ungrouped test out
    alone, so a file's module fixtures (tiny models, fine-tuned policies, servers) were built once on every worker
    that ran one of its tests; the tests that use the MLflow server join the `mlflow` group. Tests marked `gpu` are skipped where torch sees no CUDA device, those marked `no_gpu`
    where it sees one."""
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
    marked = [item for item in items if item.get_closest_marker("gpu") or item.get_closest_marker("no_gpu")]
    if not marked:
        return  # torch is imported only when a collected test asks about the GPU
    import torch

    has_gpu = torch.cuda.is_available()
    for item in marked:
        if item.get_closest_marker("gpu") is not None and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device; torch sees none here"))
        if item.get_closest_marker("no_gpu") is not None and has_gpu:
            item.add_marker(
                pytest.mark.skip(reason="checks a machine without CUDA; torch sees a device here")
            )


# Recorded wall seconds of each test file, and of each test that took 2 s or more: `python scripts/test_durations.py
# DIR --label after --seconds` rewrites it from a run recorded with $NEMOTRON_TEST_TIMES=DIR (docs/testing.md).
TEST_SECONDS = Path(__file__).resolve().parent / "test_seconds.json"


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


SLURM_UP = REPO / "scripts" / "slurm-up.sh"
# A first call installs four Debian packages; later calls return in well under a second.
SLURM_UP_TIMEOUT_S = 900


SLURM_FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}


@dataclass(frozen=True)
class SlurmCluster:
    """What scripts/slurm-up.sh brings up: one partition holding two nodes on 127.0.0.1."""

    partition: str = "debug"
    nodes: tuple[str, ...] = ("node1", "node2")

    def final_state(self, slurm_id: str, timeout_s: float = 180) -> str:
        """The job's final state, polling sacct (which lags squeue); a hetjob reports its leader's line first.
        Returns once squeue no longer lists the job either: sacct can say COMPLETED while squeue still shows it
        COMPLETING (its epilog, on a loaded machine), and the schedulers' status calls (torchx's, NeMo-Run's Ray
        status) read squeue first, so `jobs status` would still say running."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["sacct", "-n", "-P", "-X", "-j", slurm_id, "-o", "State"], capture_output=True, text=True
            ).stdout
            states = [line.split()[0] for line in out.splitlines() if line.strip()]
            queued = subprocess.run(
                ["squeue", "-h", "-j", slurm_id, "-o", "%T"], capture_output=True, text=True
            )
            if states and all(s in SLURM_FINAL for s in states) and set(queued.stdout.split()) <= SLURM_FINAL:
                return states[0]
            time.sleep(0.5)
        raise AssertionError(
            f"slurm job {slurm_id} not finished after {timeout_s} s\n{self.describe(slurm_id)}"
        )

    def wait_running(self, slurm_id: str, timeout_s: float = 300) -> None:
        """Until the job has its allocation. Time in the queue (behind a job a test before this one left
        completing, on a loaded machine) is not what a test measures: its own deadlines start from here."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["squeue", "-h", "-j", slurm_id, "-o", "%T"], capture_output=True, text=True
            ).stdout.split()
            if out[:1] != ["PENDING"]:  # running, or ran and left the queue already
                return
            time.sleep(0.5)
        raise AssertionError(
            f"slurm job {slurm_id} still pending after {timeout_s} s\n{self.describe(slurm_id)}"
        )

    def describe(self, slurm_id: str) -> str:
        """The queue, the nodes and this job, for a failure message (the cluster is gone when CI's log is read)."""
        commands = [
            ["squeue", "-o", "%i %T %r %N %M"],
            ["sinfo", "-N", "-o", "%N %T %E"],
            ["sacct", "-n", "-P", "-j", slurm_id, "-o", "JobID,State,ExitCode,Start,End,NodeList"],
        ]
        shown = []
        for argv in commands:
            done = subprocess.run(argv, capture_output=True, text=True)
            shown.append(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}")
        return "\n".join(shown)


def slurm_required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("NEMOTRON_REQUIRE_SLURM") == "1"


def start_cluster() -> str | None:
    """Run scripts/slurm-up.sh; return why Slurm is unavailable, or None when it is up."""
    if shutil.which("bash") is None:
        return "bash not found"
    if os.geteuid() != 0:
        return "scripts/slurm-up.sh needs root (it installs packages and starts daemons)"
    try:
        done = subprocess.run(
            ["bash", str(SLURM_UP)], capture_output=True, text=True, timeout=SLURM_UP_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return f"scripts/slurm-up.sh did not finish within {SLURM_UP_TIMEOUT_S} s"
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        return f"scripts/slurm-up.sh failed (exit {done.returncode}):\n{tail}"
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """A running local cluster. Left running after the session: the next one starts in < 1 s."""
    reason = start_cluster()
    if reason is not None:
        if slurm_required():
            pytest.fail(f"Slurm is required (CI=true or NEMOTRON_REQUIRE_SLURM=1) but unavailable: {reason}")
        pytest.skip(f"local Slurm unavailable: {reason}")
    return SlurmCluster()


@pytest.fixture(autouse=True)
def _cluster_for_slurm_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    # Tests marked `slurm` need the cluster even when they do not name the fixture.
    if request.node.get_closest_marker("slurm") is not None:
        request.getfixturevalue("slurm_cluster")
    yield


def postgres_required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("NEMOTRON_REQUIRE_POSTGRES") == "1"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for this pytest worker (tests/services/postgres.py); in CI a missing server fails
    the test instead of skipping it."""
    bindir = _pg.pg_bindir()
    if bindir is None:
        reason = "PostgreSQL is not installed (initdb/pg_ctl not found; scripts/test.sh installs it as root)"
        if postgres_required():
            pytest.fail(f"PostgreSQL is required (CI=true or NEMOTRON_REQUIRE_POSTGRES=1): {reason}")
        pytest.skip(reason)
    server = PostgresServer.start(bindir)
    try:
        _pg.wait_ready(server)
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A fresh, empty database on the session's PostgreSQL server."""
    return postgres_server.create_database()


# ----------------------------------------------------------------------------- a real MLflow tracking server

# its first start migrates a new SQLite database: about 20 s on a busy 2-core runner
MLFLOW_START_TIMEOUT_S = 180


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `mlflow server` for the session (SQLite backend and artifacts under a tmp dir, 127.0.0.1, a free
    port): its tracking URI. Tests query it with MlflowClient; each uses its own experiment or job ids."""
    import http.client
    import urllib.request

    from nemotron.core.procs import free_port

    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log_path = root / "server.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
             "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + MLFLOW_START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mlflow server exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (OSError, http.client.HTTPException):  # not up yet
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"mlflow server not healthy in {MLFLOW_START_TIMEOUT_S} s:\n{log_path.read_text()[-3000:]}"
                )
            time.sleep(0.5)
        yield uri
    finally:
        import signal

        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and its uvicorn worker
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ----------------------------------------------------------------------------- train once, reuse (issue 40)
# A step run costs a step process (about 10 s of CPU importing torch and transformers) and its training. Tests that
# only read what a run left (its metrics, its outputs) share one run, made once per pytest session: under xdist each
# worker has its own session, so the run is made in a directory the workers share, under a file lock, by whichever
# worker asks first; the others wait for it and read its result (the pattern of pytest-xdist's docs). The tests only
# read it: a test that changes what a run left makes its own.


@dataclass(frozen=True)
class SharedRun:
    """A `nemotron ARGS` run made once for the whole session: its exit code, output and $NEMOTRON_HOME."""

    args: tuple[str, ...]
    code: int
    out: str
    err: str
    home: Path

    @staticmethod
    def env_of(home: Path) -> dict[str, str]:
        return {"NEMOTRON_HOME": str(home), "NEMOTRON_CACHE_DIR": str(home.parent / "cache")}

    @property
    def env(self) -> dict[str, str]:
        """The environment that points the CLI at this run's home (`run_cli(..., env=run.env)`)."""
        return self.env_of(self.home)

    @property
    def job_dir(self) -> Path:
        """The one job the run made."""
        (job,) = (self.home / "jobs").iterdir()
        return job


def _shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's directory that every xdist worker sees (each worker's basetemp is a folder in it)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-runs"


def isolated_cli(root: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python -m nemotron ARGS` in a home of its own under `root` (NEMOTRON_HOME=root/home, its cache, root as the
    working directory; no env file or user steps, as the `home` fixture sets a test's environment), without touching
    this process's environment: safe on a thread, or from a session fixture."""
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "COLUMNS": "200", **SharedRun.env_of(root / "home")}
    for name in ("NEMOTRON_ENV_FILE", "NEMOTRON_STEPS_PATH"):
        env.pop(name, None)
    return subprocess.run(
        nemotron_argv(*args), capture_output=True, text=True, env=env, cwd=root, timeout=timeout
    )


cli_in = _helper_fixture(isolated_cli)


def shared_cli_run(tmp_path_factory: pytest.TempPathFactory, *args: str, timeout: float = 600) -> SharedRun:
    """`nemotron ARGS` in a fresh home, made once per session across xdist workers: the first caller runs it, a
    later one (in this worker or another) gets the recorded result. The same ARGS are the same run."""
    import hashlib

    from filelock import FileLock

    root = _shared_root(tmp_path_factory)
    root.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256("\0".join(args).encode()).hexdigest()[:16]
    where, result = root / key, root / f"{key}.json"
    with FileLock(str(root / f"{key}.lock")):
        if not result.exists():
            shutil.rmtree(where, ignore_errors=True)  # a caller killed before it wrote the result
            try:
                done = isolated_cli(where, *args, timeout=timeout)
                record = {"code": done.returncode, "out": done.stdout, "err": done.stderr}
            except subprocess.TimeoutExpired:
                record = {
                    "code": 124,
                    "out": "",
                    "err": f"nemotron {' '.join(args)}: no exit within {timeout} s",
                }
            partial = result.with_suffix(".part")
            partial.write_text(json.dumps(record))
            partial.rename(result)
    recorded = json.loads(result.read_text())
    return SharedRun(args, recorded["code"], recorded["out"], recorded["err"], where / "home")


TINY_RL_STEPS = ("rl/reinforce", "rl/ppo", "rl/rlhf", "rl/dpo")


@pytest.fixture(scope="session")
def tiny_rl_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], SharedRun]:
    """step id -> the run of `nemotron steps run STEP -c tiny` for rl/reinforce, rl/ppo, rl/rlhf or rl/dpo, the tiny
    preset as shipped (tests/steps/test_rl_steps.py and test_dpo.py check that it trains): its job dir holds metrics.jsonl, the trained
    policy in outputs/policy (rl/ppo also its critic), checkpoints and TensorBoard events. Made once per session."""

    def run(step_id: str) -> SharedRun:
        assert step_id in TINY_RL_STEPS, step_id
        return shared_cli_run(tmp_path_factory, "steps", "run", step_id, "-c", "tiny")

    return run


# rl/rlhf in brief, validating at every step: every metric name the step logs with the reward model as its judge
BRIEF_RLHF_VALIDATED = ("steps", "run", "rl/rlhf", "-c", "tiny", "grpo.max_num_steps=2",
                        "grpo.num_prompts_per_step=2", "eval.num_prompts=2", "grpo.val_period=1")  # fmt: skip


@pytest.fixture(scope="session")
def brief_rlhf_validated_run(tmp_path_factory: pytest.TempPathFactory) -> SharedRun:
    """The run of `BRIEF_RLHF_VALIDATED data.validation.data_path=pkg://tiny/validation_prompts.jsonl`: two GRPO
    steps, each followed by validation on the tiny validation prompts; its job dir's metrics.jsonl has the val_*
    rows (and every other name rl/rlhf logs). `args[:-1]` is the brief run without the validation prompts."""
    validation = "data.validation.data_path=pkg://tiny/validation_prompts.jsonl"
    return shared_cli_run(tmp_path_factory, *BRIEF_RLHF_VALIDATED, validation)
