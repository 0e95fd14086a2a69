"""The Engine and Executor interfaces: registries instead of if-chains, refusals before anything is written,
and outputs of a remote engine registered (with lineage) once its scheduler says the job succeeded."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Literal, get_args

import pytest
import yaml

from nemotron.artifacts.store import ArtifactStore
from nemotron.engines.base import ENGINES, Launch, engine_named
from nemotron.errors import UserError
from nemotron.launch import remote
from nemotron.launch.executor import EXECUTORS, executor_named
from nemotron.launch.records import RemoteRecord, RemoteState

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "nemotron"
LAUNCH_SHAPES = [shape.__name__ for shape in get_args(Launch)]


def test_every_registered_engine_and_executor_loads() -> None:
    for name in ENGINES:
        assert engine_named(name).name == name
    for kind in EXECUTORS:
        ex = executor_named(kind)
        assert ex.kind == kind
        for method in ("placement", "render", "submit", "refresh", "print_logs", "cancel"):
            assert callable(getattr(ex, method))


def test_unknown_names_get_a_suggestion() -> None:
    with pytest.raises(UserError, match="did you mean 'nemo_rl'"):
        engine_named("nemo-rl")
    with pytest.raises(UserError, match="did you mean 'slurm'"):
        executor_named("slurmm")


# The registries, where asking which engine or executor kind a thing is belongs: the engines' (name -> class, and
# their traits), the executors' (name -> class) and the profiles' (executor -> profile class, and what the centre
# asks of a profile's executor).
REGISTRIES = (
    "config/backends.py",
    "engines/base.py",
    "launch/executor.py",
    "config/profiles.py",
)
# Each executor's own modules place the launch shapes, so they may ask which shape they hold (never compare kind
# names). Which profile class they hold they never ask: each is typed on its own (Executor[SlurmProfile] takes
# Job[SlurmProfile]), and the registry hands it only jobs on that class.
EXECUTOR_MODULES = (
    "launch/local_executor.py",
    "launch/slurm_executor.py",
    "launch/slurm.py",
    "launch/het_slurm.py",
    "launch/ray_slurm.py",
    "launch/containers.py",
    "launch/lepton.py",
    "launch/ray_lepton.py",
)
# "local" is also a Slurm tunnel's word (`tunnel = "local"`): compared with it, the other side must read a kind
AMBIGUOUS_KINDS = {"local"}
KIND_WORDS = ("executor", "backend", "engine", "kind")


def _reads_a_kind(node: ast.AST) -> bool:
    """Whether an expression reads a kind by its name: x.executor, getattr(x, "backend"), x.get("executor"),
    x["backend"], engine_name(...), a variable named kind."""
    names: list[str] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute):
            names.append(sub.attr)
        elif isinstance(sub, ast.Name):
            names.append(sub.id)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            names.append(sub.value)
    return any(word in name for name in names for word in KIND_WORDS)


def shipped_step_ids(root: Path = REPO) -> set[str]:
    """The ids of the steps the repository ships, from their manifests."""
    import tomllib

    ids = set()
    for path in (root / "manifests").rglob("*.toml"):
        step = tomllib.loads(path.read_text()).get("step")
        if isinstance(step, dict) and "id" in step:
            ids.add(step["id"])
    return ids


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are documentation (a module's, class's or function's first statement)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _strings(node: ast.AST) -> list[str]:
    """The string constants `node` compares against: a constant, or a tuple, list or set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [v for e in node.elts for v in _strings(e)]
    return []


