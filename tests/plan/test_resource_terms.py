"""The resource plan's terms are pure functions of the shape, precision, batch and parallelism: each checked
against values worked out by hand in the comments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemotron.plan.shapes import ModelShape, computed_parameters, known_shape, shape_from_checkpoint
from nemotron.plan.terms import (
    Group,
    MiB,
    Plan,
    Sharding,
    activations_mb,
    heap_slack_mb,
    kv_cache_mb,
    layer_bytes,
    refusal,
    render,
    train_state_mb,
    training_peak,
)

# A Llama of hidden 8, MLP 16, 2 layers, 2 heads (2 KV heads), vocabulary 10, tied embeddings.
LLAMA = ModelShape("t", "llama", 2, 8, 2, 2, 16, 10, True, True, 1000, "test")
GPT2 = ModelShape("g", "gpt2", 2, 8, 2, 2, 32, 10, False, True, 1000, "test")


def test_train_state_by_precision() -> None:
    # 1,048,576 parameters = 1 Mi: fp32 4 + 4 + 8 bytes -> 4, 4, 8 MiB; bf16 2 + 2 + 4; bf16-mixed adds 2 MiB
    n = 2**20
    assert train_state_mb(n, "fp32") == {"weights": 4.0, "gradients": 4.0, "optimizer": 8.0}
    assert train_state_mb(n, "bf16") == {"weights": 2.0, "gradients": 2.0, "optimizer": 4.0}
    assert train_state_mb(n, "bf16-mixed") == {
        "weights": 4.0, "gradients": 4.0, "optimizer": 8.0, "bf16 weight copies": 2.0,
    }  # fmt: skip


def test_fsdp_and_megatron_shard_the_state() -> None:
    n = 8 * 2**20
    # FSDP over 8: 1 Mi parameters per GPU, fp32 masters: 4 + 4 + 8 MiB; no whole-model bf16 copy
    assert train_state_mb(n, "bf16-mixed", Sharding("fsdp", 8, 8)) == {
        "weights": 4.0, "gradients": 4.0, "optimizer": 8.0,
    }  # fmt: skip
    # Megatron TP 2 x PP 2 (4 Mi... 2 Mi per shard): bf16 weights 2 x 2 = 4 MiB, fp32 grads 8 MiB; the
    # distributed optimizer's 12 bytes over all 8 ranks: 8 Mi x 12 / 8 = 12 MiB
    assert train_state_mb(n, "bf16-mixed", Sharding("megatron", 4, 8, 2, 1, 2)) == {
        "weights": 4.0, "gradients": 8.0, "optimizer": 12.0,
    }  # fmt: skip


def test_layer_bytes_by_family() -> None:
    # Llama fp32: (15 x 8 + 4 x 16) x 4 = 184 x 4 = 736; bf16: 184 x 2 + 7 x 8 x 2 (fp32 RMSNorm tensors) = 480
    assert layer_bytes(LLAMA, 4) == 736
    assert layer_bytes(LLAMA, 2) == 480
    # GPT-2 fp32: (11 x 8 + 5 x 32) x 4 = 248 x 4 = 992
    assert layer_bytes(GPT2, 4) == 992
    # Qwen2's attention keeps 9 hidden-wide tensors: (9 x 8 + 4 x 16) x 4 = 136 x 4 = 544
    assert layer_bytes(LLAMA._replace(family="qwen2"), 4) == 544


def test_the_cpu_heap_slack_is_a_quarter_of_what_a_step_frees() -> None:
    # 0.25 x (gradients 4 + logits 1 + un-checkpointed activations 10) = 3.75
    assert heap_slack_mb({"gradients": 4.0, "logits": 1.0, "activations": 2.0}, 10.0) == 3.75


def test_activations_with_and_without_checkpointing() -> None:
    # 4 sequences x 16 tokens = 64 tokens, fp32: 2 layers x 64 x 736 = 94,208 bytes; logits 64 x 10 x (4 + 4 + 4)
    # = 7,680 bytes
    plain = activations_mb(LLAMA, 4, 16, "fp32", False)
    assert plain["activations"] * MiB == 94_208
    assert plain["logits"] * MiB == 7_680
    # checkpointing: each layer keeps its input (2 x 64 x 8 x 4 = 4,096) + one layer recomputed (47,104)
    assert activations_mb(LLAMA, 4, 16, "fp32", True)["activations"] * MiB == 4_096 + 47_104
    # bf16: 2 x 64 x 480 = 61,440; logits 64 x 10 x (2 + 4 + 4) = 6,400
    assert activations_mb(LLAMA, 4, 16, "bf16", False) == {"activations": 61_440 / MiB, "logits": 6_400 / MiB}
    # TP 2 halves each token's width, CP 2 the tokens; PP 2: half the layers, two micro-batches in flight
    tp2, cp2 = Sharding("megatron", 2, 2, 2), Sharding("fsdp", 2, 2, cp=2)
    assert activations_mb(LLAMA, 4, 16, "fp32", False, tp2)["activations"] * MiB == 47_104
    assert activations_mb(LLAMA, 4, 16, "fp32", False, cp2)["activations"] * MiB == 47_104
    pp2 = Sharding("megatron", 2, 2, pp=2)
    assert activations_mb(LLAMA, 4, 16, "fp32", False, pp2)["activations"] * MiB == 94_208


def test_kv_cache() -> None:
    # 3 sequences x 16 tokens x 2 layers x (K and V) x 8 wide x 2 bytes (bf16) = 3,072 bytes
    assert kv_cache_mb(LLAMA, 3, 16, "bf16") * MiB == 3_072


# a training group's terms (MiB) but its activations, which each test sets
_TRAINING = {"runtime": 1.0, "weights": 4.0, "gradients": 4.0, "optimizer": 8.0, "logits": 1.0}


def test_the_peak_holds_activations_or_gradients_not_both() -> None:
    # runtime 1 + weights 4 + optimizer 8 + max(activations 10 + logits 1, gradients 4) = 24
    terms = {**_TRAINING, "activations": 10.0}
    assert training_peak(terms) == 24.0
    assert training_peak({**terms, "activations": 1.0, "logits": 0.0}) == 17.0  # gradients 4 win


def test_with_checkpointing_or_on_the_cpu_every_term_adds_up() -> None:
    # runtime 1 + weights 4 + gradients 4 + optimizer 8 + activations 2 + logits 1 = 20: the backward fills the
    # gradients while the checkpointed inputs and the recomputed layer are alive
    terms = {**_TRAINING, "activations": 2.0}
    assert training_peak(terms, checkpointing=True) == 20.0
    assert training_peak(terms, cpu=True) == 20.0
    assert training_peak(terms) == 17.0  # without: max(activations 2 + logits 1, gradients 4)


def test_parameters_from_the_shape_match_published_counts() -> None:
    # Llama-3.1-8B is 8,030,261,248 parameters; Qwen2.5-1.5B 1,543,714,304 (their model cards' safetensors totals)
    assert known_shape("meta-llama/Llama-3.1-8B-Instruct").parameters == 8_030_261_248  # type: ignore[union-attr]
    assert known_shape("qwen/qwen2.5-1.5b").parameters == 1_543_714_304  # type: ignore[union-attr]
    assert known_shape("no/such-model") is None


def test_a_checkpoint_directory_is_read_from_its_headers(tmp_path: Path) -> None:
    """config.json for the shape, the safetensors header for the count (no weights read)."""
    import struct

    header = json.dumps({"a": {"dtype": "F32", "shape": [3, 5], "data_offsets": [0, 60]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 60)
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
        "num_hidden_layers": 3, "intermediate_size": 16, "vocab_size": 10, "max_position_embeddings": 64,
    }))  # fmt: skip
    shape = shape_from_checkpoint(tmp_path)
    assert shape is not None
    assert (shape.parameters, shape.layers, shape.kv_width, shape.context, shape.gated_mlp) == (
        15,
        3,
        4,
        64,
        True,
    )
    assert shape_from_checkpoint(tmp_path / "absent") is None


def test_computed_parameters_of_a_tiny_llama() -> None:
    # per layer: q, o 2 x 64 + k, v 2 x 8 x 8 = 256; MLP 3 x 8 x 16 = 384; norms 16 -> 656 x 2 = 1,312;
    # embeddings (tied) 80; final norm 8 -> 1,400
    assert computed_parameters(LLAMA) == 1_400


def _group(peak: float, available: float | None) -> Group:
    return Group("policy training", "node 0", "L40S (45 GiB)", available, [], {"weights": peak - 1, "runtime": 1.0},
                 peak, "DDP over 8 GPUs", suggestions=["runtime.gradient_checkpointing=true"])  # fmt: skip


def test_a_group_over_its_device_is_refused_with_what_would_fit() -> None:
    over = _group(50 * 1024, 45 * 1024)
    line = refusal(over)
    assert not over.fits and over.largest_term == "weights"
    for words in ("policy training", "L40S", "50.0 GiB", "45.0 GiB", "weights", "gradient_checkpointing",
                  "plan.on_no_fit=warn"):  # fmt: skip
        assert words in line
    assert "\n" not in line
    assert _group(10, None).fits  # unknown memory: nothing to check
    table = render(Plan([over, _group(10 * 1024, 45 * 1024)]))
    assert "NO" in table.splitlines()[1] and "yes" in table.splitlines()[2]


@pytest.mark.parametrize("name", ["H100-80GB", "H200", "A100-40GB", "A100-80GB", "L40S"])
def test_every_documented_gpu_type_is_in_the_table(name: str) -> None:
    from nemotron.plan.terms import GPU_TYPES

    doc = (Path(__file__).resolve().parents[2] / "docs" / "cluster.md").read_text()
    assert f"| `{name}` | {GPU_TYPES[name]:,} |" in doc
