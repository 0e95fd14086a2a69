"""rl/ppo: NeMo-Aligner's PPO. An actor, its frozen initial policy, a critic initialised from the reward model
(backbone and head), GAE over per-token rewards (the score on the last generated token, minus a per-token KL
penalty), a clipped surrogate loss and a clipped value loss.

The critic trains in the actor's process (docs/concepts.md says why); the reward model is served by rm/serve.
"""

import logging
import time

import torch

from nemotron.data.jsonl import read_jsonl
from nemotron.data.records import PromptRecord, prompt_text
from nemotron.devices import peak_memory_mb
from nemotron.errors import UserError
from nemotron.metrics import summary_line
from nemotron.models.checkpoint import load_policy, load_reward_model, load_tokenizer, save_checkpoint
from nemotron.models.reward import build_critic_from_reward_model
from nemotron.models.tokenizer import encode_prompt
from nemotron.rl import distributed, trainstate
from nemotron.rl.advantages import gae_advantages, token_rewards
from nemotron.rl.evaluation import evaluate, parameter_checksum
from nemotron.rl.experience import collect, micro_batches, prompt_schedule, sampling_params
from nemotron.rl.generation_backends import get_backend
from nemotron.rl.kl import kl_penalty, sequence_kl
from nemotron.rl.logprobs import entropy_from_logits, token_logprobs
from nemotron.rl.losses import ppo_clip_loss, value_loss
from nemotron.rl.masks import explained_variance, global_mean, mean_denominator
from nemotron.rl.optim import build_optimizer, optimizer_step
from nemotron.rl.prompts import fit_prompts, model_positions
from nemotron.rl.reward_source import reward_source
from nemotron.rl.rollout import response_logits
from nemotron.runtime import StepRun
from nemotron.tasks import get_task

log = logging.getLogger("nemotron")
run = StepRun.start(__file__)
cfg = run.config
if cfg.backend == "nemo_rl":
    raise UserError("backend=nemo_rl runs NeMo-RL in its container on GPUs; submit it with a Slurm or Lepton profile "
                    "(-b PROFILE). `--dry-run` shows the NeMo-RL config and command it would run.")
plan, world = distributed.start(cfg.runtime)  # device, process group, threads, seeds

# ---- inputs
records = read_jsonl(cfg.inputs.prompts, PromptRecord)
prompts = [prompt_text(r.prompt) for r in records]  # text for judges and task scorers; the ids below are the model's
tokenizer = load_tokenizer(cfg.inputs.policy)
prompt_ids = [encode_prompt(tokenizer, r.prompt) for r in records]
n = cfg.ppo.num_rollouts_per_prompt
task = get_task(cfg.eval.task) if cfg.eval.task else None

# ---- models: actor, frozen initial policy, and a critic made from the reward model
policy = plan.prepare(load_policy(cfg.inputs.policy, device=plan.device, dtype=plan.dtype))
prompt_ids = fit_prompts(prompt_ids, model_positions(policy.config), cfg.generation.max_new_tokens)
reference = load_policy(cfg.inputs.policy, device=plan.device, dtype=plan.dtype).eval().requires_grad_(False)
reference_checksum = parameter_checksum(reference)
critic = build_critic_from_reward_model(load_reward_model(cfg.inputs.reward_model, device=plan.device, dtype=plan.dtype))
plan.prepare(critic.model)
actor_opt = build_optimizer(policy.parameters(), cfg.optim)
critic_opt = build_optimizer(critic.parameters(), cfg.critic.optim)
backend = get_backend(cfg.generation)  # our torch sampler, or vLLM in this process
sampling = sampling_params(cfg.generation, tokenizer)
sampler = plan.generator(cfg.runtime.seed * 1000 + world.rank)

# ---- resume
expect = trainstate.fingerprints(run.record["config"], cfg.inputs.policy)
start_step, position = trainstate.maybe_resume(run.job_dir, run.record["step"], cfg.checkpoint, {"policy": policy, "critic": critic}, {"policy": actor_opt, "critic": critic_opt},
                                               {"sampler": sampler}, expect, world)


