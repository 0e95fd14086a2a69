"""The NeMo-RL v0.7.0 compiler, checked against what the tag reads (tests/engines/nemo_rl_v070.py), not ourselves."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from tests.engines import nemo_rl_v070 as tag
from tests.engines.mirrors import git_files
from tests.engines.nemo_rl_rules import has, keys_read_on, load_config, reads, show, walks

from nemotron.catalog import Catalog
from nemotron.config.configtree import flatten, unflatten
from nemotron.engines.nemo_rl.config import NemoRLRun, compile_run
from nemotron.engines.refusals import builtin_refusals
from nemotron.errors import UserError
from nemotron.plan.placement import Placement

JOB = "/jobs/run 1/$(touch pwned)"
JUDGE = "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model"
INPUTS = {
    "rl/rlhf": {
        "policy.model_name": "/models/sft",
        "data.train.data_path": "/data/train prompts.jsonl",
        JUDGE: "/models/rm",
    },
    # micro-batches that split each step's responses over the policy's 8 data-parallel ranks (the schema defaults'
    # 16 would leave each rank fewer rows than one micro-batch: nemotron.engines.nemo_rl.batches)
    "rl/reinforce": {
        "inputs.policy": "/models/sft",
        "inputs.prompts": "/data/train prompts.jsonl",
        "inputs.reward_model": "/models/rm",
        "trainer.micro_batch_size": 4,
    },
    "rl/ppo": {
        "inputs.policy": "/models/sft",
        "inputs.prompts": "/data/train prompts.jsonl",
        "inputs.reward_model": "/models/rm",
        "trainer.micro_batch_size": 2,
    },
}
GYM = {
    "env.should_use_nemo_gym": True,
    "judge.kind": "generative",
    "judge.mode": "pairwise",
    JUDGE: "nvidia/GenRM",
}
COMBOS = [
    (step, env, backend)
    for step, env in (
        ("rl/rlhf", "reward_model"),
        ("rl/rlhf", "nemo_gym"),
        ("rl/reinforce", "reward_model"),
        ("rl/ppo", "reward_model"),
    )
    for backend in ("dtensor", "megatron")
]


def step_config(step_id: str, **overrides: Any) -> dict[str, Any]:
    """A validated config as compile.py hands it over: schema defaults, inputs as resolved paths, overrides."""
    tree = Catalog().get(step_id).config_schema()().model_dump(mode="json")
    flat = (
        dict(flatten(tree))
        | {"backend": "nemo_rl"}
        | INPUTS[step_id]
        | {k.replace("__", "."): v for k, v in overrides.items()}
    )
    return unflatten(flat)


def step_model(step_id: str, **overrides: Any) -> BaseModel:
    """`step_config` as compile hands it to an engine: validated by the step's schema (`Job.step_model`)."""
    return Catalog().get(step_id).config_schema().model_validate(step_config(step_id, **overrides))


def compiled(
    step_id: str,
    env: str = "reward_model",
    backend: str = "dtensor",
    *,
    nodes: int | None = None,
    overrides: dict[str, Any] | None = None,
) -> NemoRLRun:
    """On two nodes of 8 GPUs: the policy trains on one (8 data-parallel ranks), the reward model's workers or
    NeMo-Gym's judge (tests/engines/test_nemo_rl_judge.py) have the other."""
    nodes = nodes or 2
    extra = dict(GYM) if env == "nemo_gym" else {}
    extra["nemo_rl.policy_backend"] = backend
    cfg = step_model(step_id, **{k.replace(".", "__"): v for k, v in (extra | (overrides or {})).items()})
    return compile_run(step_id, cfg, Placement(JOB, nodes, 8))


def loaded(run: NemoRLRun) -> dict[str, Any]:
    """The run's config as NeMo-RL would load it over the base keys we encoded (tag.BASE_KEYS)."""
    parent = run.config["defaults"]
    alg = "ppo" if parent.endswith(tag.BASES["ppo"]) else "grpo"
    assert parent == f"/opt/nemo-rl/{tag.BASES[alg]}"
    return load_config(run.config, {parent: unflatten(tag.BASE_KEYS[alg])})


