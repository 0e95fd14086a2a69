"""Shared fixtures: an isolated $NEMOTRON_HOME, a helper that runs the real CLI in a subprocess, the figures the
scripts/ record for the docs, the local Slurm cluster for tests marked `slurm` (tests/slurm and the vLLM
judge's hetjob in tests/vllm), a real PostgreSQL server and a real MLflow tracking server, and the runs made once per
session. The services behind them, and how the suite is handed out to the xdist workers, live in tests/services/."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
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
_scheduling = _load_service("scheduling")
_slurm = _load_service("slurm")
_mlflow = _load_service("mlflow")

# how the suite is handed out to the xdist workers, and --quick (tests/services/scheduling.py)
pytest_addoption = _scheduling.pytest_addoption
pytest_xdist_make_scheduler = _scheduling.pytest_xdist_make_scheduler


def pytest_configure(config: pytest.Config) -> None:
    # A suite started in the background (`cmd &` in a script, nohup) inherits SIGINT ignored, and so would every
    # process it starts (an ignored signal stays ignored across exec): the Ctrl-C tests' SIGINT would do nothing. Here
    # Ctrl-C is Python's KeyboardInterrupt again, so the xdist workers and the CLIs they start get it as a user does.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # $NEMOTRON_TEST_TIMES=DIR records each test's wall and CPU time (scripts/test_durations.py, docs/testing.md)
    _load_service("timing").register(config)
    _scheduling.configure(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    _scheduling.unconfigure(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test in its xdist group, longest first (tests/services/scheduling.py); tests marked `gpu` skipped where
    torch sees no CUDA device, those marked `no_gpu` where it sees one."""
    _scheduling.group_and_order(config, items)
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


# ----------------------------------------------------------------------------- the local Slurm cluster (tests/services/slurm.py)


@pytest.fixture(scope="session")
def slurm_cluster() -> Any:
    """A running local cluster. Left running after the session: the next one starts in < 1 s."""
    reason = _slurm.start_cluster()
    if reason is not None:
        if _slurm.slurm_required():
            pytest.fail(f"Slurm is required (CI=true or NEMOTRON_REQUIRE_SLURM=1) but unavailable: {reason}")
        pytest.skip(f"local Slurm unavailable: {reason}")
    return _slurm.SlurmCluster()


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


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `mlflow server` for the session (SQLite backend and artifacts under a tmp dir, 127.0.0.1, a free
    port): its tracking URI. Tests query it with MlflowClient; each uses its own experiment or job ids."""
    with _mlflow.running_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


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
