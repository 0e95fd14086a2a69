"""The stages the RL steps share: starting (refusing the NeMo-RL backend locally), the prompts, the actor with its
frozen reference, the rollout of one step's prompts, before/after evaluation, checkpoints, and saving."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from nemotron.config.backends import RUNS_AS_STEP_PROCESS
from nemotron.config.stepconfig import (
    Checkpointing,
    Evaluation,
    Generation,
    RewardSource,
    RLConfig,
    TrainRuntime,
)
from nemotron.data.jsonl import read_jsonl
from nemotron.data.records import PromptRecord, prompt_text
from nemotron.errors import UserError
from nemotron.models.checkpoint import load_policy, load_tokenizer, save_checkpoint
from nemotron.models.prompts import fit_prompts, model_positions
from nemotron.models.tokenizer import encode_prompt
from nemotron.reward.server_options import token_from_file
from nemotron.rl import distributed, trainstate
from nemotron.rl.distributed import World
from nemotron.rl.evaluation import evaluate, parameter_checksum
from nemotron.rl.experience import (
    Experience,
    PromptBatch,
    RolloutSetup,
    ScoreFn,
    collect,
    prompt_schedule,
    sampling_params,
)
from nemotron.rl.generation_backends import GenerationBackend, get_backend
from nemotron.rl.reward_source import reward_source
from nemotron.rl.rollout import SamplingParams
from nemotron.rl.sharding import full_state_dict, full_weights
from nemotron.rl.stats import RolloutStats, Timings, as_metrics
from nemotron.runtime import preempt
from nemotron.runtime.devices import DevicePlan
from nemotron.runtime.step import StepRun, required
from nemotron.tasks import get_task

log = logging.getLogger("nemotron")


def start(backend: str, runtime: TrainRuntime, engine: str = "NeMo-RL") -> tuple[DevicePlan, World]:
    """The device plan and process group of a built-in run, after refusing backend=nemo_rl: that runs in
    NeMo-RL's container on GPUs, never in this process (exit 2 saying how to run it)."""
    if backend not in RUNS_AS_STEP_PROCESS:
        raise UserError(
            f"backend=nemo_rl runs {engine} in its container on GPUs; submit it with a Slurm or Lepton "
            "profile (-b PROFILE). `--dry-run` shows the NeMo-RL config and command it would run."
        )
    return distributed.start(runtime)


@dataclass
class PromptSet:
    """The training prompts: text for judges and task scorers, token ids for the model."""

    texts: list[str]
    ids: list[list[int]]

    @classmethod
    def load(cls, path: str, tokenizer: Any) -> PromptSet:
        records = read_jsonl(path, PromptRecord)
        return cls(
            [prompt_text(r.prompt) for r in records], [encode_prompt(tokenizer, r.prompt) for r in records]
        )

    def fit(self, model: PreTrainedModel, max_new_tokens: int) -> None:
        """Shorten the prompts so that prompt + response fits the model's positions."""
        self.ids = fit_prompts(self.ids, model_positions(model.config), max_new_tokens)

    def pick(self, indices: list[int]) -> PromptBatch:
        return PromptBatch([self.texts[i] for i in indices], [self.ids[i] for i in indices], indices)


@dataclass
class ActorAndReference:
    """The policy RL trains, and the frozen initial policy its KL is measured against."""

    policy: PreTrainedModel
    reference: PreTrainedModel
    reference_checksum: float

    @classmethod
    def load(cls, path: str, plan: DevicePlan) -> ActorAndReference:
        policy = plan.prepare(load_policy(path, device=plan.device, dtype=plan.dtype))
        reference = load_policy(path, device=plan.device, dtype=plan.dtype)
        reference.eval()
        reference.requires_grad_(False)
        return cls(policy, reference, parameter_checksum(reference))

    def reference_drift(self) -> float:
        """How far the reference moved since it was loaded: 0.0 unless something trained it by mistake."""
        return abs(parameter_checksum(self.reference) - self.reference_checksum)


def reward_model_scores(
    run: StepRun[Any], reward: RewardSource, model_path: str | None, plan: DevicePlan
) -> AbstractContextManager[tuple[ScoreFn, str]]:
    """The `reward` config group's score function: a reward server (given or started beside) or in process."""
    server = reward.server
    return reward_source(
        reward.source,
        model_path,
        server.url,
        token_from_file(server.token_file),
        server.timeout_s,
        server.retries,
        log_path=run.job_dir / "logs" / "reward_server.log",
        device=str(plan.device),
    )