# ---- the compiled configs carry what the tag reads ------------------------------------------------------------


@pytest.mark.parametrize(("step_id", "env", "backend"), COMBOS)
def test_every_key_the_tag_reads_is_present(step_id: str, env: str, backend: str) -> None:
    run = compiled(step_id, env, backend)
    assert run.entry in tag.ENTRIES
    alg = "ppo" if step_id == "rl/ppo" else "grpo"
    cfg = loaded(run)
    missing = [(k, f"{f}:{n}") for k, f, n in tag.REQUIRED[f"{alg}+{env}"] if not has(cfg, k)]
    assert missing == []
    assert set(cfg["loss_fn"]) <= tag.LOSS_FIELDS
    assert cfg["loss_fn"]["reference_policy_kl_type"] in tag.KL_TYPES
    if alg == "ppo":
        assert set(cfg["value_loss_fn"]) == tag.VALUE_LOSS_FIELDS


@pytest.mark.parametrize(("step_id", "env", "backend"), COMBOS)
def test_user_data_survives_the_loader_and_no_base_dataset_leaks(
    step_id: str, env: str, backend: str
) -> None:
    cfg = loaded(compiled(step_id, env, backend))
    assert cfg["data"]["train"] == {"data_path": "/data/train prompts.jsonl"}
    assert "math" not in cfg["env"]
    assert "OpenMathInstruct-2" not in str(cfg) and "DAPOMath17K" not in str(cfg)
    assert "_override_" not in str(cfg)
    env_name = cfg["data"]["default"]["env_name"]
    if env == "nemo_gym":
        assert env_name == "nemo_gym" and cfg["env"]["should_use_nemo_gym"] is True
    else:
        assert env_name == "reward_model" and cfg["data"]["default"]["input_key"] == "prompt"


def test_the_loader_rule_would_leak_without_override() -> None:
    # The defect of the old compiler: extending the base without `_override_` keeps its dataset_name.
    base = unflatten(tag.BASE_KEYS["grpo"])
    merged = load_config({"defaults": "b", "data": {"train": {"data_path": "/x.jsonl"}}}, {"b": base})
    assert merged["data"]["train"] == {"dataset_name": "OpenMathInstruct-2", "data_path": "/x.jsonl"}


@pytest.mark.parametrize(("step_id", "env", "backend"), COMBOS)
def test_lengths_are_consistent(step_id: str, env: str, backend: str) -> None:
    run = compiled(step_id, env, backend, overrides={"nemo_rl.max_prompt_tokens": 300})
    pol = run.config["policy"]
    gen = pol["generation"]
    total = pol["max_total_sequence_length"]
    assert total == 300 + gen["max_new_tokens"]
    assert gen["vllm_cfg"]["max_model_len"] == total
    if env == "reward_model":
        assert run.config["data"]["max_input_seq_length"] == 300
        assert run.config["env"]["reward_model"]["max_model_len"] == total


@pytest.mark.parametrize(
    ("backend", "enabled", "tp_key"),
    [
        ("dtensor", "dtensor_cfg", "tensor_parallel_size"),
        ("megatron", "megatron_cfg", "tensor_model_parallel_size"),
    ],
)
def test_policy_backend_selects_dtensor_or_megatron(backend: str, enabled: str, tp_key: str) -> None:
    pol = compiled("rl/rlhf", backend=backend, overrides={"nemo_rl.tensor_parallel_size": 2}).config["policy"]
    other = "megatron_cfg" if enabled == "dtensor_cfg" else "dtensor_cfg"
    assert pol[enabled]["enabled"] is True and pol[other]["enabled"] is False
    assert pol[enabled][tp_key] == 2 and pol["make_sequence_length_divisible_by"] == 2
    assert (pol["optimizer"] is None) == (backend == "megatron")


