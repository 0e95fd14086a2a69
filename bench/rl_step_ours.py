"""One rollout + update step of our engine, as steps/rl/reinforce/step.py (REINFORCE/RLOO) and
steps/rl/rlhf/step.py (GRPO) run it, with the job record, metrics and checkpoints left out."""

from __future__ import annotations

import time

import torch
from rl_step_common import BenchModels, StepTiming, Workload

from nemotron.config.stepconfig import Optim
from nemotron.rl.advantages import grpo_advantages, rloo_baseline
from nemotron.rl.distributed import World
from nemotron.rl.experience import Experience, PromptBatch, RolloutSetup, collect
from nemotron.rl.generation_backends import get_backend
from nemotron.rl.kl import kl_penalty
from nemotron.rl.losses import kl_loss, ppo_clip_loss, reinforce_loss
from nemotron.rl.masks import mean_denominator
from nemotron.rl.optim import build_optimizer, optimizer_step
from nemotron.rl.rollout import SamplingParams, sequence_logprobs

# The step scripts' defaults: REINFORCE with k1 KL per token in the reward and a token-level loss; GRPO with
# leave-one-out, std-normalised advantages, ratio clip 0.2 and k3 KL in a token-level loss.
_CLIP = 0.2
_STD_FLOOR = 1e-3


class OurRLStep:
    """Our policy, reference, optimizer and sampler for one workload; ``step()`` runs and times one step.

    Prompts are taken in file order, ``prompts_per_step`` at a time, as TRL takes them with
    ``shuffle_dataset=False``, so both sides train on the same prompts at every step.
    """

    def __init__(self, workload: Workload, models: BenchModels, seed: int) -> None:
        self.workload = workload
        self.models = models
        self.policy = models.load_policy()
        self.reference = models.load_policy().requires_grad_(False)  # loaded in eval mode
        self.optim = Optim.model_validate({"lr": workload.lr, "clip_grad": 1.0})
        self.optimizer = build_optimizer(self.policy.parameters(), self.optim)
        tokenizer = models.tokenizer
        assert tokenizer.pad_token_id is not None
        # No EOS id: every response runs to max_new_tokens, the same work TRL does with min_new_tokens.
        self.sampling = SamplingParams(
            max_new_tokens=workload.max_new_tokens, temperature=1.0, pad_token_id=tokenizer.pad_token_id
        )
        # models.prompts are already in the policy's template (encode_prompt would apply it again).
        self.prompt_ids = [tokenizer.encode(p, add_special_tokens=False) for p in models.prompts]
        self.setup = RolloutSetup(
            backend=get_backend("torch"),
            policy=self.policy,
            reference=self.reference,
            tokenizer=tokenizer,
            params=self.sampling,
            generator=torch.Generator().manual_seed(seed),
            n=workload.group_size,
            score=self._score,
        )
        self.world = World()
        self.steps_done = 0

    def step(self) -> StepTiming:
        start, cpu_start = time.perf_counter(), time.process_time()
        k = self.workload.prompts_per_step
        first = (self.steps_done * k) % len(self.models.prompts)
        batch = [(first + i) % len(self.models.prompts) for i in range(k)]
        self.steps_done += 1
        prompts = PromptBatch(
            [self.models.prompts[i] for i in batch], [self.prompt_ids[i] for i in batch], batch
        )
        exp = collect(self.setup, prompts)
        if self.workload.algorithm == "rloo":
            self._reinforce_update(exp)
        else:
            self._grpo_update(exp)
        total, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        prompt_tokens = int(exp.attention_mask[:, : exp.prompt_width].sum())
        return StepTiming(
            total=total,
            cpu=cpu,
            generate=exp.timers["generate"],
            reward=exp.timers["reward"],
            logprobs=exp.timers["logprobs"],
            prompt_tokens=prompt_tokens,
            generated_tokens=int(exp.mask.sum()),
        )

    def _score(self, rows: list[list[int]], prompts: list[str], responses: list[str]) -> list[float]:
        return self.models.reward(prompts, responses)

    def _reinforce_update(self, exp: Experience) -> None:
        """REINFORCE with the RLOO baseline; KL to the reference (k1, summed per token) in the reward."""
        kl = kl_penalty(exp.logprobs, exp.ref_logprobs, "k1")
        rewards = exp.scores - self.workload.kl_coef * (kl * exp.mask).sum(dim=1)
        advantages = rewards - rloo_baseline(exp.group, rewards, exp.is_end)
        self.policy.train()
        normaliser = mean_denominator(exp.mask, "token")
        logp = sequence_logprobs(self.policy, exp.sequences, exp.attention_mask, 1.0, exp.prompt_width)
        torch.autograd.backward(reinforce_loss(logp, advantages, exp.mask, "token", normaliser))
        optimizer_step(self.policy, self.optimizer, self.steps_done, self.optim, self.world)

    def _grpo_update(self, exp: Experience) -> None:
        """GRPO: group-normalised leave-one-out advantages, clipped surrogate, k3 KL in the loss."""
        advantages = grpo_advantages(exp.group, exp.scores, None, True, True, _STD_FLOOR)
        self.policy.train()
        normaliser = mean_denominator(exp.mask, "token")
        logp = sequence_logprobs(self.policy, exp.sequences, exp.attention_mask, 1.0, exp.prompt_width)
        clipped = ppo_clip_loss(
            logp, exp.logprobs, advantages, exp.mask, _CLIP, _CLIP, None, "token", normaliser
        )
        kl_term = kl_loss(
            logp,
            exp.ref_logprobs,
            exp.mask,
            self.workload.kl_coef,
            "k3",
            level="token",
            normaliser=normaliser,
        )
        torch.autograd.backward(clipped.loss + kl_term)
        optimizer_step(self.policy, self.optimizer, self.steps_done, self.optim, self.world)