@dataclass
class Rollouts:
    """The rollout stage: each step samples `n` responses to this rank's share of the step's prompts, scores
    them and takes the logprobs. Prompts come in one global order (`prompt_schedule`), the same on every rank,
    and `position` is how far the run has read it; each rank samples from its own random stream."""

    backend: GenerationBackend
    generation: Generation
    policy_path: str
    models: ActorAndReference
    tokenizer: Any
    prompts: PromptSet
    n: int
    per_step: int
    sampling: SamplingParams
    sampler: torch.Generator
    plan: DevicePlan
    world: World
    seed: int
    position: int = 0
    shown_first: bool = False

    @classmethod
    def build(
        cls,
        policy_path: str,
        prompts_path: str,
        generation: Generation,
        n: int,
        per_step: int,
        plan: DevicePlan,
        world: World,
        seed: int,
    ) -> Rollouts:
        """The tokenizer and prompts, the actor and its reference, the generation backend (our torch sampler,
        or vLLM in this process) and sampling parameters of the `generation` config group, the sampler's
        stream."""
        # compile refuses this where it places the job, and fsdp with a colocated vLLM (engines/builtin/engine.py);
        # the guard stays for a world that is not the compiled one (a hand-started torchrun): uneven passes hang
        if plan.sharding == "fsdp" and per_step % world.size:
            raise UserError(
                f"runtime.sharding=fsdp: {per_step} prompts a step do not divide over {world.size} ranks; under FSDP "
                "every rank must make the same number of training passes. Use a multiple of the ranks"
            )
        tokenizer = load_tokenizer(policy_path)
        prompts = PromptSet.load(prompts_path, tokenizer)
        models = ActorAndReference.load(policy_path, plan)
        prompts.fit(models.policy, generation.max_new_tokens)
        sampling = sampling_params(generation, tokenizer, stop_strings=generation.stop_strings)
        sampler = plan.generator(seed * 1000 + world.rank)
        return cls(
            get_backend(generation),
            generation,
            policy_path,
            models,
            tokenizer,
            prompts,
            n,
            per_step,
            sampling,
            sampler,
            plan,
            world,
            seed,
        )

    @classmethod
    def of_actor(cls, cfg: RLConfig, n: int, plan: DevicePlan, world: World) -> Rollouts:
        """rl/reinforce's and rl/ppo's rollouts (their shared RLConfig): inputs.policy answers
        inputs.prompts, `trainer.num_prompts_per_step` prompts a step, `n` responses each."""
        return cls.build(
            required(cfg.inputs.policy, "inputs.policy"),
            required(cfg.inputs.prompts, "inputs.prompts"),
            cfg.generation,
            n,
            cfg.trainer.num_prompts_per_step,
            plan,
            world,
            cfg.runtime.seed,
        )

    def batch_at(self, position: int) -> PromptBatch:
        """This rank's share of the `per_step` prompts after `position` in the prompt stream."""
        schedule = prompt_schedule(len(self.prompts.texts), self.seed, position, self.per_step)
        return self.prompts.pick(distributed.shard(schedule, self.world))

    def setup(self, score: ScoreFn) -> RolloutSetup:
        return RolloutSetup(
            backend=self.backend,
            policy=self.models.policy,
            reference=self.models.reference,
            tokenizer=self.tokenizer,
            params=self.sampling,
            generator=self.sampler,
            n=self.n,
            score=score,
        )

    def collect(self, score: ScoreFn) -> Experience:
        """The rollouts of the next `per_step` prompts of the prompt stream."""
        batch = self.batch_at(self.position)
        self.position += self.per_step
        with self.plan.autocast(), full_weights(self.models.policy):
            exp = collect(self.setup(score), batch)
        self.show_first(exp)
        return exp

    def show_first(self, exp: Experience) -> None:
        if self.world.is_main and not self.shown_first:
            # What a chat template or a prompt cut made of the data shows here, before it shows in the rewards.
            log.info("first rollout, as the policy reads it: %s", first_rollout(exp, self.tokenizer))
            self.shown_first = True

    def metrics(
        self,
        exp: Experience,
        scores: torch.Tensor,
        kl: torch.Tensor,
        algorithm: Any,
        times: tuple[float, float],
        *more: Any,
    ) -> dict[str, float]:
        """One step's metrics, averaged over ranks: the rollout's (`scores` as rewarded, `kl` to the initial
        policy), the algorithm's statistics, the timings (`times`: training seconds, and the step's start on
        `time.perf_counter()`), the generation engine's, then `more`."""
        return as_metrics(
            RolloutStats.of(exp, scores, kl, self.world),
            algorithm,
            Timings.of(exp, times[0], times[1], self.plan.device),
            exp.engine_stats,
            *more,
        )


