"""Every training step runs on any Hugging Face causal LM: tiny random Llama, Qwen2 and Mistral checkpoints in HF
layout (the Mistral one sharded, with an index), built from configs with the shipped tokenizer.

Each step runs a few steps through the real CLI and must register an output of the right transformers class whose
weights moved; the reward-rising tests live in test_rl_steps.py (GPT-2) and test_llama_training below.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from nemotron.models.checkpoint import load_tokenizer, save_checkpoint
from nemotron.models.layout import weight_files
from nemotron.models.reward import build_reward_model
from nemotron.models.tiny import build_policy
from nemotron.paths import shipped_root

TINY = shipped_root() / "tiny"
FAMILIES = ("llama", "qwen2", "mistral")
CLASSES = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}
# Two steps each, small batches, no before/after evaluation: these test loading, training and saving.
SHORT = {
    "sft": ["trainer.max_steps=2", "trainer.log_interval=1"],
    "rm/train": ["trainer.max_steps=2", "trainer.log_interval=1"],
    # RLOO leaves responses without an end out of every baseline, and a random model almost never samples EOS
    # (1 token in 476): a stop string that random text soon contains ends responses instead.
    "rl/reinforce": [
        "trainer.max_steps=2",
        "trainer.num_prompts_per_step=4",
        "eval.num_prompts=0",
        "checkpoint.save_interval=0",
        "reward.source=in_process",
        "generation.stop_strings=[e]",
    ],
    "rl/ppo": [
        "trainer.max_steps=2",
        "trainer.num_prompts_per_step=4",
        "eval.num_prompts=0",
        "ppo.critic_warmup_steps=0",
        "checkpoint.save_interval=0",
        "reward.source=in_process",
    ],
    "rl/rlhf": [
        "grpo.max_num_steps=2",
        "grpo.num_prompts_per_step=4",
        "eval.num_prompts=0",
        "checkpoint.save_interval=0",
    ],
}


@pytest.fixture(scope="module")
def family_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """family -> (policy dir, reward-model dir), random weights, the shipped tokenizer; Mistral's in shards."""
    root = tmp_path_factory.mktemp("families")
    tokenizer = load_tokenizer(TINY / "sft_policy")
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    out = {}
    for family in FAMILIES:
        size = dict(n_layer=2, n_embd=64, n_head=4, n_positions=64)
        policy = build_policy(len(tokenizer), **size, seed=1, family=family, **ids)
        rm = build_reward_model(len(tokenizer), **size, seed=2, family=family, **ids)
        shard = "60KB" if family == "mistral" else "5GB"
        out[family] = (
            save_checkpoint(policy, root / family / "policy", tokenizer, max_shard_size=shard),
            save_checkpoint(rm, root / family / "reward_model", tokenizer, max_shard_size=shard),
        )
    return out


def test_the_mistral_checkpoints_are_really_sharded(family_models: dict[str, tuple[Path, Path]]) -> None:
    policy, rm = family_models["mistral"]
    assert len(weight_files(policy)) > 1 and (policy / "model.safetensors.index.json").is_file()
    assert len(weight_files(rm)) > 1
    assert len(weight_files(family_models["llama"][0])) == 1


def _inputs(step_id: str, policy: Path, rm: Path) -> list[str]:
    return {
        "sft": [f"inputs.init_from={policy}"],
        "rm/train": [f"inputs.init_from={policy}"],
        "rl/reinforce": [f"inputs.policy={policy}", f"inputs.reward_model={rm}"],
        "rl/ppo": [f"inputs.policy={policy}", f"inputs.reward_model={rm}"],
        "rl/rlhf": [
            f"policy.model_name={policy}",
            f"env.nemo_gym.genrm_model.responses_api_models.vllm_model.model={rm}",
        ],
    }[step_id]


def _run(run_cli: Any, home: Path, step_id: str, *args: str) -> Path:
    before = set((home / "jobs").iterdir()) if (home / "jobs").exists() else set()
    r = run_cli("steps", "run", step_id, "-c", "tiny", *args, timeout=600)
    assert r.code == 0, r.err[-3000:]
    (job_dir,) = set((home / "jobs").iterdir()) - before
    return job_dir


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("step_id", ["sft", "rm/train", "rl/reinforce", "rl/ppo", "rl/rlhf"])
def test_every_step_trains_every_family(
    step_id: str, family: str, family_models: dict[str, tuple[Path, Path]], home: Path, run_cli: Any
) -> None:
    policy, rm = family_models[family]
    job_dir = _run(run_cli, home, step_id, *_inputs(step_id, policy, rm), *SHORT[step_id])

    output = "reward_model" if step_id == "rm/train" else "policy"
    out_dir = job_dir / "outputs" / output
    config = json.loads((out_dir / "config.json").read_text())
    suffix = "ForSequenceClassification" if step_id == "rm/train" else "ForCausalLM"
    assert config["architectures"] == [CLASSES[family] + suffix]
    assert config["model_type"] == family
    start = _weights(policy)
    after = _weights(out_dir)
    shared = [k for k in after if k in start and after[k].shape == start[k].shape]
    assert shared, "no weights in common with the starting policy"
    assert any(not bool((after[k] == start[k]).all()) for k in shared), "no starting weight moved"
    if family == "mistral":  # the output is written in shards like its input (same max size as transformers')
        assert weight_files(out_dir)
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in rows if "grad_norm" in m]
    assert len(trained) == 2
    assert all(math.isfinite(m["grad_norm"]) and m["peak_memory_mb"] > 10 for m in trained)
    if step_id == "rl/ppo":
        critic = json.loads((job_dir / "outputs" / "critic" / "config.json").read_text())
        assert critic["architectures"] == [CLASSES[family] + "ForTokenClassification"]
    shown = json.loads(run_cli("jobs", "show", job_dir.name, "--json").out)
    assert shown["state"] == "succeeded" and shown["produced"]


