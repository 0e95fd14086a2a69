"""rl/ppo: NeMo-Aligner's PPO. An actor, its frozen initial policy, a critic initialised from the reward model
(backbone and head), GAE over per-token rewards (the score on the last generated token, minus a per-token KL
penalty), a clipped surrogate loss and a clipped value loss.

`main()` reads top to bottom: setup -> inputs -> models -> (resume) -> loop of rollout, score, update, report
-> evaluate -> save and register. The critic trains in the actor's process (docs/concepts.md says why); the
reward model is served by rm/serve.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel

from nemotron.models.checkpoint import load_reward_model
from nemotron.models.reward import Critic, build_critic_from_reward_model
from nemotron.rl import distributed, stages
from nemotron.rl.advantages import GAE, gae_advantages, token_rewards
from nemotron.rl.distributed import World, global_whiten
from nemotron.rl.experience import Experience, micro_batches
from nemotron.rl.kl import kl_penalty
from nemotron.rl.logprobs import entropy_from_logits, token_logprobs
from nemotron.rl.losses import ppo_clip_loss, value_loss
from nemotron.rl.masks import explained_variance, global_mean, mean_denominator
from nemotron.rl.optim import build_optimizer, optimizer_step
from nemotron.rl.rollout import response_logits
from nemotron.rl.stats import DeviceSums, global_means, global_sums
from nemotron.runtime.devices import DevicePlan
from nemotron.runtime.step import StepRun, required

if TYPE_CHECKING:  # mypy reads steps/ as a package root; at run time StepRun loads schema.py beside this file
    from rl.ppo.schema import PPO, Config

log = logging.getLogger("nemotron")


@dataclass
class Scored:
    """The score stage's output for B responses of width N."""

    kl: torch.Tensor  # (B, N) per-token KL of the sampling policy to the initial policy
    old_values: torch.Tensor  # (B, N) the critic's values at rollout time
    gae: GAE  # advantages and returns, (B, N) each
    advantages: torch.Tensor  # (B, N) what the actor trains on: gae.advantages, whitened if asked


@dataclass
class LossSums(DeviceSums):
    """Sums over epochs and micro-batches."""

    actor_loss: torch.Tensor
    critic_loss: torch.Tensor
    clipfrac: torch.Tensor
    entropy: torch.Tensor


@dataclass
class PPOStats:
    """One step's training statistics; the field names are NeMo-Aligner's metric names."""

    rewards_with_kl: float
    values_mean: float
    returns_mean: float
    advantages_mean: float
    actor_loss: float
    critic_loss: float
    clipfrac: float
    entropy: float
    explained_var: float
    grad_norm: float
    lr: float


def response_values(
    model: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, start: int
) -> torch.Tensor:
    """(B, N) value of the state before each response token: the critic's output one position earlier."""
    values: torch.Tensor = model(sequences, attention_mask)
    return values[:, start - 1 : -1]


def score(exp: Experience, old_values: torch.Tensor, p: PPO, world: World) -> Scored:
    """Per-token rewards (the score on the last token minus the KL penalty on every token), then GAE."""
    kl = kl_penalty(exp.logprobs, exp.ref_logprobs, p.kl_estimator)
    rewards = token_rewards(exp.scores, exp.mask, kl, p.initial_policy_kl_penalty)
    gae = gae_advantages(rewards, old_values, exp.mask, p.discount_factor, p.gae_lambda)
    # whitened over the GLOBAL batch: the moments are summed across ranks
    advantages = global_whiten(gae.advantages, exp.mask, world) if p.whiten_advantages else gae.advantages
    return Scored(kl, old_values, gae, advantages)


def update(
    policy: PreTrainedModel,
    critic: Critic,
    actor_opt: torch.optim.Optimizer,
    critic_opt: torch.optim.Optimizer,
    exp: Experience,
    s: Scored,
    step: int,
    cfg: Config,
    temperature: float,
    plan: DevicePlan,
    world: World,
) -> tuple[LossSums, float, float]:
    """ppo_epochs passes over micro-batches, one optimizer step of the critic (and, after the critic's
    warm-up, of the actor) per pass. Returns (loss sums, the actor's grad norm, its lr; 0 while it does not
    train)."""
    total = cfg.trainer.max_steps
    level = cfg.ppo.loss_level
    mask = exp.mask
    normaliser = distributed.all_reduce_sum(mean_denominator(mask, level), world)
    train_actor = step > cfg.ppo.critic_warmup_steps
    losses = LossSums.zeros(plan.device)
    grad_norm, lr = 0.0, 0.0
    policy.train()
    critic.train()
    for _ in range(cfg.ppo.ppo_epochs):
        for mb in micro_batches(len(exp.scores), cfg.trainer.micro_batch_size):
            with plan.autocast():
                values = response_values(critic, exp.sequences[mb], exp.attention_mask[mb], exp.prompt_width)
                vloss = value_loss(
                    values,
                    s.old_values[mb],
                    s.gae.returns[mb],
                    mask[mb],
                    cfg.critic.loss_clip_val,
                    level,
                    normaliser,
                )
            vloss.loss.backward()
            losses.critic_loss += vloss.loss.detach()
            if train_actor:
                with plan.autocast():
                    logits = response_logits(
                        policy, exp.sequences[mb], exp.attention_mask[mb], exp.prompt_width
                    )
                    logp = token_logprobs(logits, exp.sequences[mb, exp.prompt_width - 1 :], temperature)
                    clipped = ppo_clip_loss(
                        logp,
                        exp.logprobs[mb],
                        s.advantages[mb],
                        mask[mb],
                        cfg.ppo.ratio_eps,
                        dual_clip=cfg.ppo.dual_clip,
                        level=level,
                        normaliser=normaliser,
                    )
                    entropy = global_mean(
                        entropy_from_logits(logits[:, :-1], temperature), mask[mb], level, normaliser
                    )
                (clipped.loss - cfg.ppo.entropy_bonus * entropy).backward()
                losses.actor_loss += clipped.loss.detach()
                losses.clipfrac += clipped.clipfrac
                losses.entropy += entropy.detach()
        optimizer_step(critic, critic_opt, step, cfg.critic.optim, world, total)
        if train_actor:
            grad_norm, lr = optimizer_step(policy, actor_opt, step, cfg.optim, world, total)
    return losses, grad_norm, lr


