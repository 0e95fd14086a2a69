"""rl/reinforce: NeMo-Aligner's REINFORCE with an RLOO baseline and a KL penalty to the initial policy.

`main()` reads top to bottom: setup -> inputs -> models -> (resume) -> loop of rollout, score, update, report
-> evaluate -> save and register. No critic: the baseline of each response is the mean reward of the other
responses to the same prompt.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel

from nemotron.rl import distributed, stages
from nemotron.rl.advantages import rloo_baseline
from nemotron.rl.async_rollouts import rollout_source
from nemotron.rl.distributed import World
from nemotron.rl.experience import Experience, micro_batches
from nemotron.rl.importance import step_correction
from nemotron.rl.kl import kl_penalty, rewards_with_kl
from nemotron.rl.losses import reinforce_loss
from nemotron.rl.masks import mean_denominator
from nemotron.rl.optim import build_optimizer, optimizer_step
from nemotron.rl.rollout import sequence_logprobs
from nemotron.rl.stats import global_means
from nemotron.runtime.devices import DevicePlan
from nemotron.runtime.faults import inject
from nemotron.runtime.step import StepRun

if TYPE_CHECKING:  # mypy reads steps/ as a package root; at run time StepRun loads schema.py beside this file
    from rl.reinforce.schema import Config, Reinforce

log = logging.getLogger("nemotron")


@dataclass
class Scored:
    """The score stage's output for B responses."""

    scores: torch.Tensor  # (B,) the reward source's scores (0 for truncated responses under zero_reward)
    kl: torch.Tensor  # (B, N) per-token KL of the sampling policy to the initial policy
    rewards: torch.Tensor  # (B,) scores minus the KL penalty
    baseline: torch.Tensor  # (B,) RLOO: the mean reward of the other responses to the same prompt
    advantages: torch.Tensor  # (B,) rewards - baseline


@dataclass
class ReinforceStats:
    """One step's training statistics; the field names are NeMo-Aligner's metric names."""

    rewards_with_kl: float
    baseline: float
    advantages_mean: float
    actor_loss: float
    grad_norm: float
    lr: float


def score(exp: Experience, r: Reinforce) -> Scored:
    """Fold the KL to the initial policy into the reward (sequence mean or per token) and subtract RLOO."""
    scores = exp.scores
    if r.truncated_responses == "zero_reward":
        scores = torch.where(exp.is_end, scores, torch.zeros_like(scores))
    kl = kl_penalty(exp.logprobs, exp.ref_logprobs, r.kl_estimator)
    if r.kl_in == "reward_sequence_mean":
        rewards = rewards_with_kl(scores, kl, exp.mask, r.initial_policy_kl_penalty)
    else:  # per token: the sequence reward minus the sum of per-token penalties
        rewards = scores - r.initial_policy_kl_penalty * (kl * exp.mask).sum(dim=1)
    baseline = rloo_baseline(exp.group, rewards, exp.is_end)
    return Scored(scores, kl, rewards, baseline, rewards - baseline)


def update(
    policy: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    exp: Experience,
    s: Scored,
    step: int,
    cfg: Config,
    temperature: float,
    plan: DevicePlan,
    world: World,
    weights: torch.Tensor | None,
) -> tuple[torch.Tensor, float, float]:
    """reinforce_epochs passes over micro-batches of the rollouts, one optimizer step per pass; the loss is
    normalised by the global batch's tokens (or responses), `weights` (importance weights, or None) weigh each
    token's. Returns (actor loss summed over passes, grad norm, lr)."""
    policy.train()
    level = cfg.reinforce.loss_level
    normaliser = distributed.all_reduce_sum(mean_denominator(exp.mask, level), world)
    actor_loss = torch.zeros((), device=plan.device)
    grad_norm, lr = 0.0, 0.0
    for _ in range(cfg.reinforce.reinforce_epochs):
        for mb in micro_batches(len(s.advantages), cfg.trainer.micro_batch_size):
            with plan.autocast():
                logp = sequence_logprobs(
                    policy, exp.sequences[mb], exp.attention_mask[mb], temperature, exp.prompt_width
                )
                w = None if weights is None else weights[mb]
                loss = reinforce_loss(logp, s.advantages[mb], exp.mask[mb], level, normaliser, w)
            loss.backward()
            actor_loss += loss.detach()
        grad_norm, lr = optimizer_step(policy, optimizer, step, cfg.optim, world, cfg.trainer.max_steps)
    return actor_loss, grad_norm, lr