def response_values(model: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, start: int) -> torch.Tensor:
    """(B, N) value of the state before each response token: the critic's output one position earlier."""
    values = model(sequences, attention_mask)
    return values[:, start - 1 : -1]


with reward_source(cfg.reward.source, cfg.inputs.reward_model, cfg.reward.server.url, cfg.reward.server.token,
                   cfg.reward.server.timeout_s, cfg.reward.server.retries, log_path=run.job_dir / "logs" / "reward_server.log", device=str(plan.device)) as (score, described):
    log.info("rewards from %s", described)
    eval_idx = list(range(min(cfg.eval.num_prompts, len(prompts))))
    if world.is_main and eval_idx and start_step == 0:
        with plan.autocast():
            before = evaluate(backend, policy, tokenizer, [prompts[i] for i in eval_idx], [prompt_ids[i] for i in eval_idx], sampling, cfg.eval.seed, score, task)
        run.log_metrics(0, {f"eval_{k}_before": v for k, v in before.items()})
        log.info("before RL: %s", " ".join(f"{k}={v:.3f}" for k, v in before.items()))

    for step in range(start_step + 1, cfg.trainer.max_steps + 1):
        t_step = time.perf_counter()
        # ---- rollout phase
        batch = distributed.shard(prompt_schedule(len(prompts), cfg.runtime.seed, position, cfg.trainer.num_prompts_per_step), world)
        position += cfg.trainer.num_prompts_per_step
        with plan.autocast():
            exp = collect(backend, policy, reference, tokenizer, [prompts[i] for i in batch], [prompt_ids[i] for i in batch], 0, n, sampling, sampler, score)
            with torch.no_grad():
                old_values = response_values(critic, exp.sequences, exp.attention_mask, exp.prompt_width)
        mask = exp.mask
        kl = kl_penalty(exp.logprobs, exp.ref_logprobs, cfg.ppo.kl_estimator)
        rewards = token_rewards(exp.scores, mask, kl, cfg.ppo.initial_policy_kl_penalty)
        gae = gae_advantages(rewards, old_values, mask, cfg.ppo.discount_factor, cfg.ppo.gae_lambda)
        advantages = gae.advantages
        if cfg.ppo.whiten_advantages:  # over the GLOBAL batch: moments are summed across ranks
            m = mask.float()
            s = distributed.all_reduce_sum(torch.stack([(advantages * m).sum(), (advantages.square() * m).sum(), m.sum()]), world)
            mean = s[0] / s[2].clamp(min=1)
            var = (s[1] / s[2].clamp(min=1) - mean.square()).clamp(min=0) * s[2] / (s[2] - 1).clamp(min=1)
            advantages = torch.where(mask, (advantages - mean) * torch.rsqrt(var + 1e-8), torch.zeros_like(advantages))

        # ---- optimisation phase: ppo_epochs passes over micro-batches, one optimizer step per pass
        t0 = time.perf_counter()
        level = cfg.ppo.loss_level
        normaliser = distributed.all_reduce_sum(mean_denominator(mask, level), world)
        train_actor = step > cfg.ppo.critic_warmup_steps
        sums = torch.zeros(4, device=plan.device)  # actor loss, critic loss, clipfrac, entropy
        grad_norm, lr = 0.0, 0.0
        policy.train()
        critic.train()
        for _ in range(cfg.ppo.ppo_epochs):
            for mb in micro_batches(len(exp.scores), cfg.trainer.micro_batch_size):
                with plan.autocast():
                    values = response_values(critic, exp.sequences[mb], exp.attention_mask[mb], exp.prompt_width)
                    vloss = value_loss(values, old_values[mb], gae.returns[mb], mask[mb], cfg.critic.loss_clip_val, level, normaliser)
                vloss.loss.backward()
                sums[1] += vloss.loss.detach()
                if train_actor:
                    with plan.autocast():
                        logits = response_logits(policy, exp.sequences[mb], exp.attention_mask[mb], exp.prompt_width)
                        logp = token_logprobs(logits, exp.sequences[mb, exp.prompt_width - 1 :], sampling.temperature)
                        clipped = ppo_clip_loss(logp, exp.logprobs[mb], advantages[mb], mask[mb], cfg.ppo.ratio_eps,
                                                dual_clip=cfg.ppo.dual_clip, level=level, normaliser=normaliser)
                        entropy = global_mean(entropy_from_logits(logits[:, :-1], sampling.temperature), mask[mb], level, normaliser)
                    (clipped.loss - cfg.ppo.entropy_bonus * entropy).backward()
                    sums[0] += clipped.loss.detach()
                    sums[2] += clipped.clipfrac
                    sums[3] += entropy.detach()
            optimizer_step(critic, critic_opt, step, cfg.critic.optim, world, cfg.trainer.max_steps)
            if train_actor:
                grad_norm, lr = optimizer_step(policy, actor_opt, step, cfg.optim, world, cfg.trainer.max_steps)
        train_time = time.perf_counter() - t0

        # ---- metrics, averaged over ranks
        epochs = cfg.ppo.ppo_epochs
        loss_sums = distributed.all_reduce_sum(sums, world) / epochs
        m = mask.float()
        local = torch.stack([exp.scores.sum(), sequence_kl(kl, mask).sum(), (old_values * m).sum(), (gae.returns * m).sum(), m.sum(),
                             exp.response_lengths.float().sum(), exp.is_end.float().sum(), (gae.advantages * m).sum(),
                             torch.tensor(float(len(exp.scores)), device=plan.device)])
        tot = distributed.all_reduce_sum(local, world)
        count = float(tot[-1])
        metrics = {"rewards": tot[0] / count, "init_policy_kl": tot[1] / count,
                   "rewards_with_kl": (tot[0] - cfg.ppo.initial_policy_kl_penalty * (kl * m).sum()) / count,
                   "values_mean": tot[2] / tot[4], "returns_mean": tot[3] / tot[4], "response_lengths": tot[5] / count,
                   "fraction_of_samples_properly_ended": tot[6] / count, "advantages_mean": tot[7] / tot[4],
                   "actor_loss": loss_sums[0], "critic_loss": loss_sums[1], "clipfrac": loss_sums[2], "entropy": loss_sums[3],
                   "explained_var": explained_variance(old_values, gae.returns, mask), "grad_norm": grad_norm, "lr": lr,
                   "generate": exp.timers["generate"], "reward": exp.timers["reward"], "logprobs": exp.timers["logprobs"],
                   "train": train_time, "step_time": time.perf_counter() - t_step, "peak_memory_mb": peak_memory_mb(plan.device),
                   **exp.engine_stats}
        metrics = {k: float(v) for k, v in metrics.items()}
        run.log_metrics(step, metrics)
        if world.is_main and (step % cfg.trainer.log_interval == 0 or step == cfg.trainer.max_steps):
            print(summary_line(step, cfg.trainer.max_steps, metrics, ("rewards", "init_policy_kl", "critic_loss", "explained_var")), flush=True)
        if cfg.checkpoint.save_interval and step % cfg.checkpoint.save_interval == 0:  # every rank: it gathers their streams
            trainstate.save(run.checkpoint_dir, step, {"policy": policy, "critic": critic}, {"policy": actor_opt, "critic": critic_opt},
                            {"sampler": sampler}, position, expect, world=world)

    if world.is_main and eval_idx:
        with plan.autocast():
            after = evaluate(backend, policy, tokenizer, [prompts[i] for i in eval_idx], [prompt_ids[i] for i in eval_idx], sampling, cfg.eval.seed, score, task)
        drift = abs(parameter_checksum(reference) - reference_checksum)
        run.log_metrics(cfg.trainer.max_steps, {**{f"eval_{k}_after": v for k, v in after.items()}, "reference_drift": drift})
        log.info("after RL: %s", " ".join(f"{k}={v:.3f}" for k, v in after.items()))

# ---- save and register (main rank)
if world.is_main:
    out_policy = save_checkpoint(policy, run.output_dir("policy"), tokenizer)
    out_critic = save_checkpoint(critic.model, run.output_dir("critic"), tokenizer)
    run.register_outputs({"policy": out_policy, "critic": out_critic}, {"steps": cfg.trainer.max_steps})
distributed.close(world)
