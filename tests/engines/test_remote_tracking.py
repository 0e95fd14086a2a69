"""tracking.* on backend=nemo_rl and backend=nemo_aligner: the keys we emit are keys the pinned engines declare
(NeMo-RL v0.7.0's logger TypedDicts; NeMo's exp_manager dataclasses, through Hydra's own override code on the
tag's YAML), what each cannot honour is refused, and what we pass as variables is what the real MLflow and W&B
clients read."""

from __future__ import annotations

import ast
import inspect
import json
import os
import shlex
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
from tests.engines import nemo_aligner_v070 as al_tag
from tests.engines import nemo_rl_rules as rules
from tests.engines import nemo_rl_v070 as rl_tag
from tests.engines import test_nemo_rl_config as rl  # its step configs
from tests.engines.mirrors import git_show

from nemotron.engines.nemo_aligner.config import compile_aligner
from nemotron.engines.nemo_aligner.scripts import Env
from nemotron.engines.remote_tracking import RunLabels
from nemotron.errors import UserError
from nemotron.plan.placement import Placement
from nemotron.tracking.wandb_tracker import run_id

LABELS = RunLabels("rl-ppo-20261127-0100-ab12", "rl/ppo", "default")
ON = {
    "tracking.mlflow.enabled": True,
    "tracking.mlflow.experiment": "team-rl",
    "tracking.mlflow.tags": {"team": "alignment"},
    "tracking.wandb.enabled": True,
    "tracking.wandb.project": "rl",
    "tracking.wandb.entity": "nv-team",
    "tracking.wandb.mode": "offline",
    "tracking.wandb.tags": ["baseline"],
    "tracking.retries": 5,
}


def _nemo_rl(step_id: str, labels: RunLabels | None = LABELS, **over: Any) -> Any:
    cfg = rl.step_model(step_id, **{k.replace(".", "__"): v for k, v in (ON | over).items()})
    return rl.compile_run(step_id, cfg, Placement("/jobs/j1", 2, 8), labels=labels)


def _aligner(step_id: str, labels: RunLabels | None = LABELS, **over: Any) -> Any:
    inputs = {
        "inputs.policy": "/m/sft.nemo",
        "inputs.prompts": "/d/p.jsonl",
        "inputs.reward_model": "/m/rm.nemo",
    }
    given = inputs | ON | over | {"backend": "nemo_aligner"}
    cfg = rl.step_model(step_id, **{k.replace(".", "__"): v for k, v in given.items()})
    return compile_aligner(step_id, cfg, Placement("/jobs/j1", 3, 8), labels=labels)


def _driver_env(driver: str) -> dict[str, str]:
    """The NAME=value words the driver command sets before `uv run`."""
    words = shlex.split(driver.split(" && ", 1)[1])
    return dict(w.split("=", 1) for w in words[: words.index("uv")])


# ---- NeMo-RL ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("step_id", ["rl/rlhf", "rl/reinforce", "rl/ppo"])
def test_nemo_rl_gets_only_logger_keys_its_typeddicts_declare(step_id: str) -> None:
    logger = _nemo_rl(step_id).config["logger"]
    assert logger["mlflow_enabled"] is True and logger["wandb_enabled"] is True
    undeclared = [k for k in logger if k not in rl_tag.LOGGER_KEYS["LoggerConfig"]]
    for section, typed in rl_tag.LOGGER_SECTIONS.items():
        undeclared += [
            f"{section}.{k}" for k in logger.get(section, {}) if k not in rl_tag.LOGGER_KEYS[typed]
        ]
    assert undeclared == []
    assert logger["wandb"] == {"project": "rl", "name": LABELS.job_id, "entity": "nv-team"}


def test_nemo_rl_logger_keys_match_the_tag() -> None:
    if not rl_tag.MIRROR.exists():
        pytest.skip("no NeMo-RL mirror on this machine; the data-encoded test above still ran")
    module = ast.parse(rules.show("nemo_rl/utils/logger.py"))
    typed = {
        node.name: node
        for node in module.body
        if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") == "TypedDict" for b in node.bases)
    }
    fields = {
        name: {
            s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
        }
        for name, node in typed.items()
    }
    assert {k: fields.get(k) for k in rl_tag.LOGGER_KEYS} == rl_tag.LOGGER_KEYS
    annotations = {
        s.target.id: ast.unparse(s.annotation)
        for s in typed["LoggerConfig"].body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    }
    for section, name in rl_tag.LOGGER_SECTIONS.items():
        assert annotations[section] in (name, f"NotRequired[{name}]"), section


