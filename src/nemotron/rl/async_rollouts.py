"""Asynchronous rollouts (issue 46): a generator process samples the next steps' responses while the trainer
trains, at most `max_trajectory_age_steps` policy updates behind.

The trainer drives everything. Step j's job says which prompts to answer and with which weights: those after
update max(start, j - 1 - age), where `age` is max_trajectory_age_steps. So the lag is the same whatever either
side's speed, and a run is reproducible from its seed; age 0 is the synchronous run, bit for bit. Weights pass
through `age + 1` shared-memory slots on this host: version v goes to slot v % (age + 1) after update v, which
only the job of step v read before (the trainer has its rollouts, so that read is over). The generator sends
back each batch with the frozen reference's logprobs of it, the version that sampled it, its random stream's
state after it (what a checkpoint saves) and how long it waited for work.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.multiprocessing as mp
from transformers import PreTrainedModel

from nemotron.config.offpolicy import AsyncGRPO
from nemotron.config.stepconfig import Generation
from nemotron.rl import distributed
from nemotron.rl.experience import Experience, PromptBatch, ScoreFn, finish, prompt_rows, reference_logprobs
from nemotron.rl.rollout import Rollout
from nemotron.runtime.devices import DevicePlan
from nemotron.runtime.faults import slow

if TYPE_CHECKING:
    from nemotron.rl.stages import Rollouts

log = logging.getLogger("nemotron")
Slots = list[dict[str, torch.Tensor]]


@dataclass(frozen=True)
class GeneratorSpec:
    """What the generator process builds its sampler from (picklable: it crosses a spawn)."""

    policy_path: str
    generation: Generation
    plan: DevicePlan
    num_threads: int
    sampler_state: torch.Tensor


@dataclass(frozen=True)
class Job:
    step: int
    version: int
    rows: list[list[int]]


@dataclass(frozen=True)
class Generated:
    step: int
    version: int
    rollout: Rollout
    ref_logprobs: torch.Tensor
    sampler_state: torch.Tensor
    generate_s: float
    idle_s: float


@dataclass
class Lag:
    """One step's asynchronous statistics; NeMo-RL's name where it has one."""

    avg_trajectory_age: float
    max_trajectory_age: float
    generator_idle_s: float
    trainer_idle_s: float


def trajectory_ages(trainer_version: int, policy_version: torch.Tensor) -> torch.Tensor:
    """``(B,)`` how many updates each sample's policy is behind the trainer's: ``trainer_version - version``."""
    return trainer_version - policy_version


def schedule_version(step: int, age: int, start: int) -> int:
    """The weights step `step` samples with: those after update ``step - 1 - age``, never before `start` (a
    resumed run has no older ones)."""
    return max(start, step - 1 - age)


def share(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A shared-memory CPU copy of `model`'s state dict."""
    return {k: v.detach().to("cpu", copy=True).share_memory_() for k, v in model.state_dict().items()}


def _generator_main(spec: GeneratorSpec, slots: Slots, jobs: Any, results: Any, parent: int) -> None:
    """The generator process: build the sampler, then answer jobs until None. An error goes back as text."""
    try:
        from nemotron.models.checkpoint import load_policy, load_tokenizer
        from nemotron.rl.experience import sampling_params
        from nemotron.rl.generation_backends import get_backend

        torch.set_num_threads(spec.num_threads)
        plan = spec.plan
        tokenizer = load_tokenizer(spec.policy_path)
        model = load_policy(spec.policy_path, device=plan.device, dtype=plan.dtype)
        model.requires_grad_(False)
        # the frozen reference starts where the policy does: its logprobs are taken here, off the trainer's path
        reference = load_policy(spec.policy_path, device=plan.device, dtype=plan.dtype)
        reference.eval()
        reference.requires_grad_(False)
        params = sampling_params(spec.generation, tokenizer, stop_strings=spec.generation.stop_strings)
        backend = get_backend(spec.generation)
        sampler = torch.Generator(device=plan.device)
        sampler.set_state(spec.sampler_state)
        loaded = -1
        while True:
            t0 = time.perf_counter()
            job = _next_job(jobs, parent)
            idle = time.perf_counter() - t0
            if job is None:
                return
            if job.version != loaded:
                model.load_state_dict(slots[job.version % len(slots)])
                loaded = job.version
            t0 = time.perf_counter()
            with plan.autocast():
                rollout = backend.generate(model, job.rows, params, sampler)
            generate_s = time.perf_counter() - t0
            slow("generate")
            with plan.autocast(), torch.no_grad():
                ref = reference_logprobs(reference, rollout, params.temperature).cpu()
            cpu = Rollout(**{k: _cpu(v) for k, v in vars(rollout).items()})
            results.put(Generated(job.step, job.version, cpu, ref, sampler.get_state(), generate_s, idle))
    except BaseException:  # the trainer raises it, with this process's traceback
        results.put(traceback.format_exc())


def _next_job(jobs: Any, parent: int) -> Job | None:
    """The next job; None at the end, or when the trainer is gone (killed: nothing will ask again)."""
    while True:
        try:
            job: Job | None = jobs.get(timeout=1.0)
            return job
        except queue.Empty:
            if os.getppid() != parent:
                return None


def _cpu(value: Any) -> Any:
    return value.cpu() if isinstance(value, torch.Tensor) else value


