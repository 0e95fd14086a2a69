"""Batched rollouts from a Hugging Face causal LM: sampling with a KV cache, and the one-pass logprobs of a rollout.

Layout of every rollout: left-padded prompts of width ``P``, then right-padded responses of width ``N``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from transformers import PreTrainedModel

from nemotron.rl import gpt2_fast
from nemotron.rl.batch_rows import distinct_prompts, rows_to_keep
from nemotron.rl.decoders import Decoder, decoder_for, lean_forward
from nemotron.rl.logprobs import token_logprobs
from nemotron.rl.stop_strings import completes_stop_string

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How to sample responses.

    Attributes:
        max_new_tokens: the response width limit ``N``.
        temperature: divides the logits before sampling, and in every logprob of the rollout.
        top_k: keep only the k most likely tokens (ties with the k-th are kept); 0 turns it off.
        top_p: keep the smallest set of most likely tokens whose probability reaches ``top_p``; 1.0 turns it off.
        greedy: take the most likely token (temperature, top_k and top_p then only matter for the logprobs).
        eos_token_id: one id or several; a response that emits one stops, and that token is part of it.
        pad_token_id: written after a response has stopped (masked out everywhere).
        stop_strings: a response also stops on the token that completes its first match of one of these in its
            decoded text; that token stays in the response, like vLLM's output tokens (``rl/stop_strings.py``).
        decode: turns response token ids into text; required with ``stop_strings``.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int = 0
    stop_strings: tuple[str, ...] = ()
    decode: Callable[[list[int]], str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        problems = []
        if self.max_new_tokens < 1:
            problems.append(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature > 0.0:
            problems.append(f"temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            problems.append(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            problems.append(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if self.stop_strings and self.decode is None:
            problems.append("stop_strings need a decode callable (token ids -> text)")
        if any(not s for s in self.stop_strings):
            problems.append("stop_strings must not contain an empty string")
        if problems:
            raise ValueError("invalid SamplingParams: " + "; ".join(problems))

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)


@dataclass(frozen=True)
class Rollout:
    """A batch of prompts and their sampled responses.

    ``logprobs[:, t]`` is the logprob of ``responses[:, t]``; it equals
    ``token_logprobs(logits, sequences, temperature)[:, prompt_width - 1 + t]`` of a full forward pass.
    """

    sequences: torch.Tensor
    """``(B, P + N)`` long: left-padded prompt, then the response, right-padded with ``pad_token_id``."""
    attention_mask: torch.Tensor
    """``(B, P + N)`` long: 1 on real prompt tokens and on response tokens up to and including EOS."""
    prompt_lengths: torch.Tensor
    """``(B,)`` long: real (unpadded) prompt lengths."""
    prompt_width: int
    """``P``: the padded prompt width, i.e. where the responses start in ``sequences``."""
    response_mask: torch.Tensor
    """``(B, N)`` bool: generated tokens up to and including EOS (or the token completing a stop string)."""
    response_lengths: torch.Tensor
    """``(B,)`` long: ``response_mask.sum(1)``."""
    is_end: torch.Tensor
    """``(B,)`` bool: stopped on EOS or a stop string; False when truncated at ``max_new_tokens``."""
    logprobs: torch.Tensor
    """``(B, N)`` float32: logprob of each response token under the temperature-scaled, unfiltered
    distribution (top-k/top-p do not renormalise it), so it matches ``sequence_logprobs``; 0 where masked."""

    @property
    def responses(self) -> torch.Tensor:
        """``(B, N)`` long: the response tokens."""
        return self.sequences[:, self.prompt_width :]


def left_pad(prompts: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack token-id lists into a left-padded batch.

    Returns:
        ``(input_ids (B, P) long, attention_mask (B, P) long)`` with ``P`` the longest prompt.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
        attention_mask[row, width - len(prompt) :] = 1
    return input_ids, attention_mask


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set the logits of tokens outside the top-k and the top-p nucleus to -inf (top-k first, then top-p).

    Shapes stay static (no per-row token lists), so this costs the same every step.

    Args:
        logits: shape ``(B, V)``, already divided by the temperature.
        top_k: keep tokens whose logit is at least the k-th largest (so ties with the k-th are kept); 0 = off.
        top_p: keep, in order of decreasing probability, each token whose *preceding* cumulative probability
            (after top-k) is below ``top_p``; the most likely token is always kept; 1.0 = off.

    Returns:
        Shape ``(B, V)``, the same dtype.
    """
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        kept_sorted = _kept_in_sorted_order(sorted_logits, top_k, top_p)
        kept = torch.zeros_like(kept_sorted).scatter(-1, order, kept_sorted)
        return logits.masked_fill(~kept, float("-inf"))
    if 0 < top_k < logits.shape[-1]:
        # topk is several times cheaper than a full sort on CPU.
        kth_largest = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        return logits.masked_fill(logits < kth_largest, float("-inf"))
    return logits