def first_rollout(exp: Experience, tokenizer: Any) -> str:
    """Row 0 of a rollout as the policy read and wrote it: the prompt's tokens (padding dropped) and the response's,
    decoded with their special tokens, and the prompt's length in tokens."""
    width = exp.prompt_width
    prompt = exp.sequences[0, :width][exp.attention_mask[0, :width].bool()].tolist()
    response = exp.sequences[0, width:][exp.mask[0]].tolist()
    return (
        f"prompt {tokenizer.decode(prompt)!r} ({len(prompt)} tokens), response {tokenizer.decode(response)!r}"
    )


def validation_prompts(path: str | None, rollouts: Rollouts) -> PromptSet | None:
    """The validation prompts, shortened like the training prompts to fit the policy; None without a path."""
    if not path:
        return None
    prompts = PromptSet.load(path, rollouts.tokenizer)
    prompts.fit(rollouts.models.policy, rollouts.sampling.max_new_tokens)
    return prompts


@dataclass
class BeforeAfter:
    """Evaluation of the policy on the first `num_prompts` prompts before the first step and after the last,
    on the main rank, logged as `eval_<name>_before` / `eval_<name>_after` (and `reference_drift` after); with a
    `val_period`, also every that many steps as `val_<name>` (NeMo-RL's grpo.val_period). The prompts are the
    validation prompts when given (NeMo-RL's data.validation), else the training prompts."""

    run: StepRun[Any]
    rollouts: Rollouts
    eval_cfg: Evaluation
    validation: PromptSet | None = None
    val_period: int = 0

    def __post_init__(self) -> None:
        self.task = get_task(self.eval_cfg.task) if self.eval_cfg.task else None

    @property
    def prompts(self) -> PromptSet:
        return self.validation or self.rollouts.prompts

    def _evaluate(self, score: ScoreFn) -> dict[str, float]:
        r = self.rollouts
        prompts = self.prompts.pick(list(range(min(self.eval_cfg.num_prompts, len(self.prompts.texts)))))
        with self.run.progress.section("validation"), r.plan.autocast():
            return evaluate(
                r.backend,
                r.models.policy,
                r.tokenizer,
                prompts,
                r.sampling,
                self.eval_cfg.seed,
                score,
                self.task,
            )

    @property
    def active(self) -> bool:
        return self.rollouts.world.is_main and min(self.eval_cfg.num_prompts, len(self.prompts.texts)) > 0

    def _on_main(self, score: ScoreFn) -> dict[str, float] | None:
        """The evaluation on the main rank (None elsewhere). Every rank calls it: a sharded policy is gathered on
        all of them first, so the main rank's passes need no other rank."""
        if min(self.eval_cfg.num_prompts, len(self.prompts.texts)) == 0:
            return None
        with full_weights(self.rollouts.models.policy):
            return self._evaluate(score) if self.active else None

    def periodic(self, score: ScoreFn, step: int) -> None:
        """`val_<name>` at every `val_period`-th step."""
        if self.val_period and step % self.val_period == 0 and (values := self._on_main(score)) is not None:
            self.run.log_metrics(step, {f"val_{k}": v for k, v in values.items()})
            log.info("validation at step %d: %s", step, " ".join(f"{k}={v:.3f}" for k, v in values.items()))

    def before(self, score: ScoreFn, start_step: int) -> None:
        if start_step == 0 and (before := self._on_main(score)) is not None:
            self.run.log_metrics(0, {f"eval_{k}_before": v for k, v in before.items()})
            log.info("before RL: %s", " ".join(f"{k}={v:.3f}" for k, v in before.items()))

    def after(self, score: ScoreFn, last_step: int) -> None:
        if (after := self._on_main(score)) is not None:
            drift = self.rollouts.models.reference_drift()
            self.run.log_metrics(
                last_step, {**{f"eval_{k}_after": v for k, v in after.items()}, "reference_drift": drift}
            )
            log.info("after RL: %s", " ".join(f"{k}={v:.3f}" for k, v in after.items()))