def _class_names(node: ast.AST) -> list[str]:
    """The class names an isinstance's second argument names: a name, a.Name, a tuple or an X | Y union."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.Tuple):
        return [n for e in node.elts for n in _class_names(e)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _class_names(node.left) + _class_names(node.right)
    return []


def library_violations(src: Path, step_ids: set[str], kinds: set[str], shapes: set[str]) -> list[str]:
    """Every place in the library (`src`, the package dir) that names a shipped step (a string that is one, or
    its category's prefix, outside documentation and the shipped data) or asks an engine's or an executor's kind
    outside the registries: a comparison (==, !=, in, not in, match) against a registered name, however the kind
    is read (`.executor`, getattr(...), .get(...), a function's answer), or isinstance on a profile or a launch
    shape class."""
    prefixes = {i.split("/")[0] + "/" for i in step_ids if "/" in i}
    found = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if rel.startswith("shipped/"):
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        registry = rel in REGISTRIES
        for node in ast.walk(tree):
            where = f"{rel}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                if node.value in step_ids or node.value in prefixes:
                    found.append(f"{where}: names the shipped step {node.value!r}")
            if registry:
                continue
            if isinstance(node, ast.Compare):
                sides = (node.left, *node.comparators)
                named = [v for side in sides for v in _strings(side) if v in kinds]
                if named and (set(named) - AMBIGUOUS_KINDS or any(_reads_a_kind(x) for x in sides)):
                    found.append(f"{where}: compares with the kind {named[0]!r}")
            elif isinstance(node, ast.MatchValue):
                named = [v for v in _strings(node.value) if v in kinds]
                if named:
                    found.append(f"{where}: matches the kind {named[0]!r}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance"
            ):
                classes = _class_names(node.args[1]) if len(node.args) == 2 else []
                placing = (
                    rel in EXECUTOR_MODULES
                )  # an executor asks which shape it places, never which profile
                asked = [c for c in classes if c.endswith("Profile") or (c in shapes and not placing)]
                if asked:
                    found.append(f"{where}: isinstance on {asked[0]}")
    return found


def _kinds() -> set[str]:
    return set(ENGINES) | set(EXECUTORS)


def test_the_library_names_no_shipped_step_and_asks_no_kind_outside_the_registries() -> None:
    """A user's step gets what a shipped one gets only if the library never names one; a kind checked outside
    the registries is an if-chain a new engine or executor must find and extend."""
    assert library_violations(SRC, shipped_step_ids(), _kinds(), set(LAUNCH_SHAPES)) == []


@pytest.mark.parametrize(
    "line",
    [
        'if step_id == "rl/ppo": pass',
        'if job.step_id in ("sft", "dpo"): pass',
        'ok = step.startswith("rl/")',
        'if profile.executor == "slurm": pass',
        'if getattr(profile, "executor", "local") == "local": pass',
        'if config.get("backend") != "builtin": pass',
        'if engine_name(config) in ("nemo_rl", "nemo_aligner"): pass',
        'local = "lepton" == kind',
        'match kind:\n    case "slurm": pass',
        "ok = isinstance(profile, SlurmProfile)",
        "ok = isinstance(launch, RayDriver | HetJob)",
        "ok = isinstance(p, (profiles.LocalProfile, str))",
    ],
)
def test_the_guard_catches_each_form_put_back(line: str, tmp_path: Path) -> None:
    """Each form the guard forbids, put back into a copy of a module, is caught."""
    (tmp_path / "module.py").write_text(f'"""A module naming rl/ppo in its documentation only."""\n{line}\n')
    assert len(library_violations(tmp_path, shipped_step_ids(), _kinds(), set(LAUNCH_SHAPES))) == 1


# The generic preflight (engines' own rules live in their folders, found through PREFLIGHT_RULES): no engine named in
# its code, comments or documentation. "nemo" is also the word for a NeMo checkpoint's file (.nemo, checkpoint_nemo):
# as an engine it is caught in a string constant, as the other names are anywhere.
CENTRE_WITHOUT_ENGINES = ("compile/preflight.py",)
ENGINE_WORDS = re.compile(r"nemo_rl|nemo_aligner|builtin|built-in|NeMo-RL|NeMo-Aligner|NeMo's")


def engine_names_in(path: Path) -> list[str]:
    """Where `path` names an engine: its name or product in any text, or a string constant equal to an engine's."""
    text = path.read_text()
    found = [
        f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()}"
        for m in ENGINE_WORDS.finditer(text)
    ]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ENGINES:
            found.append(f"{path.name}:{node.lineno}: {node.value!r}")
    return found


@pytest.mark.parametrize("module", CENTRE_WITHOUT_ENGINES)
def test_the_centres_preflight_names_no_engine(module: str, tmp_path: Path) -> None:
    assert engine_names_in(SRC / module) == []
    for line in ('_GROUPS = {"nemo": None}', "# NeMo-RL's rule", "def _nemo_aligner_groups() -> None: ..."):
        copy = tmp_path / Path(module).name
        copy.write_text((SRC / module).read_text() + line + "\n")
        assert len(engine_names_in(copy)) == 1, line


def test_an_executor_may_ask_its_launch_shape_but_not_its_profile(tmp_path: Path) -> None:
    """An executor's module places shapes (isinstance on them is its job); a profile assert put back is caught."""
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch/slurm.py").write_text(
        "ok = isinstance(launch, HetJob)\nassert isinstance(p, SlurmProfile)\n"
    )
    found = library_violations(tmp_path, shipped_step_ids(), _kinds(), set(LAUNCH_SHAPES))
    assert found == ["launch/slurm.py:2: isinstance on SlurmProfile"]


class Ended(RemoteRecord):
    """A job record whose scheduler says the job ended in `answer` (a record's answers, nothing else)."""

    shape: Literal["process"] = "process"
    answer: str

    def state(self) -> RemoteState:
        return RemoteState(self.answer)

    def exit_code(self) -> int | None:
        return None

    def log_reader(self, job_dir: Path, role: str | None = None) -> remote.LogTail:
        return remote.LogTail(lambda: [])

    def cancel(self) -> None:
        raise AssertionError("not cancelled here")


def ended_in(state: str) -> remote.Reader:
    """Read a job's record from its status.json as a job that ended in `state`."""
    return lambda status, job_dir: Ended.model_validate({**status, "answer": state})