def test_nemo_gym_path_meets_the_async_engine_assertion() -> None:
    run = compiled("rl/rlhf", "nemo_gym")
    vllm = run.config["policy"]["generation"]["vllm_cfg"]
    assert vllm["async_engine"] is True and vllm["expose_http_server"] is True  # grpo.py:1709, 1717
    assert run.config["grpo"]["max_val_samples"] is None  # run_grpo_nemo_gym.py:170
    assert run.entry == "examples/nemo_gym/run_grpo_nemo_gym.py"
    genrm = run.config["env"]["nemo_gym"]["genrm_compare_resources_server"]["resources_servers"][
        "genrm_compare"
    ]
    assert genrm["num_rollouts_per_prompt"] == run.config["grpo"]["num_generations_per_prompt"]
    assert (
        run.config["env"]["nemo_gym"]["genrm_model"]["responses_api_models"]["genrm_model"]["model"]
        == "nvidia/GenRM"
    )


# ---- hand-checked values --------------------------------------------------------------------------------------


def test_reinforce_is_rloo_with_no_ratio() -> None:
    cfg = compiled(
        "rl/reinforce",
        overrides={
            "reinforce.initial_policy_kl_penalty": 0.05,
            "reinforce.kl_estimator": "k2",
            "trainer.num_prompts_per_step": 8,
        },
    ).config
    assert cfg["grpo"]["use_leave_one_out_baseline"] is True and cfg["grpo"]["normalize_rewards"] is False
    assert cfg["grpo"]["adv_estimator"] == {
        "name": "grpo",
        "normalize_rewards": False,
        "use_leave_one_out_baseline": True,
    }
    assert cfg["loss_fn"]["disable_ppo_ratio"] is True and cfg["loss_fn"]["use_kl_in_reward"] is False
    assert (
        cfg["loss_fn"]["reference_policy_kl_penalty"] == 0.05
        and cfg["loss_fn"]["reference_policy_kl_type"] == "k2"
    )
    assert cfg["grpo"]["num_generations_per_prompt"] == 4
    assert cfg["policy"]["train_global_batch_size"] == 8 * 4  # every response of a step in one update


def test_ppo_critic_starts_from_the_reward_model() -> None:
    # one node: the reward model takes a GPU of the policy's, which leaves 7 data-parallel ranks (14 responses a step)
    cfg = compiled(
        "rl/ppo",
        nodes=1,
        overrides={"ppo.dual_clip": 3.0, "critic.loss_clip_val": 0.5, "ppo.critic_warmup_steps": 2,
                   "trainer.num_prompts_per_step": 14},
    ).config  # fmt: skip
    assert cfg["value"]["model_name"] == "/models/rm"
    assert cfg["value"]["reward_model_cfg"] == {"enabled": True, "reward_model_type": "regression"}
    assert cfg["value"]["sequence_packing"]["enabled"] is False  # ppo.py:266
    assert cfg["ppo"]["adv_estimator"]["name"] == "gae" and cfg["ppo"]["adv_estimator"]["gae_lambda"] == 0.95
    assert cfg["loss_fn"]["ratio_clip_c"] == 3.0 and cfg["loss_fn"]["use_kl_in_reward"] is True
    assert cfg["value_loss_fn"] == {"scale": 1.0, "cliprange": 0.5}
    assert cfg["ppo"]["policy_training_start_step"] == 2
    assert (
        cfg["ppo"]["reward_shaping"]["enabled"] is False and cfg["ppo"]["reward_scaling"]["enabled"] is False
    )
    # 8 GPUs on one node: the reward model takes 1, the policy cluster the other 7
    assert cfg["cluster"] == {"num_nodes": 1, "gpus_per_node": 7}


@pytest.mark.parametrize(("nodes", "rm_gpus", "cluster"), [
    (1, 1, (1, 7)), (1, 4, (1, 4)), (2, 1, (1, 8)), (3, 4, (2, 8)),
])  # fmt: skip
def test_ppos_cluster_is_the_policys_colocated_share(
    nodes: int, rm_gpus: int, cluster: tuple[int, int]
) -> None:
    """ppo.setup leaves the reward model's GPUs in the cluster (see compile_ppo): the compiled cluster is the share
    GRPO's setup gives the policy: the reward model's GPUs of one node, or its node of several (336 prompts a step
    split evenly over each cluster's ranks)."""
    overrides = {"nemo_rl.reward_model_gpus": rm_gpus, "trainer.num_prompts_per_step": 336,
                 "trainer.micro_batch_size": 1}  # fmt: skip
    cfg = compiled("rl/ppo", nodes=nodes, overrides=overrides).config
    assert (cfg["cluster"]["num_nodes"], cfg["cluster"]["gpus_per_node"]) == cluster
    assert cfg["env"]["reward_model"]["resources"] == {"num_nodes": 1, "gpus_per_node": rm_gpus}