def _kept_in_sorted_order(sorted_logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The tokens ``filter_logits`` keeps, for logits sorted in decreasing order ``(B, V)``; ``(B, V)`` bool.

    Both filters keep a prefix of the sorted order, which lets the sampler draw in sorted order directly.
    """
    kept = torch.ones_like(sorted_logits, dtype=torch.bool)
    if 0 < top_k < sorted_logits.shape[-1]:
        kept = sorted_logits >= sorted_logits[:, top_k - 1 : top_k]
    if top_p < 1.0:
        probs = sorted_logits.masked_fill(~kept, float("-inf")).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        kept = kept & (mass_before < top_p)
        kept[:, 0] = True
    return kept


def sample_next_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row and its logprob.

    Args:
        logits: next-token logits, shape ``(B, V)``.
        params: temperature, top_k, top_p and greedy are used.
        generator: the random stream; unused when greedy.

    Returns:
        ``(tokens (B,) long, logprobs (B,) float32)``: logprobs under ``softmax(logits / temperature)``.
    """
    uniform = None if params.greedy else _uniforms(logits.shape[0], generator, logits.device)
    return _pick_tokens(logits, params, uniform)


def _uniforms(rows: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """``(rows, 1)`` float64 in (0, 1]: ``rand`` is in [0, 1), so a threshold of 0, which would pick a
    zero-probability first token in ``_pick_tokens``, cannot happen."""
    return 1.0 - torch.rand((rows, 1), generator=generator, dtype=torch.float64, device=device)


def _pick_tokens(
    logits: torch.Tensor, params: SamplingParams, uniform: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_next_tokens`` with the random numbers given: ``uniform (B, 1)`` from ``_uniforms``, None if greedy.

    Sampling inverts the cumulative distribution with one uniform per row, instead of one random number per
    vocabulary entry (multinomial's exponential trick), several times cheaper on CPU. A token
    of probability 0 adds nothing to the cumulative sum, so it is never drawn; float64 keeps rounding from
    distorting tiny probabilities.
    """
    scaled = logits.float()
    if params.temperature != 1.0:
        scaled = scaled / params.temperature
    logprobs = scaled.log_softmax(dim=-1)
    if uniform is None:
        tokens = scaled.argmax(dim=-1)
    elif params.top_p == 1.0:
        probs = logprobs.exp() if params.top_k == 0 else filter_logits(scaled, params.top_k).softmax(dim=-1)
        cdf = probs.double().cumsum(dim=-1)
        # The first index whose cdf reaches the threshold = the count of entries below it (the cdf never falls).
        tokens = torch.searchsorted(cdf, uniform * cdf[:, -1:]).squeeze(-1)
    else:
        # One sort serves both filters and the draw: the kept tokens are a prefix of the sorted order.
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        kept = _kept_in_sorted_order(sorted_logits, params.top_k, params.top_p)
        cdf = sorted_logits.softmax(dim=-1).double().masked_fill(~kept, 0.0).cumsum(dim=-1)
        rank = (cdf < uniform * cdf[:, -1:]).sum(dim=-1, keepdim=True)
        tokens = order.gather(-1, rank).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def generate(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]] | torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    attention_mask: torch.Tensor | None = None,
) -> Rollout:
    """Sample one response per prompt, reusing the KV cache, and stop as soon as every response has ended.

    The model runs in eval mode (its previous mode is restored). Same generator state, same rollout.

    Args:
        model: a causal LM taking ``input_ids, attention_mask, position_ids, past_key_values, use_cache``.
        prompts: lists of token ids, or a left-padded ``(B, P)`` long tensor with ``attention_mask``.
        params: see ``SamplingParams``.
        generator: the random stream on the model's device; may be None only when ``params.greedy``.
        attention_mask: ``(B, P)`` for tensor prompts (all ones when None); must be left-padded.

    Returns:
        A ``Rollout`` with ``N <= params.max_new_tokens`` response columns. Its tensors are ordinary tensors
        (not inference tensors), so they can feed a training forward pass.
    """
    if generator is None and not params.greedy:
        raise ValueError("sampling needs a torch.Generator (rollouts must be reproducible); pass one")
    input_ids, prompt_mask = _as_left_padded(prompts, attention_mask, params.pad_token_id)
    device = next(model.parameters()).device
    input_ids, prompt_mask = input_ids.to(device), prompt_mask.to(device)
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions is not None and input_ids.shape[1] + params.max_new_tokens > max_positions:
        raise ValueError(
            f"prompt width {input_ids.shape[1]} + max_new_tokens {params.max_new_tokens} exceeds the model's "
            f"{max_positions} positions"
        )
    with _eval_mode(model), torch.inference_mode():
        decoder = decoder_for(model, input_ids.shape[1] + params.max_new_tokens)
        rollout = _decode_loop(decoder, input_ids, prompt_mask, params, generator)
    # Inference tensors cannot be saved for backward; the trainer feeds these to the policy with autograd on.
    return Rollout(**{f.name: _clone(getattr(rollout, f.name)) for f in fields(Rollout)})


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def _decode_loop(
    decoder: Decoder,
    input_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> Rollout:
    """Sample with ``decoder`` (see `generate`): draw each row's token, end rows on EOS or a stop string, and
    keep in the decoder's batch only the rows that `rows_to_keep` says are worth it."""
    batch, width = input_ids.shape
    limit = params.max_new_tokens
    device = input_ids.device
    prompt_lengths = prompt_mask.sum(dim=1)
    responses = torch.full((batch, limit), params.pad_token_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((batch, limit), dtype=torch.float32, device=device)
    response_mask = torch.zeros((batch, limit), dtype=torch.bool, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    eos_ids = torch.tensor(params.eos_token_ids, dtype=torch.long, device=device)

    prompts = distinct_prompts(input_ids, prompt_mask)
    next_logits = decoder.prefill(prompts.input_ids, prompts.mask)
    if prompts.copies is not None:
        decoder.keep(prompts.copies)
        next_logits = next_logits[prompts.copies]
    # Row i of the model's batch generates rollout row live[i]; finished rows leave the batch (`rows_to_keep`),
    # everything indexed by rollout row stays full size.
    live = torch.arange(batch, device=device)
    steps = limit
    for t in range(limit):
        uniform = None
        if not params.greedy:
            # One draw per rollout row every step, finished or not, so a row's draws never depend on the others.
            uniform = _uniforms(batch, generator, device)
            uniform = uniform if live.numel() == batch else uniform[live]
        tokens, token_logprobs_t = _pick_tokens(next_logits, params, uniform)
        active = ~finished[live]
        responses[live, t] = torch.where(active, tokens, params.pad_token_id)
        logprobs[live, t] = torch.where(active, token_logprobs_t, 0.0)
        response_mask[live, t] = active
        stopped = active & torch.isin(tokens, eos_ids)
        if params.stop_strings:
            assert params.decode is not None  # checked by SamplingParams
            stopped |= completes_stop_string(responses, live, active, t, params.decode, params.stop_strings)
        finished[live] = finished[live] | stopped
        still_going = active & ~stopped
        going = int(still_going.sum())
        if t == limit - 1 or going == 0:
            steps = t + 1
            break
        keep = rows_to_keep(still_going, going)
        if keep is not None:
            decoder.keep(keep)
            live, active = live[keep], active[keep]
        next_logits = decoder.step(responses[live, t : t + 1], active)
    response_mask = response_mask[:, :steps]
    sequences = torch.cat([input_ids, responses[:, :steps]], dim=1)
    logger.debug("rollout: %d rows, %d prompt columns, %d response columns", batch, width, steps)
    return Rollout(
        sequences=sequences,
        attention_mask=torch.cat([prompt_mask, response_mask.long()], dim=1),
        prompt_lengths=prompt_lengths,
        prompt_width=width,
        response_mask=response_mask,
        response_lengths=response_mask.sum(dim=1),
        is_end=finished,
        logprobs=logprobs[:, :steps],
    )


def _as_left_padded(
    prompts: Sequence[Sequence[int]] | torch.Tensor, attention_mask: torch.Tensor | None, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(prompts, torch.Tensor):
        if attention_mask is not None:
            raise ValueError("attention_mask is only for tensor prompts; token-id lists are padded here")
        return left_pad(prompts, pad_token_id)
    if prompts.dim() != 2 or prompts.shape[1] == 0:
        raise ValueError(f"tensor prompts must be (B, P) with P >= 1, got shape {tuple(prompts.shape)}")
    mask = torch.ones_like(prompts) if attention_mask is None else attention_mask.long()
    if mask.shape != prompts.shape:
        raise ValueError(f"attention_mask {tuple(mask.shape)} does not match prompts {tuple(prompts.shape)}")
    # Left padding: each row is zeros then ones, so the mask never decreases along the row.
    if bool((mask[:, 1:] < mask[:, :-1]).any()) or bool((mask[:, -1] == 0).any()):
        raise ValueError("prompts must be left-padded (attention_mask rows: zeros, then at least one 1)")
    return prompts.long(), mask


@contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def response_logits(
    model: PreTrainedModel, sequences: torch.Tensor, attention_mask: torch.Tensor, response_start: int
) -> torch.Tensor:
    """``(B, T - P + 1)`` x vocab logits at the positions that predict the response tokens and the one after.

    ``out[:, t]`` (for ``t < T - P``) is the distribution of ``sequences[:, P + t]``. GPT-2 models run the
    engine's lean forward (`gpt2_fast`), Llama models `llama_fast`; others run ``model(...)``. Grad and train/eval modes are the caller's.
    """
    width = sequences.shape[1] - response_start
    if not 1 <= response_start < sequences.shape[1]:
        raise ValueError(f"response_start must be in [1, {sequences.shape[1]}), got {response_start}")
    positions = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
    # Only the positions that predict response tokens go through the LM head.
    lean = lean_forward(model)
    if lean is not None:
        bias = gpt2_fast.causal_bias(attention_mask, next(model.parameters()).dtype)
        return lean(model, sequences, positions, bias, logits_to_keep=width + 1)
    out: Any = model(
        input_ids=sequences,
        attention_mask=attention_mask,
        position_ids=positions,
        use_cache=False,
        logits_to_keep=width + 1,
    )
    return out.logits[:, -(width + 1) :]  # type: ignore[no-any-return]


def sequence_logprobs(
    model: PreTrainedModel,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    response_start: int,
) -> torch.Tensor:
    """Logprob of each response token in one forward pass (for policy and reference logprobs in training).

    Runs with whatever grad mode and train/eval mode the caller set: wrap it in ``torch.no_grad()`` for the
    reference model; keep autograd on for the policy loss.

    Args:
        model: the causal LM.
        sequences: ``(B, T)`` long, prompt columns then response columns (e.g. ``Rollout.sequences``).
        attention_mask: ``(B, T)``, 1 on real tokens (e.g. ``Rollout.attention_mask``).
        temperature: the sampling temperature; logits are divided by it.
        response_start: ``P``, the first response column (``Rollout.prompt_width``), >= 1.

    Returns:
        ``(B, T - P)`` float32: ``out[:, t]`` is the logprob of ``sequences[:, P + t]`` from the logits at
        ``P + t - 1``; 0 where ``attention_mask`` is 0.
    """
    logits = response_logits(model, sequences, attention_mask, response_start)
    width = logits.shape[1] - 1
    logprobs = token_logprobs(logits, sequences[:, -(width + 1) :], temperature)
    return torch.where(attention_mask[:, response_start:].bool(), logprobs, torch.zeros_like(logprobs))
