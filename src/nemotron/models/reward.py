"""Reward models and critics: building them, scoring sequences, and the Bradley-Terry objective.

The reward model is the backbone's `*ForSequenceClassification` with one label (GPT-2, Llama, Qwen2, Mistral, ...),
read at the last real token (the EOS after the response). PPO's critic is the family's `*ForTokenClassification`
with one label; it starts as a copy of the reward model whose score head is applied at every position, so its
first value estimates are the reward model's own scores.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, PreTrainedModel

from nemotron.models.tiny import build_model, from_config

build_reward_model = partial(build_model, "reward_model")
"""A randomly initialised reward model with a scalar score head: `build_model("reward_model", ...)`. It needs
`pad_token_id`: the model pools the last token that is not padding, and without it transformers refuses batches
larger than one."""


def reward_model_from_policy(policy: PreTrainedModel, seed: int) -> PreTrainedModel:
    """A reward model whose backbone is a copy of `policy`'s and whose score head is new.

    Starting the reward model from the SFT policy, as InstructGPT and NeMo-Aligner do, gives it a
    backbone that already reads the task's text.
    """
    if policy.config.pad_token_id is None:
        raise ValueError("the policy's config has no pad_token_id; the reward model needs one to pool")
    config = policy.config.__class__.from_dict(policy.config.to_dict())
    config.num_labels = 1
    config.architectures = None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = from_config(AutoModelForSequenceClassification, config)
    nn.Module.to(model, dtype=policy.dtype)
    model.base_model.load_state_dict(policy.base_model.state_dict())
    return model


class Critic(nn.Module):
    """PPO's value model: a causal-LM backbone with a linear value head applied at every position.

    It wraps a `*ForTokenClassification` with one label, so `save_checkpoint(critic.model, ...)`
    writes an ordinary Hugging Face checkpoint and `load_critic` reads it back.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        if model.config.num_labels != 1:
            raise ValueError(f"a critic has one value per token, got num_labels={model.config.num_labels}")
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Values at every position.

        Args:
            input_ids: token ids, shape ``(b, t)``, padded on either side.
            attention_mask: 1 for real tokens, 0 for padding, shape ``(b, t)``.

        Returns:
            values, shape ``(b, t)``; positions under padding hold meaningless values.
        """
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
        )
        values: Tensor = out.logits.squeeze(-1).float()
        return values


class SequenceRewards(nn.Module):
    """A reward model as a module whose forward is `sequence_rewards`, so the whole scoring pass is one module call:
    FSDP gathers a sharded module's weights around its forward, and `sequence_rewards` calls the backbone and the
    score head separately."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """scores, shape ``(b,)``, of token ids ``(b, t)`` under ``attention_mask`` ``(b, t)``."""
        return sequence_rewards(self.model, input_ids, attention_mask)


def build_critic_from_reward_model(reward_model: PreTrainedModel) -> Critic:
    """A critic that copies the reward model's backbone and uses its score head as the value head.

    The value head gets a zero bias, so at the last real token the new critic's value equals the
    reward model's score for the same sequence.
    """
    config = reward_model.config.__class__.from_dict(reward_model.config.to_dict())
    config.architectures = None
    config.classifier_dropout = 0.0
    model = from_config(AutoModelForTokenClassification, config)
    nn.Module.to(model, device=reward_model.device, dtype=reward_model.dtype)
    model.base_model.load_state_dict(reward_model.base_model.state_dict())
    head = value_head(model)
    with torch.no_grad():
        head.weight.copy_(score_head(reward_model).weight)
        if head.bias is not None:
            head.bias.zero_()
    return Critic(model)


def score_head(model: PreTrainedModel) -> nn.Linear:
    """The linear score head of a sequence-classification model (`score` in every family)."""
    head = getattr(model, "score", None)
    if not isinstance(head, nn.Linear):
        raise ValueError(f"{type(model).__name__} has no linear score head")
    return head


def value_head(model: PreTrainedModel) -> nn.Linear:
    """The linear head of a token-classification model (`classifier` on GPT-2, `score` on Llama, Qwen2, ...)."""
    head = getattr(model, "classifier", None) or getattr(model, "score", None)
    if not isinstance(head, nn.Linear):
        raise ValueError(
            f"{type(model).__name__} has no linear token-classification head (classifier or score)"
        )
    return head


def sequence_rewards(reward_model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """The reward model's score of each sequence, read at its last real token.

    Pooling follows `attention_mask` rather than the pad id, and positions count only real tokens,
    so a sequence scores the same whether it is padded on the left, the right, or not at all.

    Args:
        input_ids: token ids, shape ``(b, t)``.
        attention_mask: 1 for real tokens, 0 for padding, shape ``(b, t)``; each row has a real token.

    Returns:
        scores, shape ``(b,)``.
    """
    hidden = reward_model.base_model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
    ).last_hidden_state  # (b, t, d)
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    last = (positions * attention_mask.long()).argmax(dim=-1)  # (b,)
    pooled = hidden[torch.arange(input_ids.shape[0], device=input_ids.device), last]  # (b, d)
    scores: Tensor = score_head(reward_model)(pooled).squeeze(-1).float()
    return scores


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Position of each token among the real tokens of its row; padding gets 0.

    Args:
        attention_mask: shape ``(b, t)``, 1 for real tokens.

    Returns:
        position ids, shape ``(b, t)``. ``[[0, 0, 1, 1]]`` gives ``[[0, 0, 0, 1]]``.
    """
    mask = attention_mask.long()
    return ((mask.cumsum(dim=-1) - 1) * mask).clamp(min=0)


def bradley_terry_loss(chosen: Tensor, rejected: Tensor) -> Tensor:
    """Mean negative log-likelihood that each chosen response beats its rejected one.

    Under Bradley-Terry, P(chosen > rejected) = sigmoid(r_chosen - r_rejected).

    Args:
        chosen: reward-model scores of the chosen responses, shape ``(b,)``.
        rejected: scores of the rejected responses, shape ``(b,)``.

    Returns:
        the loss, a scalar: mean of ``-log(sigmoid(chosen - rejected))``.
    """
    return -F.logsigmoid(chosen - rejected).mean()


def pairwise_accuracy(chosen: Tensor, rejected: Tensor) -> Tensor:
    """Fraction of pairs where the chosen response scores strictly higher; a tie counts as wrong.

    Args:
        chosen: scores, shape ``(b,)``.
        rejected: scores, shape ``(b,)``.

    Returns:
        accuracy in [0, 1], a float scalar tensor.
    """
    return (chosen > rejected).float().mean()
