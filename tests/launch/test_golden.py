"""Golden files: the whole --dry-run text (config, bindings, sbatch/hetjob script or Lepton spec, NeMo-RL config)
for each shipped cluster profile x RL step. Regenerate with NEMOTRON_UPDATE_GOLDENS=1 and review the diff."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from tests.assertions import matches_golden
from tests.launch.checkpoints import reward_model_dir

from nemotron.catalog import Catalog
from nemotron.compile import compile_job
from nemotron.launch import submit

GOLDEN = Path(__file__).parent / "golden"
REPO = Path(__file__).resolve().parents[2]
JOB_ID = "{step}-20250101-120000-abcd"  # fixed: the job id appears in every path of a script
RM = "<REWARD_MODEL>"
MATH = "<REPO>/docs/examples/math_prompts.jsonl"


# rl/ppo's default preset does not fit one Lepton node: each node's reward server shares local rank 0's GPU with
# the actor and critic (the plan refuses it: tests/plan/test_plan_cli.py); with activation checkpointing it does
# rl/rlhf's default judge (NeMo-Gym's GenRM, 8 GPUs) needs a node of its own beside the policy's (refused on one
# node: tests/plan/test_judge_plan.py); one node runs rl/rlhf on NeMo-RL with a reward model judge, whose GPU
# leaves the policy 7 data-parallel ranks: 28 prompts a step (28 x 8 responses split evenly over them, as NeMo-RL
# asserts: nemotron.engines.nemo_rl.batches; the preset's 32 x 8 does not)
RM_JUDGE = (
    "judge.kind=reward_model",
    "env.should_use_nemo_gym=false",
    "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model=/models/rm",
    "grpo.num_prompts_per_step=28",
)
# eight nodes less the GenRM's one: 56 data-parallel ranks, 56 prompts a step
EIGHT_NODES = ("grpo.num_prompts_per_step=56",)
FITS = {("lepton_rl", "rl/ppo"): ("runtime.gradient_checkpointing=true",), ("lepton_rl", "rl/rlhf"): RM_JUDGE}
# tracking on, as a team's cluster runs it (the server named in the config, W&B offline on air-gapped nodes)
TRACKING = (
    "tracking.mlflow.enabled=true",
    "tracking.mlflow.tracking_uri=http://mlflow.internal:5000",
    "tracking.wandb.enabled=true",
    "tracking.wandb.mode=offline",
)
CASES = [
    (profile, step, "default", FITS.get((profile, step), ()))
    for profile in ("local_slurm", "slurm_rlhf", "lepton_rl")
    for step in ("rl/reinforce", "rl/ppo", "rl/rlhf")
] + [
    # rl/rlhf with a served reward-model judge: the heterogeneous job (judge detected from the local dir)
    (
        "local_slurm",
        "rl/rlhf",
        "default",
        (
            "backend=builtin",
            "judge.kind=reward_model",
            "env.should_use_nemo_gym=false",
            f"env.nemo_gym.genrm_model.responses_api_models.vllm_model.model={RM}",
        ),
    ),
    ("slurm_rlhf", "rl/reinforce", "default", ("--force-squash",)),
    # backend=nemo_rl (rl/rlhf's default preset): a Ray head, workers and one driver on 1, 2 and 8 nodes
    ("slurm_1node", "rl/rlhf", "default", RM_JUDGE),
    ("slurm_8nodes", "rl/rlhf", "default", EIGHT_NODES),
    ("lepton_1node", "rl/rlhf", "default", RM_JUDGE),
    ("lepton_8nodes", "rl/rlhf", "default", EIGHT_NODES),
    # the built-in engine's torchrun on 8 Lepton pods, each under the pod watchdog
    ("lepton_8nodes", "rl/reinforce", "default", ()),
    ("slurm_rlhf", "rl/reinforce", "default", ("backend=nemo_rl",)),
    ("slurm_rlhf", "rl/ppo", "default", ("backend=nemo_rl",)),
    (
        "slurm_rlhf",
        "rl/rlhf",
        "default",
        (
            "judge.kind=reward_model",
            "env.should_use_nemo_gym=false",
            "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model=/models/rm",
        ),
    ),
    (
        "slurm_rlhf",
        "rl/rlhf",
        "default",
        ("backend=builtin", "env.should_use_nemo_gym=false", "judge.mode=pointwise"),
    ),
    # async GRPO on NeMo-RL: vLLM on 4 of the policy node's 8 GPUs (colocated.enabled false), training on the rest
    (
        "slurm_rlhf",
        "rl/rlhf",
        "default",
        ("grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true"),
    ),
    # a server step on 2 nodes x 8 tasks: one server per node
    ("slurm_rlhf", "rm/serve", "default", ()),
    # backend=nemo_aligner (the nemo_aligner presets: every checkpoint a .nemo): NeMo-Aligner's own scripts as one
    # hetjob (servers first, the actor last)
    ("local_slurm", "rl/reinforce", "nemo_aligner", ("backend=nemo_aligner",)),
    ("slurm_rlhf", "rl/ppo", "nemo_aligner", ("backend=nemo_aligner",)),
    ("slurm_rlhf", "rm/serve", "nemo_aligner", ("backend=nemo_aligner",)),
    # tracking on the external engines: NeMo-RL's logger keys and the driver's variables; the actor's exp_manager
    ("slurm_rlhf", "rl/ppo", "default", ("backend=nemo_rl", *TRACKING)),
    ("slurm_rlhf", "rl/ppo", "nemo_aligner", ("backend=nemo_aligner", *TRACKING)),
    # sft and rm/train on NeMo-RL (run_sft.py, run_rm.py), their nemo_rl presets: the models RL starts from, fine-tuned
    # on 2 nodes
    ("slurm_rlhf", "sft", "nemo_rl", ("backend=nemo_rl", "inputs.init_from=meta-llama/Llama-3.1-8B")),
    # (an 8B reward model at rm.yaml's 8192 tokens fits only with activation checkpointing)
    (
        "slurm_rlhf",
        "rm/train",
        "nemo_rl",
        (
            "backend=nemo_rl",
            "inputs.init_from=meta-llama/Llama-3.1-8B",
            "runtime.gradient_checkpointing=true",
        ),
    ),
    # ... and on NeMo-Aligner (train_gpt_sft.py, train_reward_model.py), their nemo_aligner presets: the .nemo files its
    # RL steps take
    (
        "slurm_rlhf",
        "sft",
        "nemo_aligner",
        ("backend=nemo_aligner", "inputs.init_from=/models/base.nemo", "optim.min_lr_ratio=1"),
    ),
    (
        "slurm_rlhf",
        "rm/train",
        "nemo_aligner",
        ("backend=nemo_aligner", "inputs.init_from=/models/sft.nemo", "optim.min_lr_ratio=1"),
    ),
    # rl/dpo on NeMo-RL (run_dpo.py, its pairs split into the job dir) and on NeMo-Aligner (train_gpt_dpo.py, its
    # preset: NeMo-Aligner validates after steps only, in batches of the training batch)
    ("slurm_rlhf", "rl/dpo", "default", ("backend=nemo_rl",)),
    ("slurm_rlhf", "rl/dpo", "nemo_aligner", ("backend=nemo_aligner",)),
    # eval/policy on NeMo-RL's own eval entry: the prompts prepared in the job dir, then run_eval.py on the Ray head
    ("slurm_rlhf", "eval/policy", "nemo_rl", ("inputs.policy=/models/policy", f"inputs.prompts={MATH}")),
    # eval/policy on the built-in engine: torchrun ranks sharing the prompt batches, on Slurm and on Lepton
    ("local_slurm", "eval/policy", "default", ("inputs.policy=/models/policy", f"inputs.prompts={MATH}")),
    ("lepton_rl", "eval/policy", "default", ("inputs.policy=/models/policy", f"inputs.prompts={MATH}")),
]
# node counts beyond the shipped templates (slurm_rlhf and lepton_rl have 2 and 1 nodes)
PROFILES = """
[slurm_1node]
extends = "slurm_rlhf"
nodes = 1
[slurm_8nodes]
extends = "slurm_rlhf"
nodes = 8
[lepton_1node]
extends = "lepton_rl"
nodes = 1
[lepton_8nodes]
extends = "lepton_rl"
nodes = 8
"""


def _name(profile: str, step: str, extra: tuple[str, ...]) -> str:
    # backend=nemo_aligner is named by its value: "+backend" already names backend=nemo_rl
    tag = "".join(
        "+nemo_aligner"
        if e == "backend=nemo_aligner"
        else f"+{e.split('=')[0].rsplit('.', 1)[-1].lstrip('-')}"
        for e in extra
        if "model=" not in e
    )
    return f"{profile}__{step.replace('/', '-')}{tag}.txt"


def render(profile: str, step: str, preset: str, extra: tuple[str, ...], home: Path, tmp_path: Path) -> str:
    (tmp_path / "env.toml").write_text(PROFILES)  # the working directory: found by walking up from it
    rm = reward_model_dir(tmp_path / "reward_model", positions=64) if any(RM in e for e in extra) else None
    overrides = [e.replace(RM, str(rm)).replace("<REPO>", str(REPO)) for e in extra if not e.startswith("--")]
    job = compile_job(
        Catalog(),
        step,
        preset,
        overrides,
        profile_name=profile,
        mode="batch",
        force_squash="--force-squash" in extra,
    )
    job = replace(job, job_id=JOB_ID.format(step=step.replace("/", "-")))
    text = submit.dry_run(job)
    for path, name in ((home, "<NEMOTRON_HOME>"), (sys.executable, "<PYTHON>"), (REPO, "<REPO>"), (rm, RM)):
        if path is not None:
            text = text.replace(str(path), name)
    return text


@pytest.mark.parametrize(
    ("profile", "step", "preset", "extra"), CASES, ids=[_name(p, s, e) for p, s, _, e in CASES]
)
def test_dry_run_matches_golden(
    profile: str, step: str, preset: str, extra: tuple[str, ...], home: Path, tmp_path: Path
) -> None:
    text = render(profile, step, preset, extra, home, tmp_path)
    matches_golden(text, GOLDEN / _name(profile, step, extra))


def test_goldens_have_no_unnormalised_paths() -> None:
    """A golden holding this machine's paths would break on any other checkout."""
    leaks = [
        (g.name, p)
        for g in GOLDEN.glob("*.txt")
        for p in (str(REPO), sys.executable, "/tmp/pytest-")
        if p in g.read_text()
    ]
    assert GOLDEN.is_dir() and not leaks
