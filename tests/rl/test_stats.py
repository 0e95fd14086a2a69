"""The RL steps' statistics and the global whitening, on hand-made tensors (one rank)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pytest
import torch

from nemotron.errors import UserError
from nemotron.rl.distributed import World, global_whiten
from nemotron.rl.masks import whiten
from nemotron.rl.stats import DeviceSums, as_metrics, global_means, global_sums
from nemotron.runtime.step import required


def test_global_means_divide_each_sum_by_the_count() -> None:
    # sums 6 and 3 over 4 samples: means 1.5 and 0.75
    means = global_means(World(), 4, rewards=torch.tensor(6.0), baseline=torch.tensor(3.0))
    assert means == {"rewards": 1.5, "baseline": 0.75}


def test_global_means_take_a_tensor_count() -> None:
    # 10 over 8 valid tokens
    assert global_means(World(), torch.tensor(8.0), values_mean=torch.tensor(10.0)) == {"values_mean": 1.25}


def test_global_sums_divide_by_the_number_of_epochs() -> None:
    sums = global_sums(World(), 2, actor_loss=torch.tensor(-0.5), clipfrac=torch.tensor(0.25))
    assert sums == {"actor_loss": -0.25, "clipfrac": 0.125}


@dataclass
class Two:
    loss: float
    lr: float


def test_as_metrics_flattens_dataclasses_and_mappings_in_order() -> None:
    metrics = as_metrics(Two(loss=torch.tensor(0.5).item(), lr=1e-3), {"token_mult_prob_error": 1})
    assert metrics == {"loss": 0.5, "lr": 1e-3, "token_mult_prob_error": 1.0}
    assert list(metrics) == ["loss", "lr", "token_mult_prob_error"]


def test_global_whiten_on_one_rank_is_masks_whiten() -> None:
    # valid values 1, 2, 3 (mean 2, unbiased variance 1): whitened -1, 0, 1; masked entries 0
    values = torch.tensor([[1.0, 2.0, 9.0], [3.0, 7.0, 7.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    out = global_whiten(values, mask, World())
    expected = torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(out, whiten(values, mask), atol=1e-6, rtol=0)


def test_required_names_the_missing_key() -> None:
    assert required("a", "inputs.policy") == "a"
    with pytest.raises(UserError, match=r"inputs\.policy is required"):
        required(None, "inputs.policy")


def test_device_sums_start_at_one_zero_scalar_per_field() -> None:
    @dataclass
    class Sums(DeviceSums):
        loss: torch.Tensor
        clipfrac: torch.Tensor

    sums = Sums.zeros(torch.device("cpu"))
    assert [f.name for f in fields(sums)] == ["loss", "clipfrac"]
    assert all(t.shape == () and float(t) == 0.0 for t in (sums.loss, sums.clipfrac))
    sums.loss += 2.5
    assert float(sums.loss) == 2.5 and float(Sums.zeros(torch.device("cpu")).loss) == 0.0
