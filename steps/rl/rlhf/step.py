"""rl/rlhf: NeMo-RL's GRPO scored by a judge. A group of generations per prompt, group-normalised
(leave-one-out) advantages, a clipped surrogate loss and a k3 KL to the reference policy in the loss.

The judge is a served reward model (judge.kind=reward_model) or a generative judge behind an OpenAI-compatible
chat endpoint (judge.kind=generative). backend=nemo_rl hands the whole run to NeMo-RL in its container.
`main()` reads top to bottom: setup -> inputs -> models -> (resume) -> loop of rollout, score, update, report
-> evaluate -> save and register.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedModel

from nemotron.reward.server_options import token_from_file
from nemotron.rl import distributed, stages
from nemotron.rl.advantages import grpo_advantages
from nemotron.rl.async_rollouts import rollout_source
from nemotron.rl.distributed import World
from nemotron.rl.experience import Experience, ScoreFn, micro_batches
from nemotron.rl.importance import step_correction
from nemotron.rl.kl import kl_penalty
from nemotron.rl.losses import kl_loss, ppo_clip_loss
from nemotron.rl.masks import LossLevel, mean_denominator
from nemotron.rl.optim import build_optimizer, optimizer_step
from nemotron.rl.reward_source import reward_source
from nemotron.rl.rollout import SamplingParams, sequence_logprobs
from nemotron.rl.stats import DeviceSums, global_means, global_sums
from nemotron.runtime.devices import DevicePlan
from nemotron.runtime.step import StepRun, required

if TYPE_CHECKING:  # mypy reads steps/ as a package root; at run time StepRun loads schema.py beside this file
    from rl.rlhf.schema import Config, Judge, LossFn

log = logging.getLogger("nemotron")
JUDGE_MODEL = "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model"


@dataclass
class LossSums(DeviceSums):
    """Sums over mini-batch updates and micro-batches."""

    actor_loss: torch.Tensor
    kl_loss: torch.Tensor
    clipfrac: torch.Tensor


@dataclass
class GRPOStats:
    """One step's training statistics; the field names are NeMo-RL's metric names where it has them."""

    advantages_mean: float
    advantages_abs_mean: float
    actor_loss: float
    kl_loss: float
    clipfrac: float
    grad_norm: float
    lr: float


@contextmanager
def judge(
    j: Judge, model: str | None, run: StepRun[Any], plan: DevicePlan, judge_stats: dict[str, float]
) -> Iterator[tuple[ScoreFn, str]]:
    """The score function: a served reward model, or a generative judge through chat completions (whose
    counters it copies into `judge_stats` after every call)."""
    judge_log = run.job_dir / "logs" / "judge.log"
    token = token_from_file(j.token_file)  # else the client's $NEMOTRON_REWARD_TOKEN
    if j.kind == "reward_model":
        with reward_source(
            "server", model, j.url, token, j.timeout_s, 5, log_path=judge_log, device=str(plan.device)
        ) as pair:
            yield pair
        return
    from nemotron.reward.judge import JudgeClient
    from nemotron.reward.sibling import external_url, sibling_server
    from nemotron.reward.vllm_serve import vllm_judge_server

    device = "cuda" if plan.device.type == "cuda" else "cpu"
    if external_url(j.url):
        server = _given(j.url, token)
    elif j.server == "vllm":  # `vllm serve` beside the trainer (docs/vllm.md)
        server = vllm_judge_server(
            required(model, JUDGE_MODEL), log_path=judge_log, memory=j.vllm_gpu_memory_utilization
        )
    else:
        server = sibling_server(
            required(model, JUDGE_MODEL),
            module="nemotron.reward.chat_server",
            log_path=judge_log,
            device=device,
        )
    with server as (url, token):
        client = JudgeClient(
            url,
            j.prompt_template,
            token=token,
            timeout=j.timeout_s,
            parse_retries=j.max_retries,
            default_score=j.default_score,
            guided_choice=j.guided_choice,
            pairwise_template=j.pairwise_template,
        )

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


def update(
    policy: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    exp: Experience,
    advantages: torch.Tensor,
    step: int,
    cfg: Config,
    sampling: SamplingParams,
    plan: DevicePlan,
    world: World,
    weights: torch.Tensor | None,
) -> tuple[LossSums, int, float, float]:
    """Optimizer steps over mini-batches of the global batch (train_global_batch_size), each the sum of its
    micro-batches; the KL to the reference is in the loss, `weights` (importance weights, or None) weigh each
    token's policy loss. Returns (loss sums, updates, grad norm, lr)."""
    lf: LossFn = cfg.loss_fn
    level: LossLevel = "token" if lf.token_level_loss else "sequence"
    per_update = cfg.policy.train_global_batch_size or len(advantages) * world.size
    local_update = max(1, per_update // world.size)
    sums = LossSums.zeros(plan.device)
    grad_norm, lr = 0.0, 0.0
    policy.train()
    for rows in micro_batches(len(advantages), local_update):
        normaliser = distributed.all_reduce_sum(mean_denominator(exp.mask[rows], level), world)
        indices = range(len(advantages))[rows]
        for mb in micro_batches(len(indices), cfg.policy.train_micro_batch_size):
            idx = slice(indices.start + mb.start, indices.start + mb.stop)
            with plan.autocast():
                logp = sequence_logprobs(
                    policy,
                    exp.sequences[idx],
                    exp.attention_mask[idx],
                    sampling.temperature,
                    exp.prompt_width,
                )
                clipped = ppo_clip_loss(
                    logp,
                    exp.logprobs[idx],
                    advantages[idx],
                    exp.mask[idx],
                    lf.ratio_clip_min,
                    lf.ratio_clip_max,
                    lf.ratio_clip_c,
                    level,
                    normaliser,
                    None if weights is None else weights[idx],
                )
                kl_term = kl_loss(
                    logp,
                    exp.ref_logprobs[idx],
                    exp.mask[idx],
                    lf.reference_policy_kl_penalty,
                    lf.kl_estimator,
                    level=level,
                    normaliser=normaliser,
                )
            (clipped.loss + kl_term).backward()
            sums.actor_loss += clipped.loss.detach()
            sums.kl_loss += kl_term.detach()
            sums.clipfrac += clipped.clipfrac
        grad_norm, lr = optimizer_step(
            policy, optimizer, step, cfg.policy.optimizer, world, cfg.grpo.max_num_steps
        )
    updates = max(1, -(-len(advantages) // local_update))
    return sums, updates, grad_norm, lr


def main() -> None:
    # ---- setup: validated config, device, process group, threads, seeds
    run: StepRun[Config] = StepRun.start(__file__)
    cfg = run.config
    plan, world = stages.start(cfg.backend, cfg.runtime, "NeMo-RL's GRPO")
    total = cfg.grpo.max_num_steps
    policy_path = required(cfg.policy.model_name, "policy.model_name")

    # ---- inputs and models: the prompts, the policy and its frozen reference
    rollouts = stages.Rollouts.build(
        policy_path,
        required(cfg.data.train.data_path, "data.train.data_path"),
        cfg.policy.generation,
        cfg.grpo.num_generations_per_prompt,
        cfg.grpo.num_prompts_per_step,
        plan,
        world,
        cfg.runtime.seed,
    )
    policy, sampling = rollouts.models.policy, rollouts.sampling
    optimizer = build_optimizer(policy.parameters(), cfg.policy.optimizer)
    validation = cfg.data.validation.data_path  # NeMo-RL's validation prompts, else the training prompts
    evaluation = stages.BeforeAfter(
        run,
        rollouts,
        cfg.eval,
        stages.validation_prompts(validation, rollouts),
        cfg.grpo.val_period,
    )
    judge_model = cfg.env.nemo_gym.genrm_model.responses_api_models.vllm_model.model

    # ---- resume
    checkpoints = stages.Checkpoints.of_rollouts(
        run, cfg.checkpoint, rollouts, {"policy": policy}, {"policy": optimizer}
    )
    start_step, rollouts.position = checkpoints.resume()

    judge_stats: dict[str, float] = {}
    source = rollout_source(rollouts, cfg.grpo.async_grpo, start_step, total)
    # the generator process starts first: its start-up overlaps the judge's
    with source.running(), judge(cfg.judge, judge_model, run, plan, judge_stats) as (score_fn, described):
        log.info("rewards from %s", described)
        evaluation.before(score_fn, start_step)
        for step in range(start_step + 1, total + 1):
            t_step = time.perf_counter()
            # ---- rollout: a group of generations per prompt (here, or by the generator process)
            exp = source.collect(score_fn, step)
            # ---- score: group-normalised advantages
            g = cfg.grpo
            advantages = grpo_advantages(
                exp.group, exp.scores, None, g.use_leave_one_out_baseline, g.normalize_rewards, g.std_floor
            )

            # ---- update, with the off-policy correction when it is on; then the weights to the generator
            t0 = time.perf_counter()
            weights, correction = step_correction(exp, cfg.loss_fn, world)
            sums, updates, grad_norm, lr = update(
                policy, optimizer, exp, advantages, step, cfg, sampling, plan, world, weights
            )
            source.published(step, policy)
            train_time = time.perf_counter() - t0

            # ---- report: metrics averaged over ranks (NeMo-RL names where they exist), then the checkpoint
            kl = kl_penalty(exp.logprobs, exp.ref_logprobs, cfg.loss_fn.kl_estimator)
            means = global_means(
                world,
                len(advantages),
                advantages_mean=advantages.sum(),
                advantages_abs_mean=advantages.abs().sum(),
            )
            stats = GRPOStats(
                **means, **global_sums(world, updates, **vars(sums)), grad_norm=grad_norm, lr=lr
            )
            metrics = rollouts.metrics(
                exp, exp.scores, kl, stats, (train_time, t_step), judge_stats, correction, source.metrics()
            )
            run.report(step, total, metrics, ("rewards", "init_policy_kl", "actor_loss", "response_lengths"))
            evaluation.periodic(score_fn, step)
            checkpoints.maybe_save(step, rollouts.position)

        # ---- evaluate
        evaluation.after(score_fn, total)

    # ---- save and register (main rank)
    stages.save_and_register(run, world, {"policy": policy}, rollouts.tokenizer, {"steps": total})


if __name__ == "__main__":
    main()