@dataclass
class Checkpoints:
    """What a checkpoint holds: resumed before the first step, saved every `checkpoint.save_interval` steps
    (on every rank: saving gathers each rank's random streams). `start_from` is the model the run starts from,
    which a resumed checkpoint must have started from too (None: a model built from the config)."""

    run: StepRun[Any]
    checkpoint_cfg: Checkpointing
    modules: dict[str, torch.nn.Module]
    optimizers: dict[str, torch.optim.Optimizer]
    world: World
    start_from: str | None
    generators: dict[str, torch.Generator] = field(default_factory=dict)
    started_at: int = 0  # the step this run resumed from (0: a fresh start)

    def __post_init__(self) -> None:
        self.expect = trainstate.fingerprints(self.run.record.config, self.start_from)

    @classmethod
    def of_rollouts(
        cls,
        run: StepRun[Any],
        checkpoint_cfg: Checkpointing,
        rollouts: Rollouts,
        modules: dict[str, torch.nn.Module],
        optimizers: dict[str, torch.optim.Optimizer],
    ) -> Checkpoints:
        """An RL step's: it starts from the rollouts' policy, and its sampler's stream is saved with it."""
        return cls(run, checkpoint_cfg, modules, optimizers, rollouts.world, rollouts.policy_path,
                   {"sampler": rollouts.sampler})  # fmt: skip

    def resume(self) -> tuple[int, int]:
        """(start step, data position): (0, 0) for a fresh run. A restarted job (requeued, preempted) continues
        from its own newest checkpoint, and its metrics.jsonl drops the rows the lost run wrote after it; one
        restarted before its first checkpoint starts over, and drops them all."""
        start, position = trainstate.maybe_resume(
            self.run.job_dir,
            self.run.record.step,
            self.checkpoint_cfg,
            self.modules,
            self.optimizers,
            self.generators,
            self.expect,
            self.world,
        )
        self.started_at = start
        self.run.rewind_metrics(start if start else -1)
        return start, position

    def maybe_save(self, step: int, position: int) -> Path | None:
        """Save every `checkpoint.save_interval` steps, and at once when Slurm warned of the time limit (then
        requeue the job: its next start resumes here)."""
        interval = self.checkpoint_cfg.save_interval
        warned = self._warned()
        if not (interval and step % interval == 0) and not warned:
            return None
        with self.run.progress.section("checkpoint"):
            path = trainstate.save(
                self.run.checkpoint_dir,
                step,
                self.modules,
                self.optimizers,
                self.generators,
                position,
                self.expect,
                world=self.world,
            )
        if warned:
            preempt.handled()
        if warned and step > self.started_at and self.world.is_main:
            # Only a run that made progress requeues, so a time limit shorter than one step cannot loop forever.
            log.info("time limit near: saved %s; requeueing the job to continue from it", path)
            preempt.requeue_self()
        return path

    def _warned(self) -> bool:
        """Whether any rank got Slurm's time-limit warning (ranks get it at slightly different moments; all must
        save together, since saving is a collective)."""
        if self.world.size == 1:
            return preempt.warned()
        device = next(next(iter(self.modules.values())).parameters()).device  # NCCL reduces CUDA tensors only
        mine = torch.tensor([1.0 if preempt.warned() else 0.0], device=device)
        return bool(distributed.all_reduce_sum(mine, self.world).item() > 0)


def save_and_register(
    run: StepRun[Any],
    world: World,
    modules: dict[str, PreTrainedModel],
    tokenizer: Any,
    metadata: dict[str, Any],
) -> None:
    """On the main rank, save each module in HF layout as output `name` and register them all; then leave the
    process group. A sharded module's weights are gathered first (on every rank: a collective). Every rank is in a
    checkpoint section meanwhile (the others wait for the main one), then done."""
    with run.progress.section("checkpoint"):
        states = {name: full_state_dict(module) for name, module in modules.items()}
        if world.is_main:
            paths = {
                name: save_checkpoint(module, run.output_dir(name), tokenizer, state_dict=states[name])
                for name, module in modules.items()
            }
            run.register_outputs(paths, metadata)
        distributed.close(world)
    run.progress.unwatched("done")
