"""rl/dpo: Direct Preference Optimization. The policy learns from preference pairs against a frozen reference:
each response's reward is its summed log-ratio to the reference, and the loss pushes the chosen response's
reward above the rejected one's (NeMo-RL's DPO; NeMo-Aligner's IPO and RPO variants; conservative DPO's label
smoothing).

Chosen and rejected go through the policy in one forward (a stacked batch); the reference scores the same
batch under no_grad once per micro-batch. Metrics carry NeMo-RL's names, val_* on the validation pairs."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from nemotron.data.jsonl import read_jsonl_numbered
from nemotron.data.records import PreferenceRecord
from nemotron.errors import UserError
from nemotron.models.batches import EncodedPair, encode_pair, pad_id, pair_batch
from nemotron.models.checkpoint import load_policy, load_tokenizer
from nemotron.models.supervised import RankBatches, held_out_split
from nemotron.rl import distributed
from nemotron.rl.logprobs import token_logprobs
from nemotron.rl.optim import build_optimizer, optimizer_step
from nemotron.rl.preference_losses import preference_loss, sequence_logratios, sequence_nll
from nemotron.rl.sharding import full_weights
from nemotron.rl.stages import Checkpoints, save_and_register
from nemotron.rl.stats import as_metrics, global_means
from nemotron.runtime.devices import DevicePlan, peak_memory_mb
from nemotron.runtime.step import StepRun, required

if TYPE_CHECKING:  # mypy reads steps/ as a package root; at run time StepRun loads schema.py beside this file
    from rl.dpo.schema import DPO, Config

log = logging.getLogger("nemotron")

# NeMo-Aligner's rewards of a pair whose line carries none (its data.default_chosen_reward / rejected_reward).
DEFAULT_REWARDS = (1.0, 0.0)
PAIR_METRICS = ("loss", "preference_loss", "sft_loss", "accuracy", "rewards_chosen_mean",
                "rewards_rejected_mean", "margin")  # fmt: skip


@dataclass(frozen=True)
class Pair:
    """A pair ready for the loss: its token ids and its ground-truth reward difference (the RPO losses' g)."""

    tokens: EncodedPair
    gt_delta: float


@dataclass
class DPOStats:
    """One step's statistics; the field names are the metric names (NeMo-RL's, and the margin)."""

    loss: float
    preference_loss: float
    sft_loss: float
    accuracy: float
    rewards_chosen_mean: float
    rewards_rejected_mean: float
    margin: float
    grad_norm: float
    lr: float
    train: float
    peak_memory_mb: float


def encode_pairs(path: str, tokenizer: Any, max_length: int, dpo: DPO) -> list[Pair]:
    """Every pair of a preference file, tokenised; a pair whose prompt leaves no response token within
    `max_length` is exit 2, naming its file and line."""
    pairs = []
    for line, record in read_jsonl_numbered(path, PreferenceRecord):
        tokens = encode_pair(tokenizer, record, max_length)
        if not tokens.has_responses:
            raise UserError(
                f"{path}:{line}: the prompt takes {tokens.prompt_tokens} tokens, so with trainer.max_length="
                f"{max_length} chosen or rejected keeps no response token; raise trainer.max_length or "
                "shorten the prompt"
            )
        chosen = DEFAULT_REWARDS[0] if record.chosen_reward is None else record.chosen_reward
        rejected = DEFAULT_REWARDS[1] if record.rejected_reward is None else record.rejected_reward
        pairs.append(Pair(tokens, dpo.gt_reward_scale * (chosen - rejected)))
    return pairs


def pair_terms(
    policy: torch.nn.Module,
    reference: torch.nn.Module,
    pairs: list[Pair],
    pad: int,
    dpo: DPO,
    plan: DevicePlan,
) -> dict[str, torch.Tensor]:
    """Per-pair sums of one micro-batch, ``(b,)`` each: the weighted loss (differentiable) and its parts."""
    batch = pair_batch([p.tokens for p in pairs], pad)
    ids, attention = batch.input_ids.to(plan.device), batch.attention_mask.to(plan.device)
    mask = batch.response_mask.to(plan.device)
    with plan.autocast():
        logits = policy(input_ids=ids, attention_mask=attention).logits
    logp = token_logprobs(logits, ids)
    with torch.no_grad(), plan.autocast():
        ref_logp = token_logprobs(reference(input_ids=ids, attention_mask=attention).logits, ids)
    rewards = sequence_logratios(logp, ref_logp, mask, dpo.preference_average_log_probs)
    chosen, rejected = rewards.chunk(2)
    gt = torch.tensor([p.gt_delta for p in pairs], device=plan.device)
    pref = preference_loss(
        chosen - rejected, dpo.reference_policy_kl_penalty, dpo.preference_loss, gt, dpo.label_smoothing
    )
    sft = sequence_nll(logp, mask, dpo.sft_average).chunk(2)[0]
    loss = dpo.preference_loss_weight * pref + dpo.sft_loss_weight * sft
    return {
        "loss": loss,
        "preference_loss": pref.detach(),
        "sft_loss": sft.detach(),
        "accuracy": (chosen > rejected).to(rewards.dtype).detach(),
        "rewards_chosen_mean": chosen.detach(),
        "rewards_rejected_mean": rejected.detach(),
        "margin": (chosen - rejected).detach(),
    }


def micro_batches(pairs: list[Pair], size: int) -> list[list[Pair]]:
    return [pairs[i : i + size] for i in range(0, len(pairs), size)]


@torch.no_grad()
def validate(
    policy: torch.nn.Module,
    reference: torch.nn.Module,
    val: list[Pair],
    pad: int,
    cfg: Config,
    plan: DevicePlan,
    world: distributed.World,
) -> dict[str, float]:
    """The pair metrics over the validation pairs (the first val_batches batches of val_global_batch_size; all
    with val_batches 0), each rank scoring its share, as val_<name>."""
    d = cfg.dpo
    used = val[: d.val_batches * d.val_global_batch_size] if d.val_batches else val
    mine = distributed.shard(used, world)
    policy.eval()
    sums = {name: torch.zeros((), device=plan.device) for name in PAIR_METRICS}
    with full_weights(policy):
        for chunk in micro_batches(mine, max(1, d.val_global_batch_size // world.size)):
            for name, values in pair_terms(policy, reference, chunk, pad, d, plan).items():
                sums[name] += values.detach().sum()
    policy.train()
    means = global_means(world, len(mine), **sums)
    return {f"val_{name}": value for name, value in means.items()}


def main() -> None:
    # ---- setup: validated config, device, process group, threads, seeds
    run: StepRun[Config] = StepRun.start(__file__)
    cfg = run.config
    plan, world = distributed.start(cfg.runtime)
    policy_path = required(cfg.inputs.policy, "inputs.policy")

    # ---- data: every pair tokenised once (a pair with no response token is exit 2); the validation pairs
    tokenizer = load_tokenizer(policy_path)
    pad, max_length = pad_id(tokenizer), cfg.trainer.max_length
    pairs = encode_pairs(
        required(cfg.inputs.preferences, "inputs.preferences"), tokenizer, max_length, cfg.dpo
    )
    if cfg.inputs.validation_preferences:
        val, train = encode_pairs(cfg.inputs.validation_preferences, tokenizer, max_length, cfg.dpo), pairs
    else:
        val, train = held_out_split(pairs, cfg.held_out_share(), cfg.runtime.seed, at_least=1)

    # ---- models: the trained policy, and the frozen reference (inputs.reference, else the policy's copy)
    policy = plan.prepare(load_policy(policy_path, device=plan.device, dtype=plan.dtype))
    reference = load_policy(cfg.inputs.reference or policy_path, device=plan.device, dtype=plan.dtype)
    reference.eval().requires_grad_(False)
    optimizer = build_optimizer(policy.parameters(), cfg.optim)
    batches = RankBatches(train, cfg.trainer.global_batch_size, world.size, cfg.runtime.seed + world.rank)
    log.info("policy %s; %d train / %d validation pairs", policy_path, len(train), len(val))

    # ---- resume: a requeued job (or checkpoint.resume) continues from its checkpoint and batch
    checkpoints = Checkpoints(
        run, cfg.checkpoint, {"policy": policy}, {"policy": optimizer}, world, policy_path
    )
    start_step, _ = checkpoints.resume()
    batches.skip(start_step)
    d, total = cfg.dpo, cfg.dpo.max_num_steps
    first = last = None
    if d.val_at_start and start_step == 0:
        with run.progress.section("validation"):
            first = last = validate(policy, reference, val, pad, cfg, plan, world)
        run.log_metrics(0, first)
        log.info(
            "validation before DPO: val_accuracy=%.3f val_loss=%.4f", first["val_accuracy"], first["val_loss"]
        )

    # ---- loop: micro-batches accumulate one update; validate every val_period steps (and at the end)
    policy.train()
    for step in range(start_step + 1, total + 1):
        t0 = time.perf_counter()
        mine = batches.next()
        sums = {name: torch.zeros((), device=plan.device) for name in PAIR_METRICS}
        for chunk in micro_batches(mine, cfg.trainer.micro_batch_size):
            terms = pair_terms(policy, reference, chunk, pad, d, plan)
            (terms["loss"].sum() / (len(mine) * world.size)).backward()  # the mean over the global batch
            for name, values in terms.items():
                sums[name] += values.detach().sum()
        grad_norm, lr = optimizer_step(policy, optimizer, step, cfg.optim, world, total)
        means = global_means(world, len(mine), **sums)
        stats = DPOStats(**means, grad_norm=grad_norm, lr=lr, train=time.perf_counter() - t0,
                         peak_memory_mb=peak_memory_mb(plan.device))  # fmt: skip
        metrics = as_metrics(stats)
        if (d.val_period and step % d.val_period == 0) or (d.val_at_end and step == total):
            with run.progress.section("validation"):
                last = validate(policy, reference, val, pad, cfg, plan, world)
            metrics.update(last)
        run.report(
            step, total, metrics, ("loss", "accuracy", "margin", "val_accuracy"), cfg.trainer.log_interval
        )
        checkpoints.maybe_save(step, step)

    # ---- save and register (main rank)
    metadata: dict[str, object] = {"validation_pairs": len(val)}
    if first is not None:
        metadata["val_accuracy_before"] = first["val_accuracy"]
    if last is not None:
        metadata["val_accuracy"] = last["val_accuracy"]
    save_and_register(run, world, {"policy": policy}, tokenizer, metadata)


if __name__ == "__main__":
    main()