@pytest.mark.parametrize("backend", ["dtensor", "megatron"])
def test_precision_and_activation_checkpointing_reach_policy_and_value(backend: str) -> None:
    """NeMo-RL loads fp32 master weights and computes in policy.precision (automodel/setup.py, megatron/setup.py):
    bf16-mixed is its "bfloat16", fp32 its "float32"; gradient checkpointing is the enabled backend's
    activation_checkpointing."""
    mixed = compiled("rl/ppo", backend=backend, overrides={"runtime.precision": "bf16-mixed",
                                                           "runtime.gradient_checkpointing": True}).config  # fmt: skip
    full = compiled("rl/ppo", backend=backend, overrides={"runtime.precision": "fp32"}).config
    section = "megatron_cfg" if backend == "megatron" else "dtensor_cfg"
    for part in ("policy", "value"):
        assert mixed[part]["precision"] == "bfloat16" and full[part]["precision"] == "float32"
        assert mixed[part][section]["activation_checkpointing"] is True
        assert full[part][section]["activation_checkpointing"] is False


def test_rlhf_stop_strings_warmup_and_kl_reach_nemo_rl() -> None:
    # one node: the reward model's GPU comes out of the policy's, 7 data-parallel ranks (28 x 8 = 2 x 7 x 16 responses)
    cfg = compiled(
        "rl/rlhf",
        nodes=1,
        overrides={"policy.generation.stop_strings": ["\n\n"], "policy.optimizer.warmup_steps": 10,
                   "grpo.num_prompts_per_step": 28},
    ).config  # fmt: skip
    assert cfg["policy"]["generation"]["stop_strings"] == ["\n\n"]
    assert cfg["loss_fn"]["reference_policy_kl_type"] == "k3"
    warm, _, milestones = cfg["policy"]["scheduler"]
    assert warm["kwargs"] == {"start_factor": 0.1, "end_factor": 1.0, "total_iters": 9} and milestones == {
        "milestones": [9]
    }
    assert cfg["env"]["reward_model"]["resources"] == {"num_nodes": 1, "gpus_per_node": 1}
    assert cfg["cluster"] == {
        "num_nodes": 1,
        "gpus_per_node": 8,
    }  # grpo.py:566 subtracts the reward model's GPU


def test_shell_words_are_quoted_and_outputs_are_under_the_job() -> None:
    run = compiled("rl/ppo")
    words = shlex.split(run.driver)
    assert words[:3] == ["cd", "/opt/nemo-rl", "&&"] and words[-1] == f"{JOB}/nemo_rl_config.yaml"
    assert run.outputs == {"policy": f"{JOB}/outputs/policy", "critic": f"{JOB}/outputs/critic"}
    assert shlex.quote(f"{JOB}/outputs/critic") in run.finalize and "convert_dcp_to_hf.py" in run.finalize
    assert yaml.safe_load(run.files["nemo_rl_config.yaml"]) == run.config
    assert "--megatron-ckpt-path" in compiled("rl/rlhf", backend="megatron").finalize


def test_finalize_picks_the_newest_step(tmp_path: Path) -> None:
    job = tmp_path / "a b"
    for name in ("step_2", "step_10", "tmp_step_11", "step_x"):
        (job / "checkpoints" / "nemo_rl" / name).mkdir(parents=True)
    run = compile_run("rl/rlhf", step_model("rl/rlhf"), Placement(str(job), 2, 8))
    script = run.finalize.split(" && uv run")[0].replace("cd /opt/nemo-rl && ", "") + ' && echo "$step"'
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout.strip()
    assert out == f"{job}/checkpoints/nemo_rl/step_10"