def _weights(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for file in weight_files(path):
        out.update(load_file(str(file)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "runtime", "saved_dtype"),
    [
        ("llama", ["runtime.precision=bf16"], "BF16"),
        ("qwen2", ["runtime.precision=bf16-mixed", "runtime.gradient_checkpointing=true"], "F32"),
    ],
)
def test_bf16_and_bf16_mixed_train_on_the_cpu(
    family: str,
    runtime: list[str],
    saved_dtype: str,
    family_models: dict[str, tuple[Path, Path]],
    home: Path,
    run_cli: Any,
) -> None:
    """bf16 keeps weights (and so the saved policy) in bfloat16; bf16-mixed keeps fp32 masters and saves fp32."""
    from nemotron.models.layout import safetensors_dtypes

    policy, rm = family_models[family]
    job_dir = _run(run_cli, home, "rl/ppo", *_inputs("rl/ppo", policy, rm), *SHORT["rl/ppo"], *runtime)
    out_dir = job_dir / "outputs" / "policy"
    assert set(safetensors_dtypes(weight_files(out_dir)[0]).values()) == {saved_dtype}
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(
        math.isfinite(m["actor_loss"]) and math.isfinite(m["critic_loss"]) for m in rows if "actor_loss" in m
    )
    start, after = _weights(policy), _weights(out_dir)
    assert any(not bool((after[k].float() == start[k].float()).all()) for k in after if k in start)


@pytest.mark.slow
def test_a_llama_ppo_run_resumes_exactly(
    family_models: dict[str, tuple[Path, Path]], home: Path, run_cli: Any
) -> None:
    """Policy, critic (a LlamaForTokenClassification), both optimizers and the sampler restored: steps 3-4 of a run
    resumed from step 2 log the same metrics as an uninterrupted 4-step run."""
    policy, rm = family_models["llama"]
    args = [*_inputs("rl/ppo", policy, rm), *SHORT["rl/ppo"], "checkpoint.save_interval=2"]
    timers = {"time", "generate", "reward", "logprobs", "train", "step_time", "peak_memory_mb"}

    def steps(job_dir: Path) -> dict[int, dict[str, float]]:
        rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: {k: v for k, v in r.items() if k not in timers} for r in rows if "grad_norm" in r}

    full = steps(_run(run_cli, home, "rl/ppo", *args, "trainer.max_steps=4"))
    first = _run(run_cli, home, "rl/ppo", *args, "trainer.max_steps=2")
    resumed = steps(
        _run(run_cli, home, "rl/ppo", *args, "trainer.max_steps=4", f"checkpoint.resume_from={first.name}")
    )
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        for key, value in full[step].items():
            assert resumed[step][key] == pytest.approx(value, rel=1e-5, abs=1e-6), f"step {step} {key}"


@pytest.mark.slow
def test_conversation_prompts_train_through_the_chat_template(
    family_models: dict[str, tuple[Path, Path]], home: Path, run_cli: Any, tmp_path: Path
) -> None:
    """A Qwen2 checkpoint whose tokenizer has a chat template, and prompts given as conversations."""
    import shutil

    from nemotron.data.jsonl import read_jsonl
    from nemotron.data.records import PromptRecord

    policy, rm = family_models["qwen2"]
    chat = tmp_path / "qwen2-chat"
    shutil.copytree(policy, chat)
    config_file = chat / "tokenizer_config.json"
    tokenizer_config = json.loads(config_file.read_text())
    tokenizer_config["chat_template"] = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    config_file.write_text(json.dumps(tokenizer_config))
    prompts = tmp_path / "chat_prompts.jsonl"
    texts = [r.prompt for r in read_jsonl(TINY / "prompts.jsonl", PromptRecord)][:16]
    prompts.write_text("".join(
        json.dumps({"prompt": [{"role": "system", "content": "review"}, {"role": "user", "content": t}]}) + "\n"
        for t in texts
    ))  # fmt: skip
    job_dir = _run(run_cli, home, "rl/reinforce", f"inputs.policy={chat}", f"inputs.reward_model={rm}",
                   f"inputs.prompts={prompts}", *SHORT["rl/reinforce"])  # fmt: skip
    assert (job_dir / "outputs" / "policy" / "config.json").is_file()

    # The same prompts with the plain shipped tokenizer (no template): exit 2, one line, nothing trained.
    r = run_cli("steps", "run", "rl/reinforce", "-c", "tiny", f"inputs.policy={policy}", f"inputs.reward_model={rm}",
                f"inputs.prompts={prompts}", *SHORT["rl/reinforce"], timeout=600)  # fmt: skip
    assert r.code == 2 and "has no chat template" in r.err and "Traceback" not in r.err, r.err[-2000:]