def stats(
    exp: Experience, s: Scored, losses: LossSums, p: PPO, grad_norm: float, lr: float, world: World
) -> PPOStats:
    m = exp.mask.float()
    per_sample = global_means(
        world,
        len(exp.scores),
        rewards_with_kl=exp.scores.sum() - p.initial_policy_kl_penalty * (s.kl * m).sum(),
    )
    per_token = global_means(
        world,
        m.sum(),
        values_mean=(s.old_values * m).sum(),
        returns_mean=(s.gae.returns * m).sum(),
        advantages_mean=(s.gae.advantages * m).sum(),
    )
    loss_means = global_sums(world, p.ppo_epochs, **vars(losses))
    explained = float(explained_variance(s.old_values, s.gae.returns, exp.mask))
    return PPOStats(
        **per_sample, **per_token, **loss_means, explained_var=explained, grad_norm=grad_norm, lr=lr
    )


# the metrics of the summary line printed every trainer.log_interval steps
HEADLINE = ("rewards", "init_policy_kl", "critic_loss", "explained_var")


def main() -> None:
    # ---- setup: validated config, device, process group, threads, seeds
    run: StepRun[Config] = StepRun.start(__file__)
    cfg = run.config
    plan, world = stages.start(cfg.backend, cfg.runtime)
    total = cfg.trainer.max_steps

    # ---- inputs and models: the prompts, the actor, its frozen initial policy, a critic from the reward
    # model
    rollouts = stages.Rollouts.of_actor(cfg, cfg.ppo.num_rollouts_per_prompt, plan, world)
    policy, sampling = rollouts.models.policy, rollouts.sampling
    critic = build_critic_from_reward_model(
        load_reward_model(
            required(cfg.inputs.reward_model, "inputs.reward_model"), device=plan.device, dtype=plan.dtype
        )
    )
    plan.prepare(critic.model)
    actor_opt = build_optimizer(policy.parameters(), cfg.optim)
    critic_opt = build_optimizer(critic.parameters(), cfg.critic.optim)
    evaluation = stages.BeforeAfter(run, rollouts, cfg.eval)

    # ---- resume
    checkpoints = stages.Checkpoints.of_rollouts(
        run,
        cfg.checkpoint,
        rollouts,
        {"policy": policy, "critic": critic},
        {"policy": actor_opt, "critic": critic_opt},
    )
    start_step, rollouts.position = checkpoints.resume()

    with stages.reward_model_scores(run, cfg.reward, cfg.inputs.reward_model, plan) as (score_fn, described):
        log.info("rewards from %s", described)
        evaluation.before(score_fn, start_step)
        for step in range(start_step + 1, total + 1):
            t_step = time.perf_counter()
            # ---- rollout, and the critic's values of the states it visited
            exp = rollouts.collect(score_fn)
            with plan.autocast(), torch.no_grad():
                old_values = response_values(critic, exp.sequences, exp.attention_mask, exp.prompt_width)
            # ---- score
            s = score(exp, old_values, cfg.ppo, world)

            # ---- update
            t0 = time.perf_counter()
            losses, grad_norm, lr = update(
                policy, critic, actor_opt, critic_opt, exp, s, step, cfg, sampling.temperature, plan, world
            )
            train_time = time.perf_counter() - t0

            # ---- report: metrics averaged over ranks, then the checkpoint
            step_stats = stats(exp, s, losses, cfg.ppo, grad_norm, lr, world)
            metrics = rollouts.metrics(exp, exp.scores, s.kl, step_stats, (train_time, t_step))
            run.report(step, total, metrics, HEADLINE, cfg.trainer.log_interval)
            checkpoints.maybe_save(step, rollouts.position)

        # ---- evaluate
        evaluation.after(score_fn, total)

    # ---- save and register (main rank)
    stages.save_and_register(
        run, world, {"policy": policy, "critic": critic.model}, rollouts.tokenizer, {"steps": total}
    )


if __name__ == "__main__":
    main()
