"""PPO, value, REINFORCE and KL losses against hand values, and global-batch normalisation."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from nemotron.rl.losses import kl_loss, ppo_clip_loss, reinforce_loss, value_loss
from nemotron.rl.masks import LOSS_LEVELS, LossLevel, mean_denominator

ONES = torch.ones(1, 3, dtype=torch.bool)


def ppo(
    ratio: list[float],
    adv: list[float],
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
) -> tuple[float, float, torch.Tensor]:
    """PPO loss, clipfrac and d loss / d logp for one sequence whose old logprobs are 0."""
    logp = torch.tensor([[math.log(x) for x in ratio]], requires_grad=True)
    mask = ONES[:, : len(ratio)]
    out = ppo_clip_loss(
        logp, torch.zeros_like(logp), torch.tensor([adv]), mask, clip_eps, clip_eps_high, dual_clip
    )
    (grad,) = torch.autograd.grad(out.loss, logp)
    return out.loss.item(), out.clipfrac.item(), grad


def test_ppo_clipped_surrogate_hand_values() -> None:
    # eps 0.2 -> clip range [0.8, 1.2]; per token -min(r A, clip(r) A):
    #   A = 1,  r = 0.5: min(0.5, 0.8) = 0.5   -> -0.5
    #   A = -1, r = 1:   min(-1, -1) = -1      -> 1
    #   A = 2,  r = 1.5: min(3, 2.4) = 2.4     -> -2.4
    # mean (-0.5 + 1 - 2.4) / 3 = -1.9 / 3 = -0.6333 ; ratios outside the range: 0.5 and 1.5 -> clipfrac 2/3
    loss, clipfrac, grad = ppo([0.5, 1.0, 1.5], [1.0, -1.0, 2.0], clip_eps=0.2)
    assert loss == pytest.approx(-1.9 / 3, abs=1e-6)
    assert clipfrac == pytest.approx(2 / 3)
    # d/dlogp of -r A / 3 = -r A / 3 where the unclipped term is chosen; 0 for the clipped third token
    torch.testing.assert_close(grad, torch.tensor([[-0.5 / 3, 1 / 3, 0.0]]))


def test_ppo_dual_clip_caps_negative_advantages() -> None:
    # eps 0.2, c = 3:
    #   A = -1, r = 5:   standard max(5, 1.2) = 5, dual min(5, 3 * 1) = 3
    #   A = -1, r = 0.5: standard max(0.5, 0.8) = 0.8, below the cap 3 -> 0.8
    #   A = 1,  r = 5:   -min(5, 1.2) = -1.2 ; positive advantages are never dual-clipped
    # mean (3 + 0.8 - 1.2) / 3 = 2.6 / 3 ; without the dual clip (5 + 0.8 - 1.2) / 3 = 4.6 / 3
    loss, _, grad = ppo([5.0, 0.5, 5.0], [-1.0, -1.0, 1.0], clip_eps=0.2, dual_clip=3.0)
    assert loss == pytest.approx(2.6 / 3, abs=1e-6)
    # the dual-clipped token is a constant -c A: no gradient (token 2 is also clipped; token 1 clips at 0.8)
    torch.testing.assert_close(grad, torch.zeros(1, 3))
    plain, _, _ = ppo([5.0, 0.5, 5.0], [-1.0, -1.0, 1.0], clip_eps=0.2)
    assert plain == pytest.approx(4.6 / 3, abs=1e-6)


def test_ppo_dual_clip_must_exceed_one() -> None:
    with pytest.raises(ValueError, match="dual_clip"):
        ppo([1.0], [1.0], dual_clip=1.0)


def test_ppo_clip_higher() -> None:
    # r = 1.25, A = 1: symmetric eps 0.2 clips at 1.2 -> -1.2 ; eps_high 0.28 leaves it -> -1.25
    assert ppo([1.25], [1.0], clip_eps=0.2)[0] == pytest.approx(-1.2)
    assert ppo([1.25], [1.0], clip_eps=0.2, clip_eps_high=0.28)[0] == pytest.approx(-1.25)


def test_ppo_accepts_per_token_advantages() -> None:
    logp = torch.zeros(1, 2)
    per_seq = ppo_clip_loss(logp, logp, torch.tensor([2.0]), ONES[:, :2]).loss
    per_tok = ppo_clip_loss(logp, logp, torch.tensor([[2.0, 2.0]]), ONES[:, :2]).loss
    torch.testing.assert_close(per_seq, per_tok)  # both -2 (ratio 1)
    torch.testing.assert_close(per_seq, torch.tensor(-2.0))


def test_value_loss_hand_values() -> None:
    values = torch.tensor([[1.0, 3.0, 0.0]], requires_grad=True)
    old = torch.zeros(1, 3)
    returns = torch.tensor([[2.0, 0.0, 1.0]])
    # clip 0.5 -> v_clipped = clip(v, -0.5, 0.5) = [0.5, 0.5, 0]
    #   token 0: (1 - 2)^2 = 1 vs (0.5 - 2)^2 = 2.25 -> 0.5 * 2.25 = 1.125 (clipped term wins)
    #   token 1: (3 - 0)^2 = 9 vs (0.5 - 0)^2 = 0.25 -> 4.5
    #   token 2: (0 - 1)^2 = 1 vs (0 - 1)^2 = 1      -> 0.5
    # mean (1.125 + 4.5 + 0.5) / 3 = 6.125 / 3 ; clipfrac 1/3 (token 0)
    out = value_loss(values, old, returns, ONES, clip=0.5)
    assert out.loss.item() == pytest.approx(6.125 / 3)
    assert out.clipfrac.item() == pytest.approx(1 / 3)
    (grad,) = torch.autograd.grad(out.loss, values)
    # token 0's loss is constant in v (clipped); token 1: (v - R) / 3 = 1; token 2: tie, either branch: -1/3
    torch.testing.assert_close(grad, torch.tensor([[0.0, 1.0, -1 / 3]]))
    # no clip: 0.5 * (1 + 9 + 1) / 3 = 11/6
    unclipped = value_loss(values, old, returns, ONES, clip=None)
    assert unclipped.loss.item() == pytest.approx(11 / 6)
    assert unclipped.clipfrac.item() == 0.0


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        # per token -logp * A: row 0 (A = 1): [1, 2]; row 1 (A = -2): [-(-3)(-2) = -6, masked]
        ("token", (1 + 2 - 6) / 3),  # -1
        ("sequence", (1.5 - 6) / 2),  # row means 1.5 and -6 -> -2.25
        ("sequence_sum", (3 - 6) / 2),  # row sums 3 and -6 -> -1.5
    ],
)
def test_reinforce_loss_levels(level: LossLevel, expected: float) -> None:
    logp = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]])
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    out = reinforce_loss(logp, torch.tensor([1.0, -2.0]), mask, level)
    assert out.item() == pytest.approx(expected)


def test_kl_loss_is_beta_times_mean_k3() -> None:
    # logp = -1, ref = 0: k3 = e - 2 = 0.71828 on token 0 ; token 1 is masked ; beta 0.1 -> 0.071828
    logp = torch.tensor([[-1.0, -5.0]])
    out = kl_loss(logp, torch.zeros(1, 2), torch.tensor([[True, False]]), kl_coef=0.1)
    assert out.item() == pytest.approx(0.1 * (math.e - 2))


def test_all_masked_rows_add_nothing() -> None:
    logp = torch.tensor([[-1.0, -2.0], [-50.0, -60.0]])
    mask = torch.tensor([[1, 1], [0, 0]], dtype=torch.bool)
    for level in LOSS_LEVELS:
        both = reinforce_loss(logp, torch.tensor([1.0, 7.0]), mask, level)
        first = reinforce_loss(logp[:1], torch.tensor([1.0]), mask[:1], level)
        torch.testing.assert_close(both, first)


LossFn = Callable[[torch.Tensor, dict[str, torch.Tensor], LossLevel, torch.Tensor | None], torch.Tensor]


# Each loss as (per-token policy logprobs, batch, level, normaliser) -> scalar loss.
LOSSES: dict[str, LossFn] = {
    "ppo": lambda p, b, level, n: (
        ppo_clip_loss(p, b["old"], b["adv"], b["mask"], dual_clip=3.0, level=level, normaliser=n).loss
    ),
    "reinforce": lambda p, b, level, n: reinforce_loss(p, b["adv"], b["mask"], level, n),
    "value": lambda p, b, level, n: (
        value_loss(p, b["old"], b["ret"], b["mask"], clip=0.1, level=level, normaliser=n).loss
    ),
    "kl": lambda p, b, level, n: kl_loss(p, b["old"], b["mask"], kl_coef=0.1, level=level, normaliser=n),
}


@pytest.mark.parametrize("loss_fn", LOSSES.values(), ids=LOSSES.keys())
@pytest.mark.parametrize("level", LOSS_LEVELS)
def test_micro_batches_with_the_global_normaliser_equal_the_whole_batch(
    loss_fn: LossFn, level: LossLevel
) -> None:
    gen = torch.Generator().manual_seed(1)
    batch = {
        "old": torch.randn(4, 6, generator=gen) - 1,
        "adv": torch.randn(4, generator=gen),
        "ret": torch.randn(4, 6, generator=gen),
        # ragged lengths, and row 2 fully masked
        "mask": torch.tensor(
            [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0] * 6, [0, 1, 1, 0, 0, 0]], dtype=torch.bool
        ),
    }
    params = (batch["old"] + 0.3 * torch.randn(4, 6, generator=gen)).requires_grad_()

    whole = loss_fn(params, batch, level, None)
    (whole_grad,) = torch.autograd.grad(whole, params)

    halves = [{k: v[i : i + 2] for k, v in batch.items()} for i in (0, 2)]
    normaliser = sum(mean_denominator(h["mask"], level) for h in halves)
    assert isinstance(normaliser, torch.Tensor)
    assert normaliser.item() == mean_denominator(batch["mask"], level).item()
    split = sum(loss_fn(params[i : i + 2], h, level, normaliser) for i, h in zip((0, 2), halves, strict=True))
    assert isinstance(split, torch.Tensor)
    (split_grad,) = torch.autograd.grad(split, params)
    torch.testing.assert_close(split, whole)
    torch.testing.assert_close(split_grad, whole_grad)

    # Control: averaging per-micro-batch means is not the same thing on this ragged batch.
    local = sum(loss_fn(params[i : i + 2], h, level, None) for i, h in zip((0, 2), halves, strict=True)) / 2
    assert isinstance(local, torch.Tensor)
    assert not torch.allclose(local, whole)
