"""The ``generation.backend`` seam: which engine samples rollouts (our torch sampler, or vLLM in this process).

Trainers call ``get_backend(config.generation).generate(...)`` and never import an engine directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import torch
from transformers import PreTrainedModel

from nemotron.config.stepconfig import GenerationEngine
from nemotron.errors import NotFound, did_you_mean
from nemotron.rl.rollout import Rollout, SamplingParams, generate


@runtime_checkable
class GenerationBackend(Protocol):
    """Samples a batch of responses from a policy."""

    name: str
    # True when the trainer must recompute the rollout's logprobs with the policy (another engine sampled them).
    recomputes_logprobs: bool

    def generate(
        self,
        model: PreTrainedModel,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Rollout:
        """The contract of ``nemotron.rl.rollout.generate`` for prompts given as token-id lists (what every
        engine takes; a left-padded tensor batch is only our torch sampler's)."""
        ...


class TorchBackend:
    """The built-in sampler: the policy's own forward pass with a KV cache, in this process."""

    name = "torch"
    recomputes_logprobs = False
    generate = staticmethod(generate)


def vllm_backend(generation: GenerationEngine | None = None) -> GenerationBackend:
    """vLLM in this process (`nemotron.rl.vllm_backend`); exit 2 with the way to install it when it is missing.
    Without a `generation` group, the group's defaults."""
    from nemotron.rl.vllm_backend import VLLMBackend

    settings = generation if generation is not None else GenerationEngine(backend="vllm")
    return VLLMBackend(
        gpu_memory_utilization=settings.vllm_gpu_memory_utilization,
        max_model_len=settings.vllm_max_model_len,
    )


def torch_backend(generation: GenerationEngine | None = None) -> GenerationBackend:
    return TorchBackend()


BACKENDS: dict[str, Callable[[GenerationEngine | None], GenerationBackend]] = {
    "torch": torch_backend,
    "vllm": vllm_backend,
}
"""Backend name -> factory of the `generation` config group. A factory raises ``UserError`` when its engine cannot
run here."""


def get_backend(generation: GenerationEngine | str) -> GenerationBackend:
    """The generation backend a `generation` config group names (or a bare backend name, with default settings).

    Raises:
        NotFound: unknown name (with a did-you-mean suggestion).
        UserError: the backend exists but cannot run on this machine.
    """
    name = generation if isinstance(generation, str) else str(generation.backend)
    factory = BACKENDS.get(name)
    if factory is None:
        raise NotFound(
            f"unknown generation backend {name!r}{did_you_mean(name, BACKENDS)}",
            hint="known backends: " + ", ".join(sorted(BACKENDS)),
        )
    return factory(None if isinstance(generation, str) else generation)