def _remote_job(home: Path, policy_input: Path, output: Path) -> Path:
    """A job record as `create_job_dir` writes it, for a run whose engine registers nothing itself."""
    job_dir = home / "jobs" / "rl-ppo-20260101-000000-abcd"
    job_dir.mkdir(parents=True)
    record = {
        "job_id": job_dir.name,
        "step": "rl/ppo",
        "preset": "default",
        "config_hash": "c0ffee",
        "executor": "slurm",
        "created_at": "2026-01-01T00:00:00+00:00",
        "mode": "batch",
        "config": {},
        "launch": "#!/bin/bash\n",
        "profile": {},
        "inputs": [
            {
                "name": "policy",
                "kind": "path",
                "path": str(policy_input),
                "artifact_id": None,
                "ref": str(policy_input),
                "actual_type": "checkpoint_hf",
                "expected_type": "checkpoint_hf",
            }
        ],
        "outputs": {"policy": {"artifact": "ppo_policy", "type": "checkpoint_hf"}},
    }
    (job_dir / "job.yaml").write_text(yaml.safe_dump(record))
    status = {
        "state": "running",
        "handle": "h",
        "remote_id": "7",
        "submitted_at": "2026-01-01T00:00:00+00:00",
        "register": {"policy": str(output)},
    }
    (job_dir / "status.json").write_text(json.dumps(status))
    return job_dir


def _model_dir(path: Path, text: str) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "gpt2", "note": text}))
    (path / "model.safetensors").write_bytes(text.encode())
    return path


def test_a_remote_run_that_succeeded_registers_its_outputs_with_lineage(home: Path, tmp_path: Path) -> None:
    sft = _model_dir(tmp_path / "sft", "sft")
    out = _model_dir(tmp_path / "run" / "outputs" / "policy", "aligned")
    job_dir = _remote_job(home, sft, out)

    status = remote.refresh_status(job_dir, ended_in("succeeded"))

    assert (
        status["state"] == "succeeded"
        and status["exit_code"] == 0
        and status["registered"] == ["ppo_policy:v1"]
    )
    store = ArtifactStore(home / "artifacts")
    art = store.resolve("ppo_policy")
    assert Path(art.path) == out and art.type == "checkpoint_hf"
    ((edge, parent),) = store.parents(art.id)
    assert edge == "policy" and Path(parent.path) == sft
    assert remote.refresh_status(job_dir, ended_in("succeeded"))["registered"] == [
        "ppo_policy:v1"
    ]  # once only
    assert [a.ref for a in store.list_artifacts(name="ppo_policy")] == ["ppo_policy:v1"]


def test_a_run_that_ended_without_its_outputs_fails_and_registers_nothing(home: Path, tmp_path: Path) -> None:
    job_dir = _remote_job(home, _model_dir(tmp_path / "sft", "sft"), tmp_path / "never-written")

    status = remote.refresh_status(job_dir, ended_in("succeeded"))

    assert status["state"] == "failed" and status["exit_code"] == 1 and "never-written" in status["error"]
    assert (
        not ArtifactStore(home / "artifacts").exists()
        or not ArtifactStore(home / "artifacts").list_artifacts()
    )


def test_a_failed_run_registers_nothing(home: Path, tmp_path: Path) -> None:
    out = _model_dir(tmp_path / "out", "half-trained")
    job_dir = _remote_job(home, _model_dir(tmp_path / "sft", "sft"), out)

    assert remote.refresh_status(job_dir, ended_in("failed"))["state"] == "failed"
    assert (
        not ArtifactStore(home / "artifacts").exists()
        or not ArtifactStore(home / "artifacts").list_artifacts()
    )


def test_outputs_the_run_registered_on_the_cluster_are_recorded_not_registered_twice(
    home: Path, tmp_path: Path
) -> None:
    from nemotron.artifacts.lineage import main as register_main

    sft = _model_dir(tmp_path / "sft", "sft")
    out = _model_dir(tmp_path / "run" / "outputs" / "policy", "aligned")
    job_dir = _remote_job(home, sft, out)
    assert (
        register_main(["--job-dir", str(job_dir), f"policy={out}"]) == 0
    )  # what the driver script runs last
    assert register_main(["--job-dir", str(job_dir), f"policy={out}"]) == 0  # again: nothing twice

    status = remote.refresh_status(job_dir, ended_in("succeeded"))

    assert status["state"] == "succeeded" and status["registered"] == ["ppo_policy:v1"]
    assert [a.ref for a in ArtifactStore(home / "artifacts").list_artifacts(name="ppo_policy")] == [
        "ppo_policy:v1"
    ]


def test_outputs_on_storage_this_machine_cannot_see_are_not_called_missing(
    home: Path, tmp_path: Path
) -> None:
    job_dir = _remote_job(
        home, _model_dir(tmp_path / "sft", "sft"), Path("/lustre/nowhere/jobs/x/outputs/policy")
    )

    status = remote.refresh_status(job_dir, ended_in("succeeded"))

    assert status["state"] == "succeeded" and "does not see" in status["registration"]
