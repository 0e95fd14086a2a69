"""runtime.device, runtime.precision and runtime.gradient_checkpointing: the rules unit-tested on any machine
(device choice is a pure function of what was asked and what the machine has); what `auto` picks and what
`peak_memory_mb` reports on this machine (tests marked `no_gpu` run where there is no CUDA device, those marked
`gpu` where there is one); and the CLI's refusal of `cuda` where there is none."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from nemotron.errors import UserError
from nemotron.models.tiny import build_policy
from nemotron.rl import gpt2_fast
from nemotron.rl.rollout import sequence_logprobs
from nemotron.runtime.devices import (
    DevicePlan,
    autocast,
    choose_device,
    model_dtype,
    peak_memory_mb,
    process_group_backend,
    runtime_device,
)


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


def test_nccl_goes_only_with_cuda_tensors() -> None:
    assert process_group_backend(torch.device("cpu")) == "gloo"
    assert process_group_backend(torch.device("cuda:3")) == "nccl"


@pytest.mark.no_gpu
def test_auto_is_the_cpu_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert runtime_device("auto") == torch.device("cpu")


@pytest.mark.gpu
def test_auto_is_the_first_gpu_where_there_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert runtime_device("auto") == torch.device("cuda:0")
    assert torch.cuda.current_device() == 0


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


def _proc_status_mib(field: str) -> float:
    """A memory line of /proc/self/status (`VmHWM`: the peak resident set; `VmRSS`: the current one), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            value, unit = line.split()[1:3]
            assert unit == "kB"  # the kernel's kB are KiB
            return int(value) / 2**10
    raise AssertionError(f"no {field} in /proc/self/status")


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux's /proc/self/status")
def test_peak_memory_is_the_resident_set_on_the_cpu() -> None:
    before = peak_memory_mb(torch.device("cpu"))
    assert before == pytest.approx(_proc_status_mib("VmHWM"), abs=8)
    # Enough to lift the peak well above the one already reached, whatever this process did before.
    grow = 256
    size = _proc_status_mib("VmHWM") - _proc_status_mib("VmRSS") + grow
    block = torch.ones(int(size * 2**20) // 4)  # float32, every page touched
    assert float(block[:: 2**10].sum()) > 0
    after = peak_memory_mb(torch.device("cpu"))
    assert after == pytest.approx(_proc_status_mib("VmHWM"), abs=8)  # MiB, read from the kernel's own count
    assert after - before > 0.9 * grow
    del block


CHILD_PEAK = """
import json
import torch
from nemotron.runtime.devices import peak_memory_mb
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps([peak_memory_mb(torch.device("cpu")), int(status["VmHWM"].split()[0]) / 2**10]))
"""


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux's /proc/self/status")
def test_a_step_started_by_a_large_parent_reports_its_own_peak() -> None:
    """A step process is forked from the CLI, a launcher or a test runner: Linux's ru_maxrss carries the parent's
    peak across exec, so a step started by a 1 GiB parent would report 1 GiB it never used."""
    parent = torch.ones(2**30 // 4)  # 1 GiB, touched
    assert float(parent[:: 2**10].sum()) > 0
    parent_peak = _proc_status_mib("VmHWM")
    done = subprocess.run(
        [sys.executable, "-c", CHILD_PEAK],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    reported, own = json.loads(done.stdout)
    assert reported == pytest.approx(own, abs=8)
    assert reported < parent_peak - 512, (reported, parent_peak)
    del parent


@pytest.mark.gpu
def test_peak_memory_is_cudas_max_allocated_on_a_gpu() -> None:
    device = torch.device("cuda:0")
    torch.cuda.reset_peak_memory_stats(device)
    block = torch.ones(256 * 2**20 // 4, device=device)  # 256 MiB
    peak = peak_memory_mb(device)
    assert peak == torch.cuda.max_memory_allocated(device) / 2**20 and peak >= 256
    del block


@pytest.mark.no_gpu
def test_cuda_here_is_exit_2_in_one_line_and_writes_nothing(home: Path, run_cli: Any) -> None:
    for extra in ([], ["--dry-run"]):
        r = run_cli("steps", "run", "rl/reinforce", "-c", "tiny", "runtime.device=cuda", *extra)
        assert r.code == 2, r.err
        # torch sees no CUDA device here: a CPU build, or no driver (the message names the driver's absence).
        driver = "" if Path("/dev/nvidiactl").exists() else ", no NVIDIA driver"
        assert r.err.strip().splitlines() == [
            "error: runtime.device=cuda, but this machine has no CUDA device (torch "
            + torch.__version__
            + driver
            + "): use runtime.device=auto or cpu, or submit to a GPU profile (-b PROFILE)"
        ]
        assert "Traceback" not in r.err + r.out
    assert not (home / "jobs").exists() or not list((home / "jobs").iterdir())
