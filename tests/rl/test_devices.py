"""runtime.device, runtime.precision and runtime.gradient_checkpointing: the rules unit-tested on this CPU-only
machine (device choice is a pure function of what was asked and what the machine has), and the CLI's refusal of
`cuda` where there is none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from nemotron.devices import (
    DevicePlan,
    autocast,
    choose_device,
    model_dtype,
    peak_memory_mb,
    process_group_backend,
)
from nemotron.errors import UserError
from nemotron.models.tiny import build_policy
from nemotron.rl import gpt2_fast
from nemotron.rl.rollout import sequence_logprobs


@pytest.mark.parametrize(
    ("requested", "gpus", "local_rank", "expected"),
    [
        ("auto", 0, 0, "cpu"),
        ("auto", 0, 3, "cpu"),
        ("cpu", 8, 2, "cpu"),
        ("auto", 1, 0, "cuda:0"),
        ("auto", 8, 5, "cuda:5"),
        ("cuda", 8, 7, "cuda:7"),
    ],
)
def test_device_choice(requested: str, gpus: int, local_rank: int, expected: str) -> None:
    assert choose_device(requested, gpus, local_rank) == expected


def test_cuda_without_a_gpu_and_a_rank_without_its_own_gpu_are_usage_errors() -> None:
    with pytest.raises(UserError, match=r"runtime\.device=cuda, but this machine has no CUDA device"):
        choose_device("cuda", 0)
    with pytest.raises(UserError, match="local rank 2 has no GPU of its own"):
        choose_device("auto", 2, local_rank=2)
    with pytest.raises(UserError, match="expected auto, cpu or cuda"):
        choose_device("tpu", 0)


def test_auto_is_the_cpu_here_and_nccl_goes_only_with_cuda_tensors() -> None:
    assert not torch.cuda.is_available()  # this machine, and CI's
    assert choose_device("auto", torch.cuda.device_count()) == "cpu"
    assert process_group_backend(torch.device("cpu")) == "gloo"
    assert process_group_backend(torch.device("cuda:3")) == "nccl"


def test_precision_dtypes_and_autocast() -> None:
    assert model_dtype("fp32") is torch.float32
    assert model_dtype("bf16") is torch.bfloat16
    assert model_dtype("bf16-mixed") is torch.float32  # fp32 master weights
    with pytest.raises(UserError):
        model_dtype("fp16")
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with autocast(torch.device("cpu"), "bf16-mixed"):
        assert layer(x).dtype is torch.bfloat16
    with autocast(torch.device("cpu"), "fp32"):
        assert layer(x).dtype is torch.float32


def _llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)  # fmt: skip
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("precision", ["bf16", "bf16-mixed"])
def test_logprobs_are_fp32_and_close_to_fp32_in_every_precision(precision: str) -> None:
    reference = _llama()
    sequences = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(sequences)
    expected = sequence_logprobs(reference, sequences, mask, 1.0, 5)
    plan = DevicePlan(torch.device("cpu"), precision)
    model = plan.prepare(_llama())
    assert next(model.parameters()).dtype is plan.dtype
    with plan.autocast():
        got = sequence_logprobs(model, sequences, mask, 1.0, 5)
    assert got.dtype is torch.float32
    assert torch.allclose(got, expected, atol=0.08), (got - expected).abs().max()
    assert not torch.equal(got, expected)  # bfloat16 really was used


def test_gradient_checkpointing_gives_the_same_gradients_and_leaves_the_lean_gpt2_path() -> None:
    sequences = torch.randint(0, 40, (2, 10), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(sequences)
    grads = []
    for checkpointing in (False, True):
        model = build_policy(40, 2, 32, 4, 32, seed=3, pad_token_id=0, eos_token_id=1)
        DevicePlan(torch.device("cpu"), "fp32", checkpointing).prepare(model)
        model.train()
        assert gpt2_fast.supports(model) is not checkpointing  # the lean forward does not checkpoint
        sequence_logprobs(model, sequences, mask, 1.0, 4).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


def test_peak_memory_is_the_resident_set_on_the_cpu() -> None:
    before = peak_memory_mb(torch.device("cpu"))
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    assert float(block.sum()) > 0
    after = peak_memory_mb(torch.device("cpu"))
    assert after >= before and after > 64


def test_cuda_here_is_exit_2_in_one_line_and_writes_nothing(home: Path, run_cli: Any) -> None:
    for extra in ([], ["--dry-run"]):
        r = run_cli("steps", "run", "rl/reinforce", "-c", "tiny", "runtime.device=cuda", *extra)
        assert r.code == 2, r.err
        assert r.err.strip().splitlines() == [
            "error: runtime.device=cuda, but this machine has no CUDA device (torch "
            + torch.__version__
            + ", no NVIDIA driver): use runtime.device=auto or cpu, or submit to a GPU profile (-b PROFILE)"
        ]
        assert "Traceback" not in r.err + r.out
    assert not (home / "jobs").exists() or not list((home / "jobs").iterdir())