def test_tracking_survives_nemo_rl_s_loader_over_the_base() -> None:
    """The base YAML's own logger (a localhost MLflow server, a W&B run name of its own) must not leak through."""
    merged = rl.loaded(_nemo_rl("rl/rlhf"))["logger"]
    assert merged["mlflow"]["tracking_uri"] is None  # so MLflowLogger reads $MLFLOW_TRACKING_URI
    assert merged["mlflow"]["run_name"] == LABELS.job_id and merged["mlflow"]["experiment_name"] == "team-rl"
    assert merged["wandb"]["name"] == LABELS.job_id
    off = rl.loaded(rl.compiled("rl/rlhf"))["logger"]  # tracking left alone: both off whatever the base says
    assert off["mlflow_enabled"] is False and off["wandb_enabled"] is False


def test_nemo_rl_refusals_come_at_once() -> None:
    with pytest.raises(UserError) as e:
        _nemo_rl("rl/ppo", labels=None, **{"tracking.wandb.tags": ["a,b"], "tracking.mlflow.enabled": False})
    text = e.value.render()
    assert "tracking.retries=5" in text and "tracking.wandb.tags=['a,b']" in text
    with pytest.raises(UserError, match=r"tracking\.retries=5"):
        _nemo_rl("rl/ppo", **{"tracking.mlflow.enabled": False})
    named = _nemo_rl("rl/ppo", labels=None, **{"tracking.mlflow.tracking_uri": "http://mlflow:5000"})
    assert named.config["logger"]["mlflow"]["tracking_uri"] == "http://mlflow:5000"
    assert named.config["logger"]["mlflow"]["run_name"] == "j1"  # the job dir's name, without labels


# What NeMo-RL v0.7.0 does with the logger section in its driver (nemo_rl/utils/logger.py: MLflowLogger.__init__,
# WandbLogger.__init__), with the real mlflow and wandb; NeMo-RL itself needs GPUs and cannot be installed here.
NEMO_RL_LOGGERS = textwrap.dedent(
    """
    import json, os, sys
    import mlflow, wandb
    cfg = json.load(open(sys.argv[1]))
    m = cfg["mlflow"]
    tracking_uri = m.get("tracking_uri") or os.getenv("MLFLOW_TRACKING_URI")
    if tracking_uri and not mlflow.is_tracking_uri_set():
        mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(m.get("experiment_name"))
    run = mlflow.start_run(run_name=m.get("run_name"))
    mlflow.end_run()
    w = wandb.init(**cfg["wandb"], dir=sys.argv[2])
    out = {"mlflow_run": run.info.run_id, "wandb": {"tags": list(w.tags), "project": w.project, "name": w.name,
           "offline": w.offline, "entity": w.settings.entity, "id": w.id,
           "resume": w.settings.resume}}
    w.finish()
    print(json.dumps(out))
    """
)


