"""Importance weights of the off-policy correction (NeMo-RL v0.7.0's semantics) and the losses they weight,
against hand values."""

from __future__ import annotations

import math

import pytest
import torch

from nemotron.rl.importance import importance_weights
from nemotron.rl.losses import ppo_clip_loss, reinforce_loss

# Row 0: weights 2, 1, 1/4 (all valid). Row 1: weights 3, 1 and a padding token (masked) whose log ratio is 0.
TRAINER = torch.tensor([[math.log(2), 0.0, math.log(0.25)], [math.log(3), 0.0, 0.0]])
GENERATOR = torch.zeros(2, 3)
MASK = torch.tensor([[True, True, True], [True, True, False]])  # 5 valid tokens


def weights(
    truncation: str | None, ratio: float | None = None, low: float | None = None
) -> tuple[list[list[float]], float]:
    w = importance_weights(TRAINER, GENERATOR, MASK, truncation, ratio, low)  # type: ignore[arg-type]
    return [[round(x, 4) for x in row] for row in w.weights.tolist()], round(float(w.out_of_bounds), 4)


def test_untruncated_weights_are_the_probability_ratio() -> None:
    assert weights(None) == ([[2.0, 1.0, 0.25], [3.0, 1.0, 1.0]], 0.0)


def test_tis_clamps_to_zero_and_the_ratio_by_default() -> None:
    # 3 > 2.5 is clamped: 1 of the 5 valid tokens is out of bounds
    assert weights("tis", 2.5) == ([[2.0, 1.0, 0.25], [2.5, 1.0, 1.0]], 0.2)


def test_tis_with_a_lower_bound() -> None:
    # 1/4 < 0.5 is raised to 0.5 and 3 lowered to 2.5: 2 of 5
    assert weights("tis", 2.5, 0.5) == ([[2.0, 1.0, 0.5], [2.5, 1.0, 1.0]], 0.4)


def test_icepop_zeroes_the_tokens_outside_the_bounds() -> None:
    assert weights("icepop", 2.5, 0.5) == ([[2.0, 1.0, 0.0], [0.0, 1.0, 1.0]], 0.4)


def test_seq_mask_tis_drops_whole_responses_by_their_geometric_mean_over_valid_tokens() -> None:
    # row 0: (2 * 1 * 1/4) ** (1/3) = 0.794, inside [0.7, 1.5]: kept with its raw token weights;
    # row 1: (3 * 1) ** (1/2) = 1.732 > 1.5: dropped (with its padding token in the mean it would be 3 ** (1/3) =
    # 1.442 and kept). One response of two out of bounds.
    assert weights("seq-mask-tis", 1.5, 0.7) == ([[2.0, 1.0, 0.25], [0.0, 0.0, 0.0]], 0.5)


def test_an_infinite_or_undefined_weight_counts_zero() -> None:
    trainer = torch.tensor([[0.0, float("nan")]])
    generator = torch.tensor([[-math.inf, 0.0]])
    w = importance_weights(trainer, generator, torch.ones(1, 2, dtype=torch.bool))
    assert w.weights.tolist() == [[0.0, 0.0]]


def test_agreeing_engines_weigh_exactly_one_and_leave_the_loss_bit_for_bit() -> None:
    logp = torch.tensor([[-0.3, -1.7, -0.2]], requires_grad=True)
    old = torch.tensor([[-0.5, -1.1, -0.2]])
    w = importance_weights(old, old.clone(), ONES3, "tis", 2.0).weights
    assert w.tolist() == [[1.0, 1.0, 1.0]]
    plain = ppo_clip_loss(logp, old, torch.tensor([0.7]), ONES3, 0.2, 0.28, 3.0)
    weighted = ppo_clip_loss(logp, old, torch.tensor([0.7]), ONES3, 0.2, 0.28, 3.0, weights=w)
    assert torch.equal(plain.loss, weighted.loss)


ONES3 = torch.ones(1, 3, dtype=torch.bool)


def test_weights_multiply_each_tokens_clipped_loss() -> None:
    # ratio 1 (logp == old): per-token loss -A, weighted: -1 * 2 = -2 and +1 * 0.5 = 0.5, token mean -0.75
    logp = torch.zeros(2, 1, requires_grad=True)
    out = ppo_clip_loss(
        logp, torch.zeros(2, 1), torch.tensor([1.0, -1.0]), torch.ones(2, 1, dtype=torch.bool),
        weights=torch.tensor([[2.0], [0.5]]),
    )  # fmt: skip
    assert out.loss.item() == pytest.approx(-0.75)


def test_weights_multiply_each_tokens_reinforce_loss() -> None:
    # -logp * A * w: -(-1) * 1 * 2 = 2 and -(-2) * 1 * 3 = 6, token mean 4
    loss = reinforce_loss(
        torch.tensor([[-1.0], [-2.0]]), torch.tensor([1.0, 1.0]), torch.ones(2, 1, dtype=torch.bool),
        weights=torch.tensor([[2.0], [3.0]]),
    )  # fmt: skip
    assert loss.item() == pytest.approx(4.0)
