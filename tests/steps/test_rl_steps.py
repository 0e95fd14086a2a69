"""The tiny presets are the CI smoke tests: each RL step really trains on CPU from the shipped tiny artifacts.

Training is judged by outcomes: the reward over the last quarter of steps beats the first quarter, the
ground-truth score (VADER) rises too, every trainable tensor moved, and the reference policy did not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from safetensors.torch import load_file

from nemotron.core.paths import shipped_root

SFT = shipped_root() / "tiny" / "sft_policy"
COMMON = [
    "rewards",
    "init_policy_kl",
    "actor_loss",
    "advantages_mean",
    "response_lengths",
    "fraction_of_samples_properly_ended",
    "grad_norm",
    "lr",
    "generate",
    "logprobs",
    "train",
]
EXTRA = {
    "rl/reinforce": ["rewards_with_kl", "baseline"],
    "rl/ppo": ["rewards_with_kl", "critic_loss", "values_mean", "returns_mean", "clipfrac", "explained_var"],
    "rl/rlhf": ["clipfrac", "kl_loss"],
}


def _metrics(job_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]


def _evals(job_dir: Path) -> dict[str, Any]:
    return {k: v for m in _metrics(job_dir) for k, v in m.items() if k.startswith("eval_")}


@pytest.mark.slow
@pytest.mark.parametrize(
    "step_id",
    [pytest.param("rl/reinforce", marks=pytest.mark.smoke), "rl/ppo", "rl/rlhf"],  # smoke: kept by --quick
)
def test_tiny_preset_trains_and_raises_reward_and_ground_truth(
    step_id: str, tiny_rl_run: Any, home: Path, run_cli: Any
) -> None:
    r = tiny_rl_run(step_id)  # `steps run STEP -c tiny`, made once: test_metric_names.py reads it too
    assert r.code == 0, r.err[-3000:]
    job_dir = r.job_dir
    rows = _metrics(job_dir)
    steps = [m for m in rows if "rewards" in m]
    for key in COMMON + EXTRA[step_id]:
        assert all(key in m for m in steps), f"metric {key} missing"
    q = max(1, len(steps) // 4)
    first = sum(m["rewards"] for m in steps[:q]) / q
    last = sum(m["rewards"] for m in steps[-q:]) / q
    assert last > first + 0.5, (
        f"{step_id}: reward did not rise: first quarter {first:.3f}, last quarter {last:.3f}"
    )
    evals = {k: v for m in rows for k, v in m.items() if k.startswith("eval_") or k == "reference_drift"}
    assert evals["eval_rm_after"] > evals["eval_rm_before"] + 0.5
    assert evals["eval_gt_after"] > evals["eval_gt_before"] + 0.05, f"ground truth did not rise: {evals}"
    assert evals["reference_drift"] == 0.0
    assert steps[0]["init_policy_kl"] < 1e-3  # the first rollout comes from the reference weights themselves

    out = load_file(str(job_dir / "outputs" / "policy" / "model.safetensors"))
    start = load_file(str(SFT / "model.safetensors"))
    unchanged = [k for k in start if k in out and bool((out[k] == start[k]).all())]
    assert not unchanged, f"tensors that never moved: {unchanged}"
    assert list((job_dir / "tensorboard").glob("events.out.tfevents.*")), "no TensorBoard events"
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(job_dir / "outputs" / "policy", use_safetensors=True)
    shown = json.loads(run_cli("jobs", "show", job_dir.name, "--json", env=r.env).out)
    assert shown["state"] == "succeeded" and shown["produced"]


@pytest.mark.slow
def test_kl_penalty_keeps_the_output_well_formed(tiny_rl_run: Any, home: Path, run_cli: Any) -> None:
    """Without the KL penalty the policy hacks the reward model with word salad; with it, it keeps the grammar.
    With it is the tiny preset as shipped (its penalty is 0.05), the run test_tiny_preset_... checks as well."""
    shipped = tiny_rl_run("rl/reinforce")
    assert shipped.code == 0, shipped.err[-2000:]
    config = yaml.safe_load((shipped.job_dir / "config.yaml").read_text())  # the config the job ran with
    assert config["reinforce"]["initial_policy_kl_penalty"] == 0.05
    r = run_cli(
        "steps", "run", "rl/reinforce", "-c", "tiny", "reinforce.initial_policy_kl_penalty=0.0", timeout=600
    )
    assert r.code == 0, r.err[-2000:]
    (job,) = (home / "jobs").iterdir()
    with_kl, without = _evals(shipped.job_dir), _evals(job)
    assert without["eval_rm_after"] > without["eval_rm_before"]  # both optimise the reward model...
    assert (
        with_kl["eval_well_formed_after"] > without["eval_well_formed_after"] + 0.2
    )  # ...only one keeps the grammar


@pytest.mark.slow
def test_rlhf_validates_every_val_period_steps_on_the_validation_prompts(
    brief_rlhf_validated_run: Any, home: Path, run_cli: Any, tmp_path: Path
) -> None:
    """grpo.val_period and data.validation act on the built-in engine (they were accepted and ignored)."""
    done = brief_rlhf_validated_run  # two steps, val_period=1, the tiny validation prompts; made once
    assert done.args[-1] == "data.validation.data_path=pkg://tiny/validation_prompts.jsonl"
    brief = done.args[:-1]
    assert done.code == 0, done.err[-3000:]
    rows = _metrics(done.job_dir)
    validated = [r["step"] for r in rows if "val_rm" in r]
    assert validated == [1, 2] and all(0 <= r["val_well_formed"] <= 1 for r in rows if "val_rm" in r)
    # the validation prompts are read: a broken one is exit 2 naming its file and line, before any training
    bad = tmp_path / "val.jsonl"
    bad.write_text('{"prompt": "the movie was"}\n{"prompt": \n')
    broken = run_cli(*brief, f"data.validation.data_path={bad}", timeout=600)
    assert broken.code == 2 and f"{bad}:2" in broken.err and "Traceback" not in broken.err


def test_nemo_gym_is_refused_on_the_built_in_engine(home: Path, run_cli: Any) -> None:
    done = run_cli("steps", "run", "rl/rlhf", "-c", "tiny", "env.should_use_nemo_gym=true", "--dry-run")
    assert done.code == 2 and "env.should_use_nemo_gym acts only with backend=nemo_rl" in done.err
