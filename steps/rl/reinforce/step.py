"""rl/reinforce: NeMo-Aligner's REINFORCE with an RLOO baseline and a KL penalty to the initial policy.

Reads top to bottom: config -> inputs -> models -> reward source -> (resume) -> loop of rollout + update ->
save -> register. No critic: the baseline of each response is the mean reward of the other responses to
the same prompt.
"""

import logging
import time

import torch

from nemotron.data.jsonl import read_jsonl
from nemotron.data.records import PromptRecord, prompt_text
from nemotron.devices import peak_memory_mb
from nemotron.errors import UserError
from nemotron.faults import inject
from nemotron.metrics import summary_line
from nemotron.models.checkpoint import load_policy, load_tokenizer, save_checkpoint
from nemotron.models.tokenizer import encode_prompt
from nemotron.rl import distributed, trainstate
from nemotron.rl.advantages import rloo_baseline
from nemotron.rl.evaluation import evaluate, parameter_checksum
from nemotron.rl.experience import collect, micro_batches, prompt_schedule, sampling_params
from nemotron.rl.generation_backends import get_backend
from nemotron.rl.kl import kl_penalty, rewards_with_kl, sequence_kl
from nemotron.rl.losses import reinforce_loss
from nemotron.rl.masks import mean_denominator
from nemotron.rl.optim import build_optimizer, optimizer_step
from nemotron.rl.prompts import fit_prompts, model_positions
from nemotron.rl.reward_source import reward_source
from nemotron.rl.rollout import sequence_logprobs
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
n = cfg.reinforce.num_rollouts_per_prompt
per_step = cfg.trainer.num_prompts_per_step
task = get_task(cfg.eval.task) if cfg.eval.task else None

# ---- models: the actor, and the frozen initial policy it is kept close to
policy = plan.prepare(load_policy(cfg.inputs.policy, device=plan.device, dtype=plan.dtype))
prompt_ids = fit_prompts(prompt_ids, model_positions(policy.config), cfg.generation.max_new_tokens)
reference = load_policy(cfg.inputs.policy, device=plan.device, dtype=plan.dtype).eval().requires_grad_(False)
reference_checksum = parameter_checksum(reference)
optimizer = build_optimizer(policy.parameters(), cfg.optim)
backend = get_backend(cfg.generation)  # our torch sampler, or vLLM in this process
sampling = sampling_params(cfg.generation, tokenizer)
# Each rank samples its own stream; prompts come in one global order (prompt_schedule), the same on every rank.
sampler = plan.generator(cfg.runtime.seed * 1000 + world.rank)