@dataclass
class AsyncRollouts:
    """The trainer's side: starts the generator, hands it jobs and weights, turns its batches into
    `Experience`. `rollouts` is the step's `stages.Rollouts` (its prompt stream, models, sampler state)."""

    rollouts: Rollouts
    age: int
    start: int
    total: int
    process: Any = None
    jobs: Any = None
    results: Any = None
    slots: Slots = field(default_factory=list)
    batches: dict[int, PromptBatch] = field(default_factory=dict)
    lag: Lag | None = None
    first_position: int = 0  # the prompt stream's position at step start + 1

    @contextmanager
    def running(self) -> Iterator[AsyncRollouts]:
        r = self.rollouts
        self.first_position = r.position
        ctx = mp.get_context("spawn")
        self.jobs, self.results = ctx.Queue(), ctx.Queue()
        policy = r.models.policy
        self.slots = [share(policy) for _ in range(self.age + 1)]
        spec = GeneratorSpec(
            r.policy_path, r.generation, r.plan, torch.get_num_threads(), r.sampler.get_state()
        )
        self.process = ctx.Process(
            # not a daemon: a generator on vLLM may start processes of its own
            target=_generator_main,
            args=(spec, self.slots, self.jobs, self.results, os.getpid()),
        )
        self.process.start()
        log.info(
            "generator process (pid %d) started, max_trajectory_age_steps=%d", self.process.pid, self.age
        )
        self._publish(self.start, policy)
        for step in range(self.start + 1, self.start + 2 + self.age):
            self._ask(step, self.start)
        try:
            yield self
        finally:
            self.jobs.put(None)
            self.process.join(timeout=10)
            if self.process.is_alive():
                self.process.kill()

    def _publish(self, version: int, policy: torch.nn.Module) -> None:
        slot = self.slots[version % len(self.slots)]
        with torch.no_grad():
            for k, v in policy.state_dict().items():
                slot[k].copy_(v)

    def _ask(self, step: int, version: int) -> None:
        if step > self.total:
            return
        r = self.rollouts
        batch = r.batch_at(self.first_position + (step - self.start - 1) * r.per_step)
        self.batches[step] = batch
        self.jobs.put(Job(step, version, prompt_rows(batch, r.n)))

    def _receive(self) -> tuple[Generated, float]:
        t0 = time.perf_counter()
        while True:
            try:
                got = self.results.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.process.is_alive():
                    raise RuntimeError(f"the generator process died (exit {self.process.exitcode})") from None
        if isinstance(got, str):
            raise RuntimeError(f"the generator process failed:\n{got}")
        return got, time.perf_counter() - t0

    def collect(self, score: ScoreFn, step: int) -> Experience:
        """Step `step`'s rollouts: the generator's batch, scored, with the reference's logprobs and, when an
        older policy sampled it, the trainer's own (the loss's old logprobs; the importance weights' numerator)."""
        r = self.rollouts
        got, waited = self._receive()
        if got.step != step:
            raise RuntimeError(f"the generator answered step {got.step}, the trainer is at step {step}")
        current = step - 1
        if current - got.version > self.age:
            raise RuntimeError(
                f"step {step}: samples of version {got.version} exceed the age bound {self.age}"
            )
        batch = self.batches.pop(step)
        rollout = Rollout(**{k: _to(v, r.plan.device) for k, v in vars(got.rollout).items()})
        setup = r.setup(score)
        stale = got.version != current
        with r.plan.autocast():
            recompute = r.backend.recomputes_logprobs or stale
            exp = finish(setup, batch, rollout, got.generate_s, recompute, got.ref_logprobs.to(r.plan.device))
        exp.policy_version = torch.full((len(exp.scores),), got.version, device=exp.scores.device)
        r.show_first(exp)
        r.position += r.per_step
        r.sampler.set_state(got.sampler_state)  # what a checkpoint after this step saves
        ages = trajectory_ages(current, exp.policy_version).double()
        means = distributed_means(r.world, ages, got.idle_s, waited)
        # every rank follows the same schedule, so its own max is the global one
        self.lag = Lag(means[0], float(ages.max()), means[1], means[2])
        return exp

    def metrics(self) -> dict[str, float]:
        """The last step's `Lag`, as metrics."""
        return dataclasses.asdict(self.lag) if self.lag else {}

    def published(self, step: int, policy: PreTrainedModel) -> None:
        """After update `step`: its weights go to their slot, and the job `age + 1` steps ahead is asked for
        with them."""
        slow("train")
        self._publish(step, policy)
        self._ask(step + 1 + self.age, schedule_version(step + 1 + self.age, self.age, self.start))


def _to(value: Any, device: torch.device) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def distributed_means(world: distributed.World, ages: torch.Tensor, *seconds: float) -> list[float]:
    """The mean age over the global batch, then each of `seconds` averaged over ranks."""
    local = torch.tensor(
        [float(ages.sum()), float(len(ages)), *seconds], dtype=torch.float64, device=ages.device
    )
    total = distributed.all_reduce_sum(local, world)
    return [float(total[0] / total[1]), *(float(x) / world.size for x in total[2:].tolist())]


@dataclass
class SyncRollouts:
    """The synchronous run's rollouts behind the same calls: sampled in this process at each step."""

    rollouts: Rollouts
    lag: Lag | None = None

    @contextmanager
    def running(self) -> Iterator[SyncRollouts]:
        yield self

    def collect(self, score: ScoreFn, step: int) -> Experience:
        return self.rollouts.collect(score)

    def published(self, step: int, policy: PreTrainedModel) -> None:
        """Nothing to send: the next rollout samples from `policy` itself."""

    def metrics(self) -> dict[str, float]:
        return {}


def rollout_source(
    rollouts: Rollouts, asynchronous: AsyncGRPO, start: int, total: int
) -> SyncRollouts | AsyncRollouts:
    """The step's rollouts, sampled in this process or (async_grpo.enabled) by a generator process."""
    if not asynchronous.enabled:
        return SyncRollouts(rollouts)
    return AsyncRollouts(rollouts, asynchronous.max_trajectory_age_steps, start, total)
