"""The built-in engine: our own torch trainers, run as the step's process on any executor."""

from __future__ import annotations

from nemotron.compile import Job
from nemotron.config.stepconfig import TrainRuntime
from nemotron.config.workload import Rollouts
from nemotron.engines.base import Launch, StepProcess
from nemotron.errors import UserError
from nemotron.plan.placement import Placement


class BuiltinEngine:
    name = "builtin"

    def launch(self, job: Job, where: Placement) -> Launch:
        from nemotron.engines.refusals import builtin_refusals

        refused = builtin_refusals(job.config)
        if refused:
            raise UserError(
                f"these keys act only on backend=nemo_rl; {job.step_id} runs on backend=builtin:", refused
            )
        problems = fsdp_refusals(job, where)
        if len(problems) == 1:
            raise UserError(problems[0])
        if problems:
            raise UserError(f"{job.step_id}: runtime.sharding=fsdp cannot run this job:", problems)
        return StepProcess()


def fsdp_refusals(job: Job, where: Placement) -> list[str]:
    """What FSDP cannot do on the built-in engine, found where the job is placed, before anything is written: a
    colocated vLLM (it loads the whole policy from the trainer's weights, which FSDP shards), prompts that do not
    divide over the ranks (every rank must make the same number of training passes: each is a collective), and
    CPU offload where the job has no GPU to offload from."""
    runtime = getattr(job.config, "runtime", None)
    if not isinstance(runtime, TrainRuntime) or runtime.sharding != "fsdp":
        return []
    problems = []
    declared = getattr(job.config, "workload", None)  # a step's schema says its work (config/workload.py)
    workload = declared() if callable(declared) else None
    if isinstance(workload, Rollouts):
        if workload.vllm_share is not None:
            problems.append(
                "runtime.sharding=fsdp: the job generates on vLLM in the trainer's process, which loads the whole "
                "policy from the trainer's weights, and FSDP shards them; generate with the torch sampler (backend "
                "torch), or use runtime.sharding=ddp"
            )
        ranks = where.nodes * where.ranks_per_node if job.launch == "torchrun" else 1
        if workload.prompts % ranks:
            problems.append(
                f"{workload.prompts_key}={workload.prompts}: under runtime.sharding=fsdp every rank makes the same "
                f"number of training passes, and {workload.prompts} prompts a step do not divide over the job's "
                f"{ranks} ranks; use a multiple of {ranks}"
            )
    if runtime.fsdp_cpu_offload and not _on_a_gpu(job, where, runtime.device):
        problems.append(
            "runtime.fsdp_cpu_offload=true: the job runs on no GPU (the profile has gpus_per_node 0, or this "
            "machine has none), so there is no device memory to offload from; leave it false"
        )
    return problems


def _on_a_gpu(job: Job, where: Placement, device: str) -> bool:
    from nemotron.plan.groups import device_memory  # read from the profile and /proc, never torch

    return device_memory(job.profile, device, where.here)[2]
