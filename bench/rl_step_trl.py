"""TRL's RLOOTrainer and GRPOTrainer on the benchmark's workload, timed step by step through a callback.

trl is a benchmark-only dependency, imported here only; ``trl_version()`` says whether it is installed.
"""

from __future__ import annotations

import importlib.metadata
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rl_step_common import BenchModels, StepTiming, Workload

TRL_REQUIREMENT = "trl==1.16.*"
INSTALL_HINT = f'pip install -c requirements.lock "{TRL_REQUIREMENT}"   (brings datasets and accelerate)'

log = logging.getLogger(__name__)


def trl_version() -> str | None:
    try:
        return importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        return None


class _PhaseClock:
    """Seconds spent in each phase of the current step, and the tokens it generated."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.seconds = {"generate": 0.0, "reward": 0.0, "logprobs": 0.0}
        self.prompt_tokens = 0
        self.generated_tokens = 0


def _timed_trainer(base: type[Any], clock: _PhaseClock) -> type[Any]:
    """A subclass of a TRL trainer that adds the time of its generate, reward and no-grad logprob calls to
    ``clock``. It only measures: each override calls the trainer's own method with the same arguments."""

    class Timed(base):  # type: ignore[misc]  # base is a TRL trainer class, known at run time
        def _generate_single_turn(self, prompt_ids: list[list[int]], *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = super()._generate_single_turn(prompt_ids, *args, **kwargs)
            clock.seconds["generate"] += time.perf_counter() - start
            # RLOOTrainer returns the completion ids, GRPOTrainer (ids, logprobs).
            completions = out[0] if isinstance(out, tuple) else out
            clock.prompt_tokens += sum(len(p) for p in prompt_ids)
            clock.generated_tokens += sum(len(c) for c in completions)
            return out

        def _calculate_rewards(self, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = super()._calculate_rewards(*args, **kwargs)
            clock.seconds["reward"] += time.perf_counter() - start
            return out

        def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
            # Without grad these are the rollout phase's forwards (old and reference logprobs); with grad it
            # is the training forward, which belongs to "train".
            timed = not torch.is_grad_enabled()
            start = time.perf_counter()
            out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            if timed:
                clock.seconds["logprobs"] += time.perf_counter() - start
            return out

    Timed.__name__ = f"Timed{base.__name__}"
    return Timed


def run_trl(
    workload: Workload,
    models: BenchModels,
    steps: int,
    seed: int,
    workdir: Path,
    between_steps: Callable[[], None],
) -> list[StepTiming]:
    """Train TRL's trainer for ``steps`` optimizer steps; return the timing of each.

    ``between_steps`` runs after each TRL step, outside the timed interval: the caller runs its own step
    there, so the two alternate step by step and other load on the machine skews both alike.
    """
    import transformers
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer
    from trl.trainer.rloo_config import RLOOConfig
    from trl.trainer.rloo_trainer import RLOOTrainer

    transformers.utils.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    clock = _PhaseClock()
    timings: list[StepTiming] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            clock.reset()
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            total, cpu = time.perf_counter() - self.start, time.process_time() - self.cpu_start
            timings.append(
                StepTiming(
                    total=total,
                    cpu=cpu,
                    prompt_tokens=clock.prompt_tokens,
                    generated_tokens=clock.generated_tokens,
                    **clock.seconds,
                )
            )
            between_steps()

    common: dict[str, Any] = {
        "output_dir": tempfile.mkdtemp(prefix="trl-", dir=workdir),  # nothing is saved there
        "use_cpu": True,
        "bf16": False,
        "fp16": False,
        # TRL turns gradient checkpointing on by default; it recomputes the forward, which ours does not.
        "gradient_checkpointing": False,
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 10_000,
        "disable_tqdm": True,
        "max_steps": steps,
        "seed": seed,
        "learning_rate": workload.lr,
        "lr_scheduler_type": "constant",
        "max_grad_norm": 1.0,
        "weight_decay": 0.0,
        "per_device_train_batch_size": workload.rows,
        "gradient_accumulation_steps": 1,
        "num_generations": workload.group_size,
        "max_completion_length": workload.max_new_tokens,
        # Every response runs to max_completion_length (EOS is suppressed until then): equal work with ours.
        "generation_kwargs": {"min_new_tokens": workload.max_new_tokens},
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "beta": workload.kl_coef,
        "num_iterations": 1,
        "epsilon": 0.2,
        # Same prompts, in the same order, as ours takes them.
        "shuffle_dataset": False,
        "disable_dropout": True,
        "dataloader_num_workers": 0,
    }
    if workload.algorithm == "rloo":
        config: Any = RLOOConfig(**common)
        base: type[Any] = RLOOTrainer
    else:
        # "dapo" averages over the tokens of the whole batch, as our token-level loss does.
        config = GRPOConfig(**common, loss_type="dapo", scale_rewards="group")
        base = GRPOTrainer

    def reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        return models.reward(prompts, completions)

    reward.__name__ = "tiny_reward_model"
    trainer = _timed_trainer(base, clock)(
        model=models.load_policy(),
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": models.prompts}),
        processing_class=models.tokenizer,
        callbacks=[StepTimer()],
    )
    trainer.remove_callback(PrinterCallback)  # it prints every log dict to stdout
    threads = torch.get_num_threads()
    trainer.train()
    if torch.get_num_threads() != threads:
        log.warning("TRL changed torch's thread count from %d to %d", threads, torch.get_num_threads())
    return timings