# ---- refusals -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step_id", "key"),
    [
        ("rl/rlhf", "loss_fn.kl_estimator"),
        ("rl/reinforce", "reinforce.kl_estimator"),
        ("rl/ppo", "ppo.kl_estimator"),
    ],
)
def test_abs_kl_is_refused(step_id: str, key: str) -> None:
    with pytest.raises(UserError) as err:
        compiled(step_id, overrides={key: "abs"})
    assert any(p.startswith(f"{key}='abs'") and "k1/k2/k3" in p for p in err.value.problems)


def test_all_refusals_come_in_one_error() -> None:
    with pytest.raises(UserError) as err:
        compiled(
            "rl/reinforce",
            overrides={
                "reinforce.kl_estimator": "abs",
                "reinforce.reinforce_epochs": 2,
                "runtime.device": "cpu",
            },
        )
    keys = [p.split("=")[0] for p in err.value.problems]
    assert keys == [
        "runtime.device",
        "reinforce.reinforce_epochs",
        "reinforce.kl_estimator",
    ]


@pytest.mark.parametrize(
    ("step_id", "env", "overrides", "key"),
    [
        ("rl/rlhf", "reward_model", {"judge.kind": "generative"}, "judge.kind"),
        ("rl/rlhf", "nemo_gym", {"judge.mode": "pointwise"}, "judge.mode"),
        ("rl/rlhf", "nemo_gym", {"policy.generation.stop_strings": ["x"]}, "policy.generation.stop_strings"),
        ("rl/rlhf", "reward_model", {"grpo.std_floor": 0.1}, "grpo.std_floor"),
        ("rl/ppo", "reward_model", {"ppo.entropy_bonus": 0.01}, "ppo.entropy_bonus"),
        ("rl/ppo", "reward_model", {"nemo_rl.context_parallel_size": 2}, "nemo_rl.context_parallel_size"),
        (
            "rl/reinforce",
            "reward_model",
            {"nemo_rl.pipeline_parallel_size": 2},
            "nemo_rl.pipeline_parallel_size",
        ),
        ("rl/reinforce", "reward_model", {"reward.server.url": "http://rm:8000"}, "reward.server.url"),
        ("rl/reinforce", "reward_model", {"reinforce.kl_in": "reward_per_token"}, "reinforce.kl_in"),
        ("rl/reinforce", "reward_model", {"nemo_rl.reward_model_gpus": 8}, "nemo_rl.reward_model_gpus"),
        ("rl/reinforce", "reward_model", {"inputs.prompts": None}, "inputs.prompts"),
        ("rl/ppo", "reward_model", {"runtime.precision": "bf16"}, "runtime.precision"),
        ("rl/reinforce", "reward_model", {"runtime.sharding": "fsdp"}, "runtime.sharding"),
    ],
)
def test_inexpressible_settings_are_refused(
    step_id: str, env: str, overrides: dict[str, Any], key: str
) -> None:
    # the reward model takes GPUs of the policy's node only on one node (on several it has a node of its own)
    one_node = key == "nemo_rl.reward_model_gpus"
    with pytest.raises(UserError) as err:
        compiled(step_id, env, nodes=1 if one_node else None, overrides=overrides)
    assert [p.split("=")[0] for p in err.value.problems] == [key]


def test_nemo_rl_keys_are_refused_on_the_builtin_backend() -> None:
    schema = Catalog().get("rl/ppo").config_schema()

    def refused(**overrides: Any) -> list[str]:
        return builtin_refusals(schema.model_validate(step_config("rl/ppo", **overrides)))

    assert refused(nemo_rl__tensor_parallel_size=2, backend="builtin") == [
        "nemo_rl.tensor_parallel_size=2: only backend=nemo_rl reads it (the built-in backend would ignore it)"
    ]
    assert refused(backend="builtin") == []
    assert refused(nemo_rl__tensor_parallel_size=2) == []
    # a step whose schema has no nemo_rl group has nothing to refuse
    sft = Catalog().get("sft").config_schema()
    assert builtin_refusals(sft()) == []


# ---- docs and the real tag ------------------------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "nemo-rl.md"


