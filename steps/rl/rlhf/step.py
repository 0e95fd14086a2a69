"""rl/rlhf: NeMo-RL's GRPO scored by a judge. A group of generations per prompt, group-normalised
(leave-one-out) advantages, a clipped surrogate loss and a k3 KL to the reference policy in the loss.

The judge is a served reward model (judge.kind=reward_model) or a generative judge behind an OpenAI-compatible
chat endpoint (judge.kind=generative). backend=nemo_rl hands the whole run to NeMo-RL in its container.
"""

import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from nemotron.data.jsonl import read_jsonl
from nemotron.data.records import PromptRecord, prompt_text
from nemotron.devices import peak_memory_mb
from nemotron.errors import UserError
from nemotron.metrics import summary_line
from nemotron.models.checkpoint import load_policy, load_tokenizer, save_checkpoint
from nemotron.models.tokenizer import encode_prompt
from nemotron.rl import distributed, trainstate
from nemotron.rl.advantages import grpo_advantages
from nemotron.rl.evaluation import evaluate, parameter_checksum
from nemotron.rl.experience import ScoreFn, collect, micro_batches, prompt_schedule, sampling_params
from nemotron.rl.generation_backends import get_backend
from nemotron.rl.kl import kl_penalty, sequence_kl
from nemotron.rl.losses import kl_loss, ppo_clip_loss
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
    raise UserError("backend=nemo_rl runs NeMo-RL's GRPO inside the NeMo-RL container on GPUs; submit it with a Slurm or "
                    "Lepton profile (-b PROFILE). `--dry-run` shows the NeMo-RL config and command it would run.")
plan, world = distributed.start(cfg.runtime)  # device, process group, threads, seeds

# ---- inputs
records = read_jsonl(cfg.data.train.data_path, PromptRecord)
prompts = [prompt_text(r.prompt) for r in records]  # text for judges and task scorers; the ids below are the model's
tokenizer = load_tokenizer(cfg.policy.model_name)
prompt_ids = [encode_prompt(tokenizer, r.prompt) for r in records]
judge_model = cfg.env.nemo_gym.genrm_model.responses_api_models.vllm_model.model
n = cfg.grpo.num_generations_per_prompt
task = get_task(cfg.eval.task) if cfg.eval.task else None

# ---- models
policy = plan.prepare(load_policy(cfg.policy.model_name, device=plan.device, dtype=plan.dtype))
prompt_ids = fit_prompts(prompt_ids, model_positions(policy.config), cfg.policy.generation.max_new_tokens)
reference = load_policy(cfg.policy.model_name, device=plan.device, dtype=plan.dtype).eval().requires_grad_(False)
reference_checksum = parameter_checksum(reference)
optimizer = build_optimizer(policy.parameters(), cfg.policy.optimizer)
backend = get_backend(cfg.policy.generation)  # our torch sampler, or vLLM in this process
sampling = sampling_params(cfg.policy.generation, tokenizer)
sampler = plan.generator(cfg.runtime.seed * 1000 + world.rank)

# ---- resume
expect = trainstate.fingerprints(run.record["config"], cfg.policy.model_name)
start_step, position = trainstate.maybe_resume(run.job_dir, run.record["step"], cfg.checkpoint, {"policy": policy}, {"policy": optimizer},
                                               {"sampler": sampler}, expect, world)

judge_stats: dict[str, float] = {}


@contextmanager
def judge() -> Iterator[tuple[ScoreFn, str]]:
    """The score function: a served reward model, or a generative judge through chat completions."""
    j = cfg.judge
    if j.kind == "reward_model":
        with reward_source("server", judge_model, j.url, j.token, j.timeout_s, 5, log_path=run.job_dir / "logs" / "judge.log", device=str(plan.device)) as pair:
            yield pair
        return
    from nemotron.reward.judge import JudgeClient
    from nemotron.reward.sibling import external_url, sibling_server
    from nemotron.reward.vllm_serve import vllm_judge_server

    device = "cuda" if plan.device.type == "cuda" else "cpu"
    judge_log = run.job_dir / "logs" / "judge.log"
    if external_url(j.url):
        server = _given(j.url, j.token)
    elif j.server == "vllm":  # `vllm serve` beside the trainer (docs/vllm.md)
        server = vllm_judge_server(judge_model, log_path=judge_log)
    else:
        server = sibling_server(judge_model, module="nemotron.reward.chat_server", log_path=judge_log, device=device)
    with server as (url, token):
        client = JudgeClient(url, j.prompt_template, token=token, timeout=j.timeout_s, parse_retries=j.max_retries,
                             default_score=j.default_score, guided_choice=j.guided_choice, pairwise_template=j.pairwise_template)

        def score(rows: list[list[int]], texts: list[str], responses: list[str]) -> Sequence[float]:
            if j.mode == "pairwise":
                out = client.score_groups(texts, responses, j.comparison_strategy)
            else:
                out = client.score_many(texts, responses)
            judge_stats.update(client.metrics())
            return out

        yield score, f"generative judge {url}"


@contextmanager
def _given(url: str | None, token: str | None) -> Iterator[tuple[str, str | None]]:
    from nemotron.reward.server import TOKEN_ENV
    from nemotron.reward.sibling import external_url

    given = external_url(url)
    assert given is not None
    yield given, token or os.environ.get(TOKEN_ENV)


