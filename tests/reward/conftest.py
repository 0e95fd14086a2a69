"""Shared fixtures: a tiny word-level tokenizer and a random tiny GPT-2 reward model, built offline."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator

import pytest
import torch
import tritonclient.http as triton_http
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from nemotron.models.tiny import tiny_model
from nemotron.models.tokenizer import word_tokenizer
from nemotron.reward.batcher import BatchingConfig
from nemotron.reward.scorer import Scorer, scorer_from_reward_model
from nemotron.reward.server import serve
from nemotron.reward.transport import ServerHandle

WORDS = "the a movie film was is great good bad awful fine plot acting boring fun loved hated it and but very".split()


def build_tokenizer() -> PreTrainedTokenizerFast:
    return word_tokenizer(WORDS)


def build_reward_model(vocab_size: int, seed: int = 0) -> PreTrainedModel:
    return tiny_model(vocab_size, "reward_model", seed=seed, eos_token_id=2)


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


@pytest.fixture(scope="session")
def reward_model(tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    torch.set_num_threads(1)
    return build_reward_model(len(tokenizer))


@pytest.fixture(scope="session")
def model_scorer(reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> Scorer:
    return scorer_from_reward_model(reward_model, tokenizer, max_length=32)


@pytest.fixture
def model_server(model_scorer: Scorer) -> Iterator[ServerHandle]:
    with serve(
        model_scorer,
        batching=BatchingConfig(max_batch_size=16, preferred_batch_size=8, max_queue_delay_ms=20.0),
    ) as handle:
        yield handle


@pytest.fixture
def triton_client() -> Iterator[Callable[[ServerHandle], triton_http.InferenceServerClient]]:
    """Makes tritonclient clients for a server; closes them and collects them here, in the main thread,
    because their gevent-based __del__ fails when the garbage collector runs it from another thread."""
    clients: list[triton_http.InferenceServerClient] = []

    def make(handle: ServerHandle) -> triton_http.InferenceServerClient:
        clients.append(triton_http.InferenceServerClient(handle.url.removeprefix("http://")))
        return clients[-1]

    yield make
    for client in clients:
        client.close()
    clients.clear()
    gc.collect()
