"""What both sides of the RL-step benchmark share: the workload, the per-step timings, the models and
prompts they load, and the one reward function both call."""

from __future__ import annotations

import json
import math
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from transformers import (
    AutoModelForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from nemotron.core.paths import shipped_root
from nemotron.data.jsonl import read_jsonl
from nemotron.data.records import PromptRecord
from nemotron.models.checkpoint import load_policy as load_gpt2_policy
from nemotron.models.checkpoint import load_reward_model, load_tokenizer, save_checkpoint
from nemotron.models.tiny import build_policy
from nemotron.models.tokenizer import format_prompt
from nemotron.reward.scorer import scorer_from_reward_model

Algorithm = Literal["rloo", "grpo"]
# The policy's architecture; the reward model is the shipped tiny GPT-2 either way.
ModelFamily = Literal["gpt2", "llama"]
MODEL_FAMILIES: tuple[ModelFamily, ...] = ("gpt2", "llama")
# (prompt texts, completion texts) -> one reward per pair; the signature TRL's reward functions start with.
RewardFn = Callable[[list[str], list[str]], list[float]]


@dataclass(frozen=True)
class Workload:
    """One rollout + update step, identical for our engine and TRL.

    Every response is exactly ``max_new_tokens`` long (ours samples without an EOS id, TRL is given
    ``min_new_tokens``), and one optimizer step covers the whole batch (no micro-batching, one epoch).
    """

    algorithm: Algorithm
    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    lr: float
    kl_coef: float

    @property
    def rows(self) -> int:
        return self.prompts_per_step * self.group_size


@dataclass(frozen=True)
class StepTiming:
    """Wall seconds of one step and its phases; ``train`` is the rest (advantages, loss, backward, optimizer).

    ``cpu`` is the process's CPU seconds over the step: unlike wall time it does not grow while other jobs on
    the machine hold the core, so its ratio is the steadier one on a loaded machine.
    """

    total: float
    cpu: float
    generate: float
    reward: float
    logprobs: float
    prompt_tokens: int
    generated_tokens: int

    @property
    def train(self) -> float:
        return max(0.0, self.total - self.generate - self.reward - self.logprobs)

    @property
    def batch_tokens(self) -> int:
        """Tokens the training forward/backward pass sees: real prompt tokens plus response tokens."""
        return self.prompt_tokens + self.generated_tokens


PHASES = ("total", "cpu", "generate", "logprobs", "reward", "train")


def median_phases(steps: Sequence[StepTiming]) -> dict[str, float]:
    """Median seconds of each phase over ``steps`` (each column on its own)."""
    return {phase: statistics.median(getattr(s, phase) for s in steps) for phase in PHASES}


@dataclass(frozen=True)
class BenchModels:
    """The policy checkpoint every trainer loads (TRL rebuilds its reference from this path), the tokenizer,
    the prompts in the policy's template, and the shared reward."""

    policy_dir: Path
    tokenizer: PreTrainedTokenizerFast
    prompts: list[str]
    reward: RewardFn
    description: str
    family: ModelFamily = "gpt2"

    def load_policy(self) -> PreTrainedModel:
        """A fresh copy of the policy from ``policy_dir``, in eval mode (ours loads it twice: policy and
        reference; TRL once). GPT-2 goes through the steps' own loader, which reads GPT-2 only; other
        families through transformers' loader, from the same local safetensors."""
        if self.family == "gpt2":
            return load_gpt2_policy(self.policy_dir)
        model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
            str(self.policy_dir), local_files_only=True, use_safetensors=True, dtype=torch.float32
        )
        return model  # from_pretrained returns it in eval mode


def tiny_root() -> Path:
    return Path(shipped_root()) / "tiny"


def load_bench_models(
    family: ModelFamily, layers: int | None, width: int, heads: int, positions: int, workdir: Path
) -> BenchModels:
    """The policy every trainer loads, with the shipped tokenizer, prompts and reward.

    GPT-2: the shipped tiny SFT policy (``layers=None``) or a random GPT-2 of the given shape. Llama: a
    random Llama of the given shape (``layers=None``: the shipped policy's shape). Random models are saved
    under ``workdir`` (safetensors, config, tokenizer) so that every trainer loads the same weights from disk.
    """
    tokenizer = load_tokenizer(tiny_root() / "sft_policy")
    prompts = [format_prompt(r.prompt) for r in read_jsonl(tiny_root() / "prompts.jsonl", PromptRecord)]
    reward = shipped_reward()
    if family == "gpt2" and layers is None:
        return BenchModels(tiny_root() / "sft_policy", tokenizer, prompts, reward, "shipped tiny SFT policy")
    assert tokenizer.pad_token_id is not None and isinstance(tokenizer.eos_token_id, int)
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    if layers is None:  # a Llama the shipped policy's shape
        layers, width, heads, positions = shipped_policy_shape()
    # A Llama has the shape of the GPT-2 it stands beside (full multi-head attention, tied embeddings, no
    # dropout or biases); GPT-2's MLP is two width x 4 width matrices and SwiGLU has three, so an inner size of
    # 8/3 x width (rounded up to a multiple of 16) keeps the MLP's parameter count about the same.
    mlp = {} if family == "gpt2" else {"intermediate_size": math.ceil(8 * width / 3 / 16) * 16}
    model = build_policy(len(tokenizer), layers, width, heads, positions, seed=0, family=family, **mlp, **ids)
    description = f"random GPT-2 {layers}x{width}"
    if family == "llama":
        config = model.config
        description = (
            f"random Llama {layers}x{width} ({heads} heads of {config.head_dim}, "
            f"SwiGLU {config.intermediate_size}, tied embeddings)"
        )
    path = save_checkpoint(model, Path(tempfile.mkdtemp(dir=workdir)) / "policy", tokenizer)
    return BenchModels(path, tokenizer, prompts, reward, description, family)


def shipped_policy_shape() -> tuple[int, int, int, int]:
    """(layers, width, heads, positions) of the shipped tiny SFT policy (a GPT-2)."""
    config = json.loads((tiny_root() / "sft_policy" / "config.json").read_text(encoding="utf-8"))
    return config["n_layer"], config["n_embd"], config["n_head"], config["n_positions"]


def shipped_reward() -> RewardFn:
    """The shipped tiny reward model, in process, on ``"<prompt> <completion>"``.

    Both sides call this same function on text, so the reward costs the same on each side.
    """
    path = tiny_root() / "reward_model"
    model = load_reward_model(path)
    scorer = scorer_from_reward_model(model, load_tokenizer(path), max_length=model.config.n_positions)

    def reward(prompts: list[str], completions: list[str]) -> list[float]:
        texts = [f"{p} {c.strip()}" for p, c in zip(prompts, completions, strict=True)]
        return list(scorer.score_sentences(texts))

    return reward


def matmul_parameters(model_params: Sequence[tuple[str, int, int]]) -> int:
    """Parameters that take part in a matmul per token: every 2-D weight but GPT-2's position table.

    ``model_params`` holds (name, ndim, numel) of each distinct parameter; a tied input embedding counts
    once, as the LM head it also is.
    """
    return sum(numel for name, ndim, numel in model_params if ndim == 2 and "wpe" not in name)