@pytest.mark.parametrize("step_id", ["rl/rlhf", "rl/reinforce", "rl/ppo"])
def test_every_schema_key_is_in_the_mapping_table(step_id: str) -> None:
    text = DOC.read_text()
    section = text.split(f"## {step_id}\n")[1].split("\n## ")[0]
    rows = set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.M))
    keys = set(dict(flatten(Catalog().get(step_id).config_schema()().model_dump(mode="json"))))
    assert sorted(keys - rows) == []
    assert sorted(rows - keys) == []


def test_the_source_reading_rules_tell_a_wrong_path() -> None:
    """The rules test_data_matches_the_tag applies to the tag's files, on lines written here: a key is matched by
    its whole chain and its whole dotted path, never by its last part alone."""
    source = """
def setup(master_config, cfg):
    grpo_config = master_config.grpo
    gen = master_config.policy["generation"]
    a = gen["vllm_cfg"]["precision"]
    b = cfg["vllm_cfg"].get(
        "expose"
    )
    c = "env_name" in cfg[key]
    d = grpo_config["seed"]
class C:
    cliprange: float = 0.2
"""
    module = ast.parse(source)
    (precision,) = [c for c in keys_read_on(module, 5) if c[0][-1] == "precision"]
    assert precision == (("policy", "generation", "vllm_cfg", "precision"), True)
    assert reads(precision, "policy.generation.vllm_cfg.precision")
    assert not reads(precision, "policy.generation.precision") and not reads(
        precision, "value.generation.vllm_cfg.precision"
    )
    assert (("vllm_cfg", "expose"), False) in keys_read_on(module, 7)
    assert reads((("vllm_cfg", "expose"), False), "policy.generation.vllm_cfg.expose")
    assert not reads((("vllm_cfg", "expose"), False), "policy.vllm.expose")
    assert (("*", "env_name"), False) in keys_read_on(module, 9)
    assert reads((("*", "env_name"), False), "data.default.env_name")
    assert keys_read_on(module, 10) == [(("grpo", "seed"), True)] and not reads(
        (("grpo", "seed"), True), "ppo.seed"
    )
    assert keys_read_on(module, 12) == [(("cliprange",), False)]
    tree = {"policy": {"generation": {"vllm_cfg": {"precision": None}}}}
    assert walks(tree, "policy.generation.vllm_cfg.precision")
    assert not walks(tree, "policy.generation.precision") and not walks(tree, "policy.vllm_cfg.precision")


def test_data_matches_the_tag() -> None:
    if not tag.MIRROR.exists():
        pytest.skip("no NeMo-RL mirror on this machine; the data-encoded tests above still ran")
    files = git_files(tag.MIRROR, tag.TAG)
    assert tag.ENTRIES | tag.CONVERTERS | set(tag.BASES.values()) <= files
    for alg, base in tag.BASES.items():
        real = dict(flatten(yaml.safe_load(show(base))))
        assert {k: real.get(k, "<absent>") for k in tag.BASE_KEYS[alg]} == tag.BASE_KEYS[alg]
    yamls: dict[str, Any] = {}
    sources: dict[str, ast.Module] = {}
    wrong: list[tuple[str, str]] = []
    for combo, refs in tag.REQUIRED.items():
        alg = combo.split("+")[0]
        for dotted, path, line in refs:
            written = tag.yaml_of(dotted, alg)
            if written not in yamls:
                yamls[written] = yaml.safe_load(show(written))
            if not walks(yamls[written], dotted):
                wrong.append((dotted, f"not in {written}"))
            if path not in sources:
                sources[path] = ast.parse(show(path))
            chains = keys_read_on(sources[path], line)
            if not any(reads(chain, dotted) for chain in chains):
                wrong.append((dotted, f"{path}:{line} reads {chains}"))
    assert wrong == []
    loss = show("nemo_rl/algorithms/loss/loss_functions.py")
    for field in tag.LOSS_FIELDS:
        assert re.search(rf"^    {field}: ", loss, flags=re.M), field
    assert "WORKDIR /opt/nemo-rl" in show("docker/Dockerfile")  # targets.NEMO_RL_DIR
