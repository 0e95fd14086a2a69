"""Example step rl/rloo_lite: REINFORCE with a leave-one-out baseline and no KL penalty, built from the library's
stages. `main()` reads top to bottom: setup -> models -> loop of rollout, score, update, report -> save."""

import time
from dataclasses import dataclass

import torch

from nemotron.rl import distributed, stages
from nemotron.rl.advantages import rloo_baseline
from nemotron.rl.experience import micro_batches
from nemotron.rl.losses import reinforce_loss
from nemotron.rl.masks import mean_denominator
from nemotron.rl.optim import build_optimizer, optimizer_step
from nemotron.rl.rollout import sequence_logprobs
from nemotron.runtime.step import StepRun


@dataclass
class Stats:
    """One step's training statistics."""

    actor_loss: float
    grad_norm: float
    lr: float


def main() -> None:
    # ---- setup: the validated config, device and process group
    run = StepRun.start(__file__)
    cfg = run.config
    plan, world = stages.start(cfg.backend, cfg.runtime)
    total = cfg.trainer.max_steps

    # ---- models: the prompts, the policy and its frozen initial copy
    rollouts = stages.Rollouts.of_actor(cfg, cfg.rloo.num_rollouts_per_prompt, plan, world)
    policy, temperature = rollouts.models.policy, rollouts.sampling.temperature
    optimizer = build_optimizer(policy.parameters(), cfg.optim)

    with stages.reward_model_scores(run, cfg.reward, cfg.inputs.reward_model, plan) as (score_fn, _):
        for step in range(1, total + 1):
            t_step = time.perf_counter()
            # ---- rollout and score: each reward minus the mean of the other responses' to its prompt
            exp = rollouts.collect(score_fn)
            advantages = exp.scores - rloo_baseline(exp.group, exp.scores, exp.is_end)

            # ---- update: one optimizer step over micro-batches, the loss averaged over the batch's tokens
            t0 = time.perf_counter()
            policy.train()
            normaliser = distributed.all_reduce_sum(mean_denominator(exp.mask, "token"), world)
            actor_loss = torch.zeros((), device=plan.device)
            for mb in micro_batches(len(advantages), cfg.trainer.micro_batch_size):
                with plan.autocast():
                    logp = sequence_logprobs(
                        policy, exp.sequences[mb], exp.attention_mask[mb], temperature, exp.prompt_width
                    )
                    loss = reinforce_loss(logp, advantages[mb], exp.mask[mb], "token", normaliser)
                loss.backward()
                actor_loss += loss.detach()
            grad_norm, lr = optimizer_step(policy, optimizer, step, cfg.optim, world, total)

            # ---- report
            stats = Stats(float(distributed.all_reduce_sum(actor_loss, world)), grad_norm, lr)
            kl = torch.zeros_like(exp.logprobs)  # no KL term in this step
            times = (time.perf_counter() - t0, t_step)
            run.report(step, total, rollouts.metrics(exp, exp.scores, kl, stats, times), ("rewards",), 1)

    # ---- save and register (main rank)
    stages.save_and_register(run, world, {"policy": policy}, rollouts.tokenizer, {"steps": total})


if __name__ == "__main__":  # importing the module does nothing; `nemotron steps run` runs it as __main__
    main()
