"""sft: train a causal LM on prompt/response pairs, with the loss on the response tokens (and EOS) only.

With no `inputs.init_from`, the model is built from `model.*` with random weights and a BPE tokenizer trained
on the data itself: no hub download anywhere.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from nemotron.data.jsonl import read_jsonl
from nemotron.data.records import SFTRecord, prompt_text
from nemotron.models.batches import sft_batch
from nemotron.models.checkpoint import load_policy, load_tokenizer
from nemotron.models.supervised import RankBatches, from_architecture, held_out_split
from nemotron.models.tiny import count_parameters
from nemotron.rl import distributed
from nemotron.rl.optim import build_optimizer, optimizer_step
from nemotron.rl.stages import Checkpoints, save_and_register
from nemotron.rl.stats import as_metrics
from nemotron.runtime.devices import DevicePlan, peak_memory_mb
from nemotron.runtime.step import StepRun, required

if TYPE_CHECKING:  # mypy reads steps/ as a package root; at run time StepRun loads schema.py beside this file
    from sft.schema import Config

log = logging.getLogger("nemotron")


@dataclass
class SFTStats:
    """One step's statistics; the field names are the metric names."""

    loss: float
    grad_norm: float
    lr: float
    train: float
    peak_memory_mb: float
    val_loss: float | None = None  # every trainer.log_interval steps and at the last


def on_device(batch: Any, plan: DevicePlan) -> dict[str, torch.Tensor]:
    return {k: v.to(plan.device) for k, v in batch._asdict().items()}


@torch.no_grad()
def validation_loss(
    policy: torch.nn.Module, tokenizer: Any, val: list[SFTRecord], max_length: int, plan: DevicePlan
) -> float:
    """The loss on the held-out examples, in one batch; NaN without any."""
    if not val:
        return float("nan")
    policy.eval()
    batch = sft_batch(tokenizer, val, max_length)
    with plan.autocast():
        loss = float(policy(**on_device(batch, plan)).loss)
    policy.train()
    return loss


def main() -> None:
    # ---- setup: validated config, device, process group, threads, seeds
    run: StepRun[Config] = StepRun.start(__file__)
    cfg = run.config
    plan, world = distributed.start(cfg.runtime)

    # ---- data: a deterministic held-out split for the validation loss
    records = read_jsonl(required(cfg.inputs.data, "inputs.data"), SFTRecord)
    val, train = held_out_split(records, cfg.trainer.validation_fraction, cfg.runtime.seed)

    # ---- model and tokenizer
    if cfg.inputs.init_from:
        tokenizer = load_tokenizer(cfg.inputs.init_from)
        policy = load_policy(cfg.inputs.init_from, device=plan.device, dtype=plan.dtype)
    else:
        texts = [t for r in records for t in (prompt_text(r.prompt), r.response)]
        tokenizer, policy = from_architecture("policy", cfg.model, texts, cfg.runtime.seed)
    policy = plan.prepare(policy)
    log.info(
        "policy: %s, %d parameters, vocabulary %d, %d train / %d validation examples",
        type(policy).__name__,
        count_parameters(policy),
        len(tokenizer),
        len(train),
        len(val),
    )
    # transformers derives the loss from the class name, which for GPT2LMHeadModel it does not recognise, and
    # warns.
    policy.loss_type = "ForCausalLM"
    optimizer = build_optimizer(policy.parameters(), cfg.optim)
    batches = RankBatches(train, cfg.trainer.global_batch_size, world.size, cfg.runtime.seed + world.rank)

    # ---- resume: a requeued job (or checkpoint.resume) continues from its checkpoint and batch
    checkpoints = Checkpoints(
        run, cfg.checkpoint, {"policy": policy}, {"policy": optimizer}, world, cfg.inputs.init_from
    )
    start_step, _ = checkpoints.resume()
    batches.skip(start_step)

    # ---- loop: update, report (the validation loss every log_interval steps), checkpoint
    policy.train()
    total = cfg.trainer.max_steps
    for step in range(start_step + 1, total + 1):
        t0 = time.perf_counter()
        batch = sft_batch(tokenizer, batches.next(), cfg.trainer.max_length)
        with plan.autocast():
            loss = policy(**on_device(batch, plan)).loss
        (loss / world.size).backward()
        grad_norm, lr = optimizer_step(policy, optimizer, step, cfg.optim, world, total)
        stats = SFTStats(loss.item(), grad_norm, lr, time.perf_counter() - t0, peak_memory_mb(plan.device))
        if step % cfg.trainer.log_interval == 0 or step == total:
            stats.val_loss = validation_loss(policy, tokenizer, val, cfg.trainer.max_length, plan)
        run.report(step, total, as_metrics(stats), ("loss", "val_loss", "lr"), cfg.trainer.log_interval)
        checkpoints.maybe_save(step, step)

    # ---- save and register (main rank)
    metadata = {"val_loss": stats.val_loss, "parameters": count_parameters(policy)}
    save_and_register(run, world, {"policy": policy}, tokenizer, metadata)


if __name__ == "__main__":
    main()
