"""rm/train: a Bradley-Terry reward model, -log sigmoid(r(chosen) - r(rejected)), with held-out pairwise
accuracy.

It starts from the SFT policy's backbone and tokenizer (`inputs.init_from`), as NeMo-Aligner does, so the
reward model reads exactly the tokens the policy writes; without it, it is built from `model.*` with a fresh
tokenizer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from nemotron.data.jsonl import read_jsonl
from nemotron.data.records import PreferenceRecord, prompt_text
from nemotron.models.batches import preference_batch
from nemotron.models.checkpoint import load_policy, load_tokenizer
from nemotron.models.reward import (
    SequenceRewards,
    bradley_terry_loss,
    pairwise_accuracy,
    reward_model_from_policy,
)
from nemotron.models.supervised import RankBatches, from_architecture, held_out_split
from nemotron.rl import distributed
from nemotron.rl.optim import build_optimizer, optimizer_step
from nemotron.rl.stages import Checkpoints, save_and_register
from nemotron.rl.stats import as_metrics
from nemotron.runtime.devices import DevicePlan, peak_memory_mb
from nemotron.runtime.step import StepRun, required

if TYPE_CHECKING:  # mypy reads steps/ as a package root; at run time StepRun loads schema.py beside this file
    from rm.train.schema import Config

log = logging.getLogger("nemotron")


@dataclass
class RewardModelStats:
    """One step's statistics; the field names are the metric names."""

    loss: float
    accuracy: float
    reward_margin: float
    grad_norm: float
    lr: float
    train: float
    peak_memory_mb: float
    val_accuracy: float | None = None  # every trainer.log_interval steps and at the last


def chosen_and_rejected(
    scorer: SequenceRewards, batch: Any, plan: DevicePlan
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) rewards of the chosen and of the rejected responses of a preference batch."""
    rewards = scorer(batch.input_ids.to(plan.device), batch.attention_mask.to(plan.device))
    chosen, rejected = rewards.chunk(2)
    return chosen, rejected


@torch.no_grad()
def held_out_accuracy(
    scorer: SequenceRewards, tokenizer: Any, val: list[PreferenceRecord], max_length: int, plan: DevicePlan
) -> float:
    """The share of held-out pairs whose chosen response gets the higher reward."""
    scorer.eval()
    correct = 0.0
    for i in range(0, len(val), 256):
        chunk = val[i : i + 256]
        with plan.autocast():
            chosen, rejected = chosen_and_rejected(
                scorer, preference_batch(tokenizer, chunk, max_length), plan
            )
        correct += float(pairwise_accuracy(chosen, rejected)) * len(chunk)
    scorer.train()
    return correct / len(val)


def main() -> None:
    # ---- setup: validated config, device, process group, threads, seeds
    run: StepRun[Config] = StepRun.start(__file__)
    cfg = run.config
    plan, world = distributed.start(cfg.runtime)

    # ---- data: a deterministic held-out split
    pairs = read_jsonl(required(cfg.inputs.data, "inputs.data"), PreferenceRecord)
    val, train = held_out_split(pairs, cfg.trainer.validation_fraction, cfg.runtime.seed, at_least=1)

    # ---- model
    if cfg.inputs.init_from:
        tokenizer = load_tokenizer(cfg.inputs.init_from)
        model = reward_model_from_policy(
            load_policy(cfg.inputs.init_from, dtype=plan.dtype), cfg.runtime.seed
        )
    else:
        texts = [t for p in pairs for t in (prompt_text(p.prompt), p.chosen, p.rejected)]
        tokenizer, model = from_architecture("reward_model", cfg.model, texts, cfg.runtime.seed)
    scorer = plan.prepare(SequenceRewards(model))  # one module call per pass: what FSDP shards around
    optimizer = build_optimizer(scorer.parameters(), cfg.optim)
    batches = RankBatches(train, cfg.trainer.global_batch_size, world.size, cfg.runtime.seed + world.rank)

    # ---- resume: a requeued job (or checkpoint.resume) continues from its checkpoint and batch
    checkpoints = Checkpoints(
        run,
        cfg.checkpoint,
        {"reward_model": scorer},
        {"reward_model": optimizer},
        world,
        cfg.inputs.init_from,
    )
    start_step, _ = checkpoints.resume()
    batches.skip(start_step)

    # ---- loop: update, report (the held-out accuracy every log_interval steps), checkpoint
    scorer.train()
    total = cfg.trainer.max_steps
    for step in range(start_step + 1, total + 1):
        t0 = time.perf_counter()
        batch = preference_batch(tokenizer, batches.next(), cfg.trainer.max_length)
        with plan.autocast():
            chosen, rejected = chosen_and_rejected(scorer, batch, plan)
            loss = bradley_terry_loss(chosen, rejected)
        (loss / world.size).backward()
        grad_norm, lr = optimizer_step(scorer, optimizer, step, cfg.optim, world, total)
        stats = RewardModelStats(
            loss.item(),
            pairwise_accuracy(chosen, rejected).item(),
            (chosen - rejected).mean().item(),
            grad_norm,
            lr,
            time.perf_counter() - t0,
            peak_memory_mb(plan.device),
        )
        if step % cfg.trainer.log_interval == 0 or step == total:
            stats.val_accuracy = held_out_accuracy(scorer, tokenizer, val, cfg.trainer.max_length, plan)
        run.report(
            step, total, as_metrics(stats), ("loss", "accuracy", "val_accuracy"), cfg.trainer.log_interval
        )
        checkpoints.maybe_save(step, step)

    # ---- save and register (main rank)
    metadata = {"val_accuracy": stats.val_accuracy, "validation_pairs": len(val)}
    save_and_register(run, world, {"reward_model": model}, tokenizer, metadata)


if __name__ == "__main__":
    main()