def test_the_driver_variables_are_what_mlflow_and_wandb_read(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    run = _nemo_rl("rl/ppo")
    env = _driver_env(run.driver)
    assert env["WANDB_MODE"] == "offline" and env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "5"
    (tmp_path / "logger.json").write_text(json.dumps(run.config["logger"]))
    (tmp_path / "loggers.py").write_text(NEMO_RL_LOGGERS)
    (tmp_path / "wandb").mkdir()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assigns = run.driver.split(" && ", 1)[1].split(" uv run ", 1)[0]  # the driver's own words
    script = f"{assigns} {shlex.quote(sys.executable)} loggers.py logger.json wandb"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    proc = subprocess.run(
        ["sh", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**clean, "MLFLOW_TRACKING_URI": uri, "HOME": str(tmp_path), "WANDB_SILENT": "true"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    logged = MlflowClient(uri).get_run(out["mlflow_run"])
    assert logged.info.run_name == LABELS.job_id
    tags = logged.data.tags
    assert tags["team"] == "alignment" and tags["nemotron.job_id"] == LABELS.job_id
    assert tags["nemotron.step"] == "rl/ppo" and tags["nemotron.preset"] == "default"
    assert out["wandb"] == {
        "tags": ["baseline", "rl/ppo", "default"],
        "project": "rl",
        "name": LABELS.job_id,
        "offline": True,
        "entity": "nv-team",
        # one run per job: the engine's run is the one our tracker and `jobs sync` open (wandb_tracker.run_id)
        "id": run_id(LABELS.job_id),
        "resume": "allow",
    }
    assert list(
        (tmp_path / "wandb" / "wandb").glob("offline-run-*")
    )  # under the dir NeMo-RL hands wandb.init


# ---- NeMo-Aligner ----------------------------------------------------------------------------------------------


def _apply_to_the_tags_yaml(yaml_name: str, words: list[str]) -> Any:
    """The actor's YAML at the tag, in struct mode as Hydra composes it, with our words applied by Hydra's own
    override code (a key the YAML lacks fails unless prefixed)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    text = git_show(al_tag.MIRROR, al_tag.TAG, f"{al_tag.CONF}/{yaml_name}")
    config = OmegaConf.create(text)
    OmegaConf.set_struct(config, True)
    overrides = OverridesParser.create().parse_overrides(words)
    ConfigLoaderImpl._apply_overrides_to_config(overrides, config)
    return config


@pytest.mark.skipif(
    not (al_tag.MIRROR.is_dir() and al_tag.NEMO_MIRROR.is_dir()), reason="no NeMo-Aligner / NeMo mirror here"
)
@pytest.mark.parametrize("step_id", ["rl/reinforce", "rl/ppo"])
def test_the_actor_s_exp_manager_overrides_fit_the_tag_and_nemo_s_dataclasses(
    step_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from omegaconf import OmegaConf

    actor = _aligner(step_id).groups[-1]
    assert actor.role == "actor"
    plain = [k for k, _ in actor.overrides if k.startswith("exp_manager.") and not k.startswith("+")]
    assert [k for k in plain if k not in al_tag.KEYS[actor.yaml]] == []
    config = _apply_to_the_tags_yaml(actor.yaml, actor.words())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    # the loggers' nodes alone: the rest of the YAML interpolates NeMo's own resolvers
    em = {
        k: OmegaConf.to_container(config.exp_manager[k], resolve=True)
        for k in al_tag.EXP_MANAGER_FIELDS - {"create_mlflow_logger", "create_wandb_logger"}
    }
    em |= {k: config.exp_manager[k] for k in ("create_mlflow_logger", "create_wandb_logger")}
    assert em["create_mlflow_logger"] is True and em["create_wandb_logger"] is True
    assert em["mlflow_logger_kwargs"]["tracking_uri"] == "http://mlflow:5000"  # read on the node
    assert em["mlflow_logger_kwargs"]["tags"]["nemotron.job_id"] == LABELS.job_id
    assert set(em["wandb_logger_kwargs"]) <= al_tag.WANDB_INIT_KWARGS
    import wandb  # Lightning hands what it does not name itself to wandb.init

    assert al_tag.WANDB_INIT_KWARGS <= set(inspect.signature(wandb.init).parameters)
    assert em["wandb_logger_kwargs"]["tags"] == ["baseline", LABELS.step, "default"]
    # one run per job: Lightning's WandbLogger(id=...) opens the run our tracker and `jobs sync` open
    assert em["wandb_logger_kwargs"]["id"] == run_id(LABELS.job_id)
    for nemo in al_tag.NEMO_TAGS:
        source = git_show(al_tag.NEMO_MIRROR, nemo, "nemo/utils/exp_manager.py")
        module = ast.parse(source)
        (cls,) = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "ExpManagerConfig"]
        fields = {
            s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
        }
        assert al_tag.EXP_MANAGER_FIELDS <= fields, nemo
        # run_name is NeMo's own argument: a kwarg of that name would be given twice (hence the refusal)
        assert "MLFlowLogger(run_name=version, **mlflow_kwargs)" in source, nemo
        # MLFlowParams itself (its module imports only dataclasses and typing): OmegaConf checks our kwargs
        # against it as exp_manager's structured merge does
        module_name = f"nemo_mlflow_logger_{nemo.replace('.', '_')}"
        loaded = types.ModuleType(module_name)  # a module of its own, so OmegaConf can read its type hints
        monkeypatch.setitem(sys.modules, module_name, loaded)
        exec(git_show(al_tag.NEMO_MIRROR, nemo, "nemo/utils/loggers/mlflow_logger.py"), loaded.__dict__)
        params = loaded.MLFlowParams
        assert set(params.__dataclass_fields__) == al_tag.MLFLOW_PARAMS, nemo
        merged = OmegaConf.merge(OmegaConf.structured(params), em["mlflow_logger_kwargs"])
        assert merged.experiment_name == "team-rl"


def test_the_actor_alone_gets_the_loggers_and_their_variables() -> None:
    run = _aligner("rl/ppo")
    *servers, actor = run.groups
    assert all(not any("logger" in k for k, _ in s.overrides) for s in servers)
    assert actor.env["WANDB_MODE"] == "offline" and actor.env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "5"
    unset = dict(_aligner("rl/ppo").groups[-1].overrides)["++exp_manager.mlflow_logger_kwargs.tracking_uri"]
    assert unset == Env("MLFLOW_TRACKING_URI")
    off = _aligner(
        "rl/ppo", **{"tracking.mlflow.enabled": False, "tracking.wandb.enabled": False, "tracking.retries": 3}
    )
    assert not any("logger" in k for k, _ in off.groups[-1].overrides) and off.groups[
        -1
    ].env.keys().isdisjoint({"WANDB_MODE", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"})


def test_nemo_aligner_refusals_come_at_once() -> None:
    with pytest.raises(UserError) as e:
        _aligner(
            "rl/reinforce",
            labels=None,
            **{"tracking.mlflow.run_name": "mine", "tracking.mlflow.tags": {"a b": "x", "ok": "y"}},
        )
    text = e.value.render()
    for key in (
        "tracking.mlflow.run_name='mine'",
        "tracking.mlflow.tags=",
    ):
        assert key in text
    assert "['a b']" in text and "'ok'" not in text.split("tracking.mlflow.tags=")[1].split("are not")[1]


# ---- credentials -----------------------------------------------------------------------------------------------

SECRETS = {
    "WANDB_API_KEY": "wandb-FAKE-0123456789abcdef",
    "MLFLOW_TRACKING_TOKEN": "mlflow-token-FAKE-42424242",
    "MLFLOW_TRACKING_PASSWORD": "mlflow-pw-FAKE-31337",
}


@pytest.mark.parametrize("backend", ["nemo_rl", "nemo_aligner"])
def test_tracker_credentials_in_the_profile_never_show(home: Path, tmp_path: Path, backend: str) -> None:
    env_vars = ", ".join(f"{k} = '{v}'" for k, v in SECRETS.items())
    (tmp_path / "env.toml").write_text(
        "[tracked]\nextends = 'slurm_rlhf'\n"
        f"env_vars = {{ {env_vars}, MLFLOW_TRACKING_URI = 'http://mlflow.internal:5000' }}\n"
    )
    args = ["steps", "run", "rl/ppo", "-c", backend, "-b", "tracked"] if backend == "nemo_aligner" else []
    args = args or ["steps", "run", "rl/ppo", "-c", "default", "-b", "tracked", f"backend={backend}"]
    args += ["tracking.mlflow.enabled=true", "tracking.wandb.enabled=true", "--dry-run"]
    proc = subprocess.run(
        [sys.executable, "-m", "nemotron", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    shown = proc.stdout + proc.stderr
    assert [k for k, v in SECRETS.items() if v in shown] == []
    assert "http://mlflow.internal:5000" in shown  # a plain variable is shown, so the check above is real
    assert all(
        name in shown for name in SECRETS
    )  # named (sourced from the job's 0600 secrets file), not shown
    assert (
        ("logger.mlflow" in shown or "mlflow_enabled: true" in shown)
        if backend == "nemo_rl"
        else ("++exp_manager.create_mlflow_logger=true" in shown)
    )


def test_mlflow_without_a_server_anywhere_is_exit_2_before_anything_is_written(
    home: Path, tmp_path: Path
) -> None:
    args = ["steps", "run", "rl/ppo", "-c", "default", "-b", "slurm_rlhf", "backend=nemo_rl"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    proc = subprocess.run(
        [sys.executable, "-m", "nemotron", *args, "tracking.mlflow.enabled=true", "--dry-run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**clean, "COLUMNS": "200"},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "no tracking server is named for the job" in proc.stderr and "Traceback" not in proc.stderr
    assert not (home / "jobs").exists() or not any((home / "jobs").iterdir())
