"""Fixtures for model tests: the sentiment task's tokenizer and tiny models built from it."""

from __future__ import annotations

from typing import Literal

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from nemotron.models.tiny import tiny_model
from nemotron.models.tokenizer import train_tokenizer
from nemotron.tasks.sentiment import SentimentTask

TINY = {"n_layer": 2, "n_embd": 32, "n_head": 4, "n_positions": 32}


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return train_tokenizer(SentimentTask().corpus(), model_max_length=32)


def tiny(
    tokenizer: PreTrainedTokenizerFast, kind: Literal["policy", "reward_model"], seed: int
) -> PreTrainedModel:
    torch.set_num_threads(1)
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    return tiny_model(len(tokenizer), kind, seed=seed, **TINY, **ids)


@pytest.fixture
def policy(tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    return tiny(tokenizer, "policy", seed=0)


@pytest.fixture
def reward_model(tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    return tiny(tokenizer, "reward_model", seed=1)
