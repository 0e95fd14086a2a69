"""What the supervised steps (sft, rm/train) share: a seeded held-out split, a model from the `model.*`
architecture with a tokenizer trained on the data, and each rank's random batches."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from transformers import PreTrainedModel, PreTrainedTokenizerFast

from nemotron.models.tiny import build_model
from nemotron.models.tokenizer import train_tokenizer

T = TypeVar("T")


def held_out_split(
    records: Sequence[T], fraction: float, seed: int, at_least: int = 0
) -> tuple[list[T], list[T]]:
    """(validation, train): a seeded shuffle of `records`, the first `fraction` of it (at least `at_least`)
    held out."""
    shuffled = random.Random(seed).sample(list(records), len(records))
    n_val = max(at_least, int(len(records) * fraction))
    return shuffled[:n_val], shuffled[n_val:]


def from_architecture(
    kind: Literal["policy", "reward_model"], arch: Any, corpus: Iterable[str], seed: int
) -> tuple[PreTrainedTokenizerFast, PreTrainedModel]:
    """A tokenizer trained on `corpus` and a randomly initialised `kind` model of the `model.*` group's
    architecture (family, n_layer, n_embd, n_head, n_positions), its special tokens the tokenizer's."""
    tokenizer = train_tokenizer(corpus, model_max_length=arch.n_positions)
    model = build_model(
        kind, len(tokenizer), arch.n_layer, arch.n_embd, arch.n_head, arch.n_positions, seed,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, family=arch.family,
    )  # fmt: skip
    return tokenizer, model


@dataclass
class RankBatches(Generic[T]):
    """This rank's share of each global batch: `global_batch // world_size` records (at least one) drawn
    without replacement from `train` by the rank's own seeded stream."""

    train: list[T]
    global_batch: int
    world_size: int
    seed: int
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    @property
    def per_rank(self) -> int:
        return max(1, self.global_batch // self.world_size)

    def next(self) -> list[T]:
        return self.rng.sample(self.train, min(self.per_rank, len(self.train)))

    def skip(self, steps: int) -> None:
        """Draw and drop `steps` batches: where a run resumed after that many steps continues."""
        for _ in range(steps):
            self.next()
