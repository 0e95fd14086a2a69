"""DPO, conservative DPO, IPO and the RPO losses, the log-ratio rewards and the SFT term, against values worked out
by hand; then DPO and IPO against TRL 1.16's DPOTrainer on one fixed batch, loss and gradient."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from nemotron.models.batches import EncodedPair, pair_batch
from nemotron.rl.preference_losses import preference_loss, sequence_logratios, sequence_nll

# log sigmoid(1) = -log(1 + e^-1) = -0.3132617; log sigmoid(-1) = log sigmoid(1) - 1 = -1.3132617
LOG_SIG_1 = -0.31326168751822
LOG_SIG_M1 = LOG_SIG_1 - 1.0


def loss_of(delta: float, beta: float, kind: Any = "dpo", g: float | None = None, e: float = 0.0) -> float:
    gt = None if g is None else torch.tensor([g])
    return float(preference_loss(torch.tensor([delta]), beta, kind, gt, e))


def test_dpo_is_minus_log_sigmoid_of_beta_times_the_margin() -> None:
    # beta 0.5, d = 2: beta d = 1 -> -log sigmoid(1) = 0.3132617
    assert loss_of(2.0, 0.5) == pytest.approx(-LOG_SIG_1, abs=1e-6)
    # d = 0 (policy = reference): -log(1/2) = log 2, whatever beta
    assert loss_of(0.0, 0.05) == pytest.approx(math.log(2), abs=1e-6)


def test_label_smoothing_mixes_in_the_flipped_label() -> None:
    # e = 0.1, beta d = 1: -(0.9)(-0.3132617) - (0.1)(-1.3132617) = 0.2819355 + 0.1313262 = 0.4132617
    assert loss_of(2.0, 0.5, e=0.1) == pytest.approx(0.41326169, abs=1e-6)


def test_ipo_is_the_squared_distance_to_one_over_two_beta() -> None:
    # beta 0.5 -> target 1/(2 * 0.5) = 1; d = 3: (3 - 1)^2 = 4; d = 0: (0 - 1)^2 = 1
    assert loss_of(3.0, 0.5, "ipo") == pytest.approx(4.0)
    assert loss_of(0.0, 0.5, "ipo") == pytest.approx(1.0)


def test_rpo_sq_regresses_beta_d_onto_the_reward_gap() -> None:
    # beta d = 0.5 * 2 = 1, g = 1.5: (1 - 1.5)^2 = 0.25
    assert loss_of(2.0, 0.5, "rpo_sq", g=1.5) == pytest.approx(0.25)


def test_rpo_kls_between_the_bernoullis_of_the_data_and_of_the_policy() -> None:
    # g = 0: the data's Bernoulli is (1/2, 1/2); beta d = 1: the policy's is (sigmoid(1), sigmoid(-1))
    # backward KL(data || policy) = 1/2 (log 1/2 - log sig(1)) + 1/2 (log 1/2 - log sig(-1))
    #   = -0.6931472 + (0.3132617 + 1.3132617) / 2 = 0.1201145
    assert loss_of(2.0, 0.5, "rpo_bwd_kl", g=0.0) == pytest.approx(0.12011451, abs=1e-6)
    # forward KL(policy || data) = sig(1) (log sig(1) + log 2) + sig(-1) (log sig(-1) + log 2)
    #   = 0.7310586 * 0.3798855 + 0.2689414 * (-0.6201145) = 0.2777186 - 0.1667745 = 0.1109441
    assert loss_of(2.0, 0.5, "rpo_fwd_kl", g=0.0) == pytest.approx(0.11094407, abs=1e-6)
    # the same Bernoulli on both sides: 0
    assert loss_of(2.0, 0.5, "rpo_bwd_kl", g=1.0) == pytest.approx(0.0, abs=1e-7)


def test_the_dpo_gradient_at_the_reference_is_minus_beta_over_two() -> None:
    # d/dd -log sigmoid(beta d) = -beta sigmoid(-beta d); at d = 0: -beta / 2
    delta = torch.zeros(1, requires_grad=True)
    (grad,) = torch.autograd.grad(preference_loss(delta, 0.1).sum(), delta)
    assert float(grad) == pytest.approx(-0.05)


def test_what_a_variant_does_not_read_is_refused() -> None:
    with pytest.raises(ValueError, match="label_smoothing acts only"):
        loss_of(1.0, 0.5, "ipo", e=0.1)
    with pytest.raises(ValueError, match="needs the pairs' ground-truth"):
        loss_of(1.0, 0.5, "rpo_sq")


def test_rewards_are_the_summed_or_averaged_log_ratios_over_response_tokens() -> None:
    # token 0 is the prompt's: (-2 - -1) + (-3 - -3) = -1 over 2 tokens; averaged -0.5
    logp, ref = torch.tensor([[-1.0, -2.0, -3.0]]), torch.tensor([[-1.5, -1.0, -3.0]])
    mask = torch.tensor([[0, 1, 1]])
    assert sequence_logratios(logp, ref, mask).tolist() == [-1.0]
    assert sequence_logratios(logp, ref, mask, average=True).tolist() == [-0.5]
    # the SFT term: -(-2 - 3) = 5, averaged 2.5; no token at all is 0, not a division by zero
    assert sequence_nll(logp, mask).tolist() == [5.0]
    assert sequence_nll(logp, mask, average=True).tolist() == [2.5]
    assert sequence_nll(logp, torch.zeros_like(mask), average=True).tolist() == [0.0]


def test_a_pair_batch_masks_the_response_tokens_of_each_logprob() -> None:
    # prompt [5, 6]; chosen adds [7, 8], rejected [9]; logprob j is of the token at j + 1
    batch = pair_batch([EncodedPair([5, 6, 7, 8], [5, 6, 9], 2)], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8], [5, 6, 9, 0]]
    assert batch.response_mask.tolist() == [[0, 1, 1], [0, 1, 0]]


# ----------------------------------------------------------------------------- against TRL


def trl_loss(loss_type: str, beta: float, logps: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> Any:
    """TRL 1.16's DPOTrainer._compute_loss on given per-token log-probs: a trainer without __init__ (no model, no
    dataset), its loss settings set, a stand-in model whose output is the log-probs (TRL's fused LM head zeroes them
    off the completion), and the reference's summed log-probs precomputed, as `precompute_ref_log_probs` feeds
    them."""
    from trl import DPOTrainer

    trainer: Any = DPOTrainer.__new__(DPOTrainer)
    b2, t = logps.shape
    outputs = SimpleNamespace(
        log_probs=logps * mask,
        entropy=torch.zeros(b2, t),
        mean_logits=torch.zeros(b2, t),
        is_top1=torch.zeros(b2, t, dtype=torch.bool),
    )
    model = SimpleNamespace(training=False)
    ident = SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda x: x, gather=lambda x: x)
    trainer.__dict__.update(
        model=model, accelerator=ident, aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True,
        f_divergence_type="reverse_kl", loss_types=[loss_type], loss_weights=[1.0], beta=beta,
        label_smoothing=0.0, use_weighting=False, _metrics={"eval": defaultdict(list)}, _total_train_tokens=0,
    )  # fmt: skip
    ref_sums = (ref * mask).sum(1)
    completion = torch.cat([torch.zeros(b2, 1), mask], dim=1)  # TRL's mask is over input positions
    inputs = {
        "input_ids": torch.zeros(b2, t + 1, dtype=torch.long),
        "attention_mask": torch.ones(b2, t + 1, dtype=torch.long),
        "completion_mask": completion.long(),
        "ref_chosen_logps": ref_sums[: b2 // 2],
        "ref_rejected_logps": ref_sums[b2 // 2 :],
    }
    return trainer._compute_loss(lambda **_: outputs, inputs, return_outputs=False)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_and_ipo_equal_trl_dpotrainer_loss_and_gradient(loss_type: str) -> None:
    generator = torch.Generator().manual_seed(0)
    pairs, t, beta = 3, 5, 0.2
    logps = -torch.rand(2 * pairs, t, generator=generator) * 3
    ref = -torch.rand(2 * pairs, t, generator=generator) * 3
    mask = torch.ones(2 * pairs, t)
    mask[:, :2] = 0  # the prompt
    mask[1, 4] = mask[4, 3:] = 0  # padding: responses of 3, 2 and 1 tokens
    ours_logp = logps.clone().requires_grad_(True)
    # TRL's ipo averages each response's log-ratio over its tokens; ours does with preference_average_log_probs
    rewards = sequence_logratios(ours_logp, ref, mask, average=loss_type == "ipo")
    chosen, rejected = rewards.chunk(2)
    ours = preference_loss(chosen - rejected, beta, "dpo" if loss_type == "sigmoid" else "ipo").mean()
    theirs_logp = logps.clone().requires_grad_(True)
    theirs = trl_loss(loss_type, beta, theirs_logp, ref, mask)
    (ours_grad,) = torch.autograd.grad(ours, ours_logp)
    (theirs_grad,) = torch.autograd.grad(theirs, theirs_logp)
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-5)
    assert torch.allclose(ours_grad, theirs_grad, atol=1e-5)
    assert ours_grad.abs().sum() > 0  # the comparison is of something