def stats(
    s: Scored, actor_loss: torch.Tensor, grad_norm: float, lr: float, epochs: int, world: World
) -> ReinforceStats:
    means = global_means(
        world,
        len(s.scores),
        rewards_with_kl=s.rewards.sum(),
        baseline=s.baseline.sum(),
        advantages_mean=s.advantages.sum(),
    )
    loss = float(distributed.all_reduce_sum(actor_loss, world)) / epochs
    return ReinforceStats(**means, actor_loss=loss, grad_norm=grad_norm, lr=lr)


# the metrics of the summary line printed every trainer.log_interval steps
HEADLINE = ("rewards", "init_policy_kl", "actor_loss", "response_lengths")


def main() -> None:
    # ---- setup: validated config, device, process group, threads, seeds
    run: StepRun[Config] = StepRun.start(__file__)
    cfg = run.config
    plan, world = stages.start(cfg.backend, cfg.runtime)
    total = cfg.trainer.max_steps

    # ---- inputs and models: the prompts, the actor and the frozen initial policy it is kept close to
    rollouts = stages.Rollouts.of_actor(cfg, cfg.reinforce.num_rollouts_per_prompt, plan, world)
    policy, sampling = rollouts.models.policy, rollouts.sampling
    optimizer = build_optimizer(policy.parameters(), cfg.optim)
    evaluation = stages.BeforeAfter(run, rollouts, cfg.eval)

    # ---- resume
    checkpoints = stages.Checkpoints.of_rollouts(
        run, cfg.checkpoint, rollouts, {"policy": policy}, {"policy": optimizer}
    )
    start_step, rollouts.position = checkpoints.resume()

    source = rollout_source(rollouts, cfg.reinforce.async_grpo, start_step, total)
    scores = stages.reward_model_scores(run, cfg.reward, cfg.inputs.reward_model, plan)
    # the generator process starts first: its start-up overlaps the reward server's
    with source.running(), scores as (score_fn, described):
        log.info("rewards from %s", described)
        evaluation.before(score_fn, start_step)
        for step in range(start_step + 1, total + 1):
            t_step = time.perf_counter()
            # ---- rollout: this rank's share of the step's prompts (here, or by the generator process)
            exp = source.collect(score_fn, step)
            inject("rollout", step)
            # ---- score
            s = score(exp, cfg.reinforce)

            # ---- update, with the off-policy correction when it is on; then the weights to the generator
            t0 = time.perf_counter()
            weights, correction = step_correction(exp, cfg.reinforce, world)
            actor_loss, grad_norm, lr = update(
                policy, optimizer, exp, s, step, cfg, sampling.temperature, plan, world, weights
            )
            source.published(step, policy)
            train_time = time.perf_counter() - t0

            # ---- report: metrics averaged over ranks (NeMo-Aligner names), then the checkpoint
            step_stats = stats(s, actor_loss, grad_norm, lr, cfg.reinforce.reinforce_epochs, world)
            metrics = rollouts.metrics(
                exp, s.scores, s.kl, step_stats, (train_time, t_step), correction, source.metrics()
            )
            run.report(step, total, metrics, HEADLINE, cfg.trainer.log_interval)
            checkpoints.maybe_save(step, rollouts.position)

        # ---- evaluate
        evaluation.after(score_fn, total)

    # ---- save and register (main rank)
    stages.save_and_register(run, world, {"policy": policy}, rollouts.tokenizer, {"steps": total})


if __name__ == "__main__":
    main()
