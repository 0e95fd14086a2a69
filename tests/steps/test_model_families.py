"""Every training step runs on any Hugging Face causal LM: tiny random Llama, Qwen2 and Mistral checkpoints in HF
layout (the Mistral one sharded, with an index), built from configs with the shipped tokenizer.

`test_every_step_trains_every_family` runs each step two steps through the real CLI: it must register an output of the
right transformers class whose weights moved. That is loading and saving, not learning; learning is
`test_rl_raises_the_reward_on_other_families` (Llama on rl/reinforce and rl/ppo, Qwen2 on rl/rlhf, each policy first
fine-tuned by the real sft step, as the tiny pipeline does) and, on GPT-2, test_rl_steps.py and test_pipeline.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file
from tests.processes import run_to_exit_0

from nemotron.core.paths import shipped_root
from nemotron.models.checkpoint import load_tokenizer, save_checkpoint
from nemotron.models.layout import weight_files
from nemotron.models.reward import build_reward_model
from nemotron.models.tiny import build_policy

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


# Every step on every family, but rl/ppo on Llama: test_a_llama_ppo_run_resumes_exactly's two-step run is that run
# (with a checkpoint at its end) and makes the same checks on it.
EVERY = [(s, f) for s in ["sft", "rm/train", "rl/reinforce", "rl/ppo", "rl/rlhf"] for f in FAMILIES]
EVERY.remove(("rl/ppo", "llama"))


@pytest.mark.slow
@pytest.mark.parametrize(("step_id", "family"), EVERY, ids=[f"{s}-{f}" for s, f in EVERY])
def test_every_step_trains_every_family(
    step_id: str, family: str, family_models: dict[str, tuple[Path, Path]], home: Path, run_cli: Any
) -> None:
    policy, rm = family_models[family]
    job_dir = _run(run_cli, home, step_id, *_inputs(step_id, policy, rm), *SHORT[step_id])
    _trained_and_saved(step_id, family, policy, job_dir, run_cli)


def _trained_and_saved(step_id: str, family: str, policy: Path, job_dir: Path, run_cli: Any) -> None:
    """A two-step run of `step_id` from the `family` checkpoint at `policy` registered an output of the right
    transformers class whose weights moved, logging two finite gradient norms."""
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
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in rows if "grad_norm" in m]
    assert len(trained) == 2
    assert all(math.isfinite(m["grad_norm"]) for m in trained)
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


# ----------------------------------------------------------------------------- learning on other families

SFT_STEPS = 80  # val_loss falls from ln(476) = 6.2 to about 2.1 (the grammar's entropy is about 1.8)
# Short RL runs from the fine-tuned policy, judged by the shipped tiny reward model; the learning rates are higher
# than the tiny presets' so that 15-20 steps move the reward model's score by well over the margin asserted.
LEARN = {
    "rl/reinforce": ["trainer.max_steps=15", "reward.source=in_process"],
    "rl/ppo": [
        "trainer.max_steps=20",
        "trainer.num_prompts_per_step=16",
        "optim.lr=2e-3",
        "reward.source=in_process",
    ],
    "rl/rlhf": ["grpo.max_num_steps=20", "policy.optimizer.lr=1e-3"],
}


@pytest.fixture(scope="module")
def sft_policy(
    family_models: dict[str, tuple[Path, Path]], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Path]:
    """family -> its random policy after SFT_STEPS steps of the real sft step on the tiny SFT data, run once per
    family in this module (in its own home: `home` is per test)."""
    done: dict[str, Path] = {}

    def fine_tuned(family: str) -> Path:
        if family in done:
            return done[family]
        root = tmp_path_factory.mktemp(f"sft-{family}")
        env = {k: v for k, v in os.environ.items() if k not in ("NEMOTRON_ENV_FILE", "NEMOTRON_STEPS_PATH")}
        env.update(NEMOTRON_HOME=str(root / "home"), NEMOTRON_CACHE_DIR=str(root / "cache"))
        argv = ["steps", "run", "sft", "-c", "tiny", f"inputs.init_from={family_models[family][0]}",
                f"trainer.max_steps={SFT_STEPS}", f"trainer.log_interval={SFT_STEPS}"]  # fmt: skip
        run_to_exit_0([sys.executable, "-m", "nemotron", *argv], env, root, timeout=600)
        (job_dir,) = (root / "home" / "jobs").iterdir()
        rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
        (val_loss,) = [m["val_loss"] for m in rows if "val_loss" in m]
        assert val_loss < 2.6, f"{family}: sft did not learn the tiny task (held-out loss {val_loss:.3f})"
        done[family] = job_dir / "outputs" / "policy"
        return done[family]

    return fine_tuned


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "step_id"),
    [
        # one worker fine-tunes the Llama policy once for both of its runs (CI runs `-n 2 --dist loadgroup`)
        pytest.param("llama", "rl/reinforce", marks=pytest.mark.xdist_group("llama_sft")),
        pytest.param("llama", "rl/ppo", marks=pytest.mark.xdist_group("llama_sft")),
        ("qwen2", "rl/rlhf"),
    ],
)
def test_rl_raises_the_reward_on_other_families(
    family: str, step_id: str, sft_policy: Callable[[str], Path], home: Path, run_cli: Any
) -> None:
    """The reward model's score of the policy's answers to the same 32 prompts with the same sampling seed
    (eval_rm_before / eval_rm_after) rises by more than 0.5, and so does the training reward from the first
    quarter of the steps to the last: a policy-gradient sign flip lowers both."""
    policy = sft_policy(family)
    given = f"policy.model_name={policy}" if step_id == "rl/rlhf" else f"inputs.policy={policy}"
    job_dir = _run(
        run_cli, home, step_id, given, *LEARN[step_id], "eval.num_prompts=32", "checkpoint.save_interval=0"
    )
    config = json.loads((job_dir / "outputs" / "policy" / "config.json").read_text())
    assert config["architectures"] == [CLASSES[family] + "ForCausalLM"]
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    evals = {k: v for m in rows for k, v in m.items() if k.startswith("eval_rm_")}
    assert evals["eval_rm_after"] > evals["eval_rm_before"] + 0.5, f"{family} {step_id}: {evals}"
    rewards = [m["rewards"] for m in rows if "rewards" in m]
    q = len(rewards) // 4
    first, last = sum(rewards[:q]) / q, sum(rewards[-q:]) / q
    assert last > first + 0.5, (
        f"{family} {step_id}: reward first quarter {first:.3f}, last quarter {last:.3f}"
    )


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
    # the two-step run test_every_step_trains_every_family would make for rl/ppo on Llama, checkpoint aside
    _trained_and_saved("rl/ppo", "llama", policy, first, run_cli)
    resumed = steps(
        _run(run_cli, home, "rl/ppo", *args, "trainer.max_steps=4", f"checkpoint.resume_from={first.name}")
    )
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        for key, value in full[step].items():
            assert resumed[step][key] == pytest.approx(value, rel=1e-5, abs=1e-6), f"step {step} {key}"


# A template unlike the plain-text prompt (`role: content` turns, then " =>"), so raw text cannot pass for it.
CHAT_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
FIRST_ROLLOUT = re.compile(r"first rollout, as the policy reads it: prompt (.+) \((\d+) tokens\), response ")


@pytest.mark.slow
def test_conversation_prompts_train_through_the_chat_template(
    family_models: dict[str, tuple[Path, Path]], home: Path, run_cli: Any, tmp_path: Path
) -> None:
    """A Qwen2 checkpoint whose tokenizer has a chat template, and prompts given as conversations: the prompt of the
    first rollout the step trained on (its log shows row 0's tokens, padding dropped) is the template's rendering of
    one of the conversations, token for token in number and text."""
    import ast
    import shutil

    from nemotron.data.jsonl import read_jsonl
    from nemotron.data.records import PromptRecord

    policy, rm = family_models["qwen2"]
    chat = tmp_path / "qwen2-chat"
    shutil.copytree(policy, chat)
    config_file = chat / "tokenizer_config.json"
    tokenizer_config = json.loads(config_file.read_text())
    tokenizer_config["chat_template"] = CHAT_TEMPLATE
    config_file.write_text(json.dumps(tokenizer_config))
    prompts = tmp_path / "chat_prompts.jsonl"
    texts = [r.prompt for r in read_jsonl(TINY / "prompts.jsonl", PromptRecord)][:16]
    conversations = [[{"role": "system", "content": "review"}, {"role": "user", "content": t}] for t in texts]
    prompts.write_text("".join(json.dumps({"prompt": c}) + "\n" for c in conversations))
    job_dir = _run(run_cli, home, "rl/reinforce", f"inputs.policy={chat}", f"inputs.reward_model={rm}",
                   f"inputs.prompts={prompts}", *SHORT["rl/reinforce"])  # fmt: skip

    tokenizer = load_tokenizer(chat)
    rendered = [
        tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in conversations
    ]
    expected = {
        tokenizer.decode(ids): len(ids) for ids in tokenizer(rendered, add_special_tokens=False)["input_ids"]
    }
    (shown,) = FIRST_ROLLOUT.findall((job_dir / "logs" / "step.log").read_text())
    prompt, count = ast.literal_eval(shown[0]), int(shown[1])
    assert prompt in expected and count == expected[prompt], (prompt, count, sorted(expected)[:3])

    # The same prompts with the plain shipped tokenizer (no template): exit 2, one line, nothing trained.
    r = run_cli("steps", "run", "rl/reinforce", "-c", "tiny", f"inputs.policy={policy}", f"inputs.reward_model={rm}",
                f"inputs.prompts={prompts}", *SHORT["rl/reinforce"], timeout=600)  # fmt: skip
    assert r.code == 2 and "has no chat template" in r.err and "Traceback" not in r.err, r.err[-2000:]