# ---- resume
expect = trainstate.fingerprints(run.record["config"], cfg.inputs.policy)
start_step, position = trainstate.maybe_resume(run.job_dir, run.record["step"], cfg.checkpoint, {"policy": policy}, {"policy": optimizer},
                                               {"sampler": sampler}, expect, world)


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
        # ---- rollout phase (this rank's share of the step's prompts)
        batch = distributed.shard(prompt_schedule(len(prompts), cfg.runtime.seed, position, per_step), world)
        position += per_step
        with plan.autocast():
            exp = collect(backend, policy, reference, tokenizer, [prompts[i] for i in batch], [prompt_ids[i] for i in batch],
                          0, n, sampling, sampler, score)
        exp.group = plan.tensor(batch).repeat_interleave(n)
        inject("rollout", step)
        scores = exp.scores
        if cfg.reinforce.truncated_responses == "zero_reward":
            scores = torch.where(exp.is_end, scores, torch.zeros_like(scores))
        # KL of the sampling policy to the initial policy, folded into the reward (sequence mean or per token)
        kl = kl_penalty(exp.logprobs, exp.ref_logprobs, cfg.reinforce.kl_estimator)
        beta = cfg.reinforce.initial_policy_kl_penalty
        if cfg.reinforce.kl_in == "reward_sequence_mean":
            rewards = rewards_with_kl(scores, kl, exp.mask, beta)
        else:  # per token: the sequence reward minus the discounted sum of per-token penalties
            rewards = scores - beta * (kl * exp.mask).sum(dim=1)
        baseline = rloo_baseline(exp.group, rewards, exp.is_end)
        advantages = rewards - baseline

        # ---- optimisation phase
        t0 = time.perf_counter()
        policy.train()
        level = cfg.reinforce.loss_level
        normaliser = distributed.all_reduce_sum(mean_denominator(exp.mask, level), world)
        actor_loss = torch.zeros((), device=plan.device)
        for _ in range(cfg.reinforce.reinforce_epochs):
            for mb in micro_batches(len(advantages), cfg.trainer.micro_batch_size):
                with plan.autocast():
                    logp = sequence_logprobs(policy, exp.sequences[mb], exp.attention_mask[mb], sampling.temperature, exp.prompt_width)
                    loss = reinforce_loss(logp, advantages[mb], exp.mask[mb], level, normaliser)
                loss.backward()
                actor_loss += loss.detach()
            grad_norm, lr = optimizer_step(policy, optimizer, step, cfg.optim, world, cfg.trainer.max_steps)
        train_time = time.perf_counter() - t0

        # ---- metrics, averaged over ranks (NeMo-Aligner names)
        local = torch.stack([scores.sum(), rewards.sum(), sequence_kl(kl, exp.mask).sum(), baseline.sum(), advantages.sum(),
                             exp.response_lengths.float().sum(), exp.is_end.float().sum(), plan.tensor(float(len(scores)))])
        tot = distributed.all_reduce_sum(local, world)
        count = float(tot[-1])
        metrics = {"rewards": tot[0] / count, "rewards_with_kl": tot[1] / count, "init_policy_kl": tot[2] / count,
                   "baseline": tot[3] / count, "advantages_mean": tot[4] / count, "response_lengths": tot[5] / count,
                   "fraction_of_samples_properly_ended": tot[6] / count,
                   "actor_loss": float(distributed.all_reduce_sum(actor_loss, world)) / cfg.reinforce.reinforce_epochs,
                   "grad_norm": grad_norm, "lr": lr, "generate": exp.timers["generate"], "reward": exp.timers["reward"],
                   "logprobs": exp.timers["logprobs"], "train": train_time, "step_time": time.perf_counter() - t_step,
                   "peak_memory_mb": peak_memory_mb(plan.device), **exp.engine_stats}
        metrics = {k: float(v) for k, v in metrics.items()}
        run.log_metrics(step, metrics)
        if world.is_main and (step % cfg.trainer.log_interval == 0 or step == cfg.trainer.max_steps):
            print(summary_line(step, cfg.trainer.max_steps, metrics, ("rewards", "init_policy_kl", "actor_loss", "response_lengths")), flush=True)
        if cfg.checkpoint.save_interval and step % cfg.checkpoint.save_interval == 0:  # every rank: it gathers their streams
            trainstate.save(run.checkpoint_dir, step, {"policy": policy}, {"policy": optimizer},
                            {"sampler": sampler}, position, expect, world=world)

    if world.is_main and eval_idx:
        with plan.autocast():
            after = evaluate(backend, policy, tokenizer, [prompts[i] for i in eval_idx], [prompt_ids[i] for i in eval_idx], sampling, cfg.eval.seed, score, task)
        drift = abs(parameter_checksum(reference) - reference_checksum)
        run.log_metrics(cfg.trainer.max_steps, {**{f"eval_{k}_after": v for k, v in after.items()}, "reference_drift": drift})
        log.info("after RL: %s", " ".join(f"{k}={v:.3f}" for k, v in after.items()))

# ---- save and register (main rank)
if world.is_main:
    out = save_checkpoint(policy, run.output_dir("policy"), tokenizer)
    run.register_outputs({"policy": out}, {"steps": cfg.trainer.max_steps})
distributed.close(world)