with judge() as (score, described):
    log.info("rewards from %s", described)
    eval_idx = list(range(min(cfg.eval.num_prompts, len(prompts))))
    if world.is_main and eval_idx and start_step == 0:
        with plan.autocast():
            before = evaluate(backend, policy, tokenizer, [prompts[i] for i in eval_idx], [prompt_ids[i] for i in eval_idx], sampling, cfg.eval.seed, score, task)
        run.log_metrics(0, {f"eval_{k}_before": v for k, v in before.items()})
        log.info("before RL: %s", " ".join(f"{k}={v:.3f}" for k, v in before.items()))

    for step in range(start_step + 1, cfg.grpo.max_num_steps + 1):
        t_step = time.perf_counter()
        # ---- rollout phase: a group of generations per prompt
        batch = distributed.shard(prompt_schedule(len(prompts), cfg.runtime.seed, position, cfg.grpo.num_prompts_per_step), world)
        position += cfg.grpo.num_prompts_per_step
        with plan.autocast():
            exp = collect(backend, policy, reference, tokenizer, [prompts[i] for i in batch], [prompt_ids[i] for i in batch], 0, n, sampling, sampler, score)
        group = plan.tensor(batch).repeat_interleave(n)
        advantages = grpo_advantages(group, exp.scores, None, cfg.grpo.use_leave_one_out_baseline, cfg.grpo.normalize_rewards, cfg.grpo.std_floor)

        # ---- optimisation phase: optimizer steps over mini-batches of the global batch; KL in the loss
        t0 = time.perf_counter()
        policy.train()
        level = "token" if cfg.loss_fn.token_level_loss else "sequence"
        lf = cfg.loss_fn
        per_update = cfg.policy.train_global_batch_size or len(advantages) * world.size
        local_update = max(1, per_update // world.size)
        sums = torch.zeros(3, device=plan.device)  # actor loss, kl loss, clipfrac
        grad_norm, lr = 0.0, 0.0
        for update in micro_batches(len(advantages), local_update):
            normaliser = distributed.all_reduce_sum(mean_denominator(exp.mask[update], level), world)
            rows = range(len(advantages))[update]
            for mb in micro_batches(len(rows), cfg.policy.train_micro_batch_size):
                idx = slice(rows.start + mb.start, rows.start + mb.stop)
                with plan.autocast():
                    logp = sequence_logprobs(policy, exp.sequences[idx], exp.attention_mask[idx], sampling.temperature, exp.prompt_width)
                    clipped = ppo_clip_loss(logp, exp.logprobs[idx], advantages[idx], exp.mask[idx], lf.ratio_clip_min,
                                            lf.ratio_clip_max, lf.ratio_clip_c, level, normaliser)
                    kl_term = kl_loss(logp, exp.ref_logprobs[idx], exp.mask[idx], lf.reference_policy_kl_penalty, lf.kl_estimator,
                                      level=level, normaliser=normaliser)
                (clipped.loss + kl_term).backward()
                sums += torch.stack([clipped.loss.detach(), kl_term.detach(), clipped.clipfrac])
            grad_norm, lr = optimizer_step(policy, optimizer, step, cfg.policy.optimizer, world, cfg.grpo.max_num_steps)
        train_time = time.perf_counter() - t0

        # ---- metrics (NeMo-RL names where they exist)
        updates = max(1, -(-len(advantages) // local_update))
        loss_sums = distributed.all_reduce_sum(sums, world) / updates
        kl = kl_penalty(exp.logprobs, exp.ref_logprobs, lf.kl_estimator)
        local = torch.stack([exp.scores.sum(), sequence_kl(kl, exp.mask).sum(), advantages.sum(), advantages.abs().sum(),
                             exp.response_lengths.float().sum(), exp.is_end.float().sum(), plan.tensor(float(len(advantages)))])
        tot = distributed.all_reduce_sum(local, world)
        count = float(tot[-1])
        metrics = {"rewards": tot[0] / count, "init_policy_kl": tot[1] / count, "advantages_mean": tot[2] / count,
                   "advantages_abs_mean": tot[3] / count, "response_lengths": tot[4] / count,
                   "fraction_of_samples_properly_ended": tot[5] / count, "actor_loss": loss_sums[0], "kl_loss": loss_sums[1],
                   "clipfrac": loss_sums[2], "grad_norm": grad_norm, "lr": lr, "generate": exp.timers["generate"],
                   "reward": exp.timers["reward"], "logprobs": exp.timers["logprobs"], "train": train_time,
                   "step_time": time.perf_counter() - t_step, "peak_memory_mb": peak_memory_mb(plan.device), **exp.engine_stats, **judge_stats}
        metrics = {k: float(v) for k, v in metrics.items()}
        run.log_metrics(step, metrics)
        if world.is_main:
            print(summary_line(step, cfg.grpo.max_num_steps, metrics, ("rewards", "init_policy_kl", "actor_loss", "response_lengths")), flush=True)
        if cfg.checkpoint.save_interval and step % cfg.checkpoint.save_interval == 0:  # every rank: it gathers their streams
            trainstate.save(run.checkpoint_dir, step, {"policy": policy}, {"policy": optimizer}, {"sampler": sampler}, position, expect, world=world)

    if world.is_main and eval_idx:
        with plan.autocast():
            after = evaluate(backend, policy, tokenizer, [prompts[i] for i in eval_idx], [prompt_ids[i] for i in eval_idx], sampling, cfg.eval.seed, score, task)
        drift = abs(parameter_checksum(reference) - reference_checksum)
        run.log_metrics(cfg.grpo.max_num_steps, {**{f"eval_{k}_after": v for k, v in after.items()}, "reference_drift": drift})
        log.info("after RL: %s", " ".join(f"{k}={v:.3f}" for k, v in after.items()))

# ---- save and register (main rank)
if world.is_main:
    out = save_checkpoint(policy, run.output_dir("policy"), tokenizer)
    run.register_outputs({"policy": out}, {"steps": cfg.grpo.max_num_steps})
distributed.close(world)
