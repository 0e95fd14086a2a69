"""Checkpoints: lossless round trips, atomic writes, and clear errors for the wrong path or model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoTokenizer,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
)

from nemotron.errors import UserError
from nemotron.models.checkpoint import (
    CheckpointError,
    load_critic,
    load_policy,
    load_reward_model,
    load_tokenizer,
    save_checkpoint,
)
from nemotron.models.reward import build_critic_from_reward_model

IDS = torch.tensor([[5, 6, 7, 8, 1]])


def test_policy_round_trip_keeps_logits_and_tokenizer(
    policy: GPT2LMHeadModel,
    tokenizer: PreTrainedTokenizerFast,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = save_checkpoint(policy, tmp_path / "sft", tokenizer)
    loaded = load_policy(path)
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, policy(IDS).logits)
    assert (path / "model.safetensors").is_file()
    assert not list(path.glob("*.bin")) and not list(path.glob("*.pt"))  # no pickles
    assert AutoTokenizer.from_pretrained(path).encode("so lovely .") == tokenizer.encode("so lovely .")
    assert load_tokenizer(path).get_vocab() == tokenizer.get_vocab()


def test_reward_model_and_critic_round_trip(
    reward_model: GPT2ForSequenceClassification, tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    mask = torch.ones_like(IDS)
    rm = load_reward_model(save_checkpoint(reward_model, tmp_path / "rm", tokenizer))
    critic = build_critic_from_reward_model(reward_model)
    loaded_critic = load_critic(save_checkpoint(critic.model, tmp_path / "critic"))
    with torch.no_grad():
        torch.testing.assert_close(rm(IDS).logits, reward_model(IDS).logits)
        torch.testing.assert_close(loaded_critic(IDS, mask), critic(IDS, mask))
    assert rm.config.pad_token_id == tokenizer.pad_token_id
    # transformers' token classifier defaults to dropout 0.1; the critic's must stay off after a reload.
    loaded_critic.train()
    with torch.no_grad():
        torch.testing.assert_close(loaded_critic(IDS, mask), loaded_critic(IDS, mask))


def _listing(path: Path) -> dict[str, bytes]:
    """Every file under `path` by its relative path, with its bytes."""
    return {f.relative_to(path).as_posix(): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


def test_saving_over_a_checkpoint_replaces_it_and_leaves_nothing_behind(
    policy: GPT2LMHeadModel,
    reward_model: GPT2ForSequenceClassification,
    tokenizer: PreTrainedTokenizerFast,
    tmp_path: Path,
) -> None:
    path = tmp_path / "ckpt"
    # The old checkpoint has files the new one lacks (tokenizer files, weight shards and their index).
    save_checkpoint(policy, path, tokenizer, max_shard_size="100KB")
    old = _listing(path)
    assert "model.safetensors.index.json" in old and "tokenizer.json" in old
    save_checkpoint(reward_model, path)
    fresh = save_checkpoint(reward_model, tmp_path / "fresh" / "ckpt")
    assert _listing(path) == _listing(fresh)  # exactly what a save into an empty place writes, nothing kept
    assert isinstance(load_reward_model(path), GPT2ForSequenceClassification)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "fresh"]


def test_a_crash_while_saving_keeps_the_old_checkpoint(
    policy: GPT2LMHeadModel,
    tokenizer: PreTrainedTokenizerFast,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "ckpt"
    save_checkpoint(policy, path)
    before = load_policy(path).lm_head.weight.clone()

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(tokenizer, "save_pretrained", crash)
    with torch.no_grad():
        policy.lm_head.weight.add_(1.0)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(policy, path, tokenizer)  # the weights are already written when this fails
    assert torch.equal(load_policy(path).lm_head.weight, before)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_a_crash_before_the_first_save_leaves_no_checkpoint(
    policy: GPT2LMHeadModel,
    tokenizer: PreTrainedTokenizerFast,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tokenizer, "save_pretrained", lambda *a, **k: (_ for _ in ()).throw(OSError("boom")))
    with pytest.raises(OSError):
        save_checkpoint(policy, tmp_path / "ckpt", tokenizer)
    assert list(tmp_path.iterdir()) == []


def _message(loader: object, path: Path) -> str:
    with pytest.raises(CheckpointError) as info:
        loader(path)  # type: ignore[operator]
    assert isinstance(info.value, UserError)
    assert str(path) in str(info.value)
    return str(info.value)


def test_missing_paths_and_non_checkpoints_are_named(tmp_path: Path) -> None:
    assert "no such checkpoint directory" in _message(load_policy, tmp_path / "absent")
    (tmp_path / "file").write_text("x")
    assert "not a checkpoint directory" in _message(load_policy, tmp_path / "file")
    (tmp_path / "empty").mkdir()
    assert "not a checkpoint (no config.json)" in _message(load_reward_model, tmp_path / "empty")
    assert "no tokenizer.json" in _message(load_tokenizer, tmp_path / "empty")


def test_loading_the_wrong_kind_of_model_is_refused(
    policy: GPT2LMHeadModel, reward_model: GPT2ForSequenceClassification, tmp_path: Path
) -> None:
    save_checkpoint(policy, tmp_path / "policy")
    save_checkpoint(reward_model, tmp_path / "rm")
    assert (
        "expected a GPT2ForSequenceClassification checkpoint, a reward model (one-label sequence classification); found GPT2LMHeadModel"
        in _message(load_reward_model, tmp_path / "policy")
    )
    assert (
        "expected a GPT2LMHeadModel checkpoint, a policy (causal LM); found GPT2ForSequenceClassification"
        in _message(load_policy, tmp_path / "rm")
    )
    assert "expected a GPT2ForTokenClassification" in _message(load_critic, tmp_path / "rm")


def test_corrupt_files_are_reported_not_crashed_on(policy: GPT2LMHeadModel, tmp_path: Path) -> None:
    path = save_checkpoint(policy, tmp_path / "ckpt")
    (path / "model.safetensors").write_bytes(b"\x00" * 16)
    assert "cannot load the GPT2LMHeadModel weights" in _message(load_policy, path)
    (path / "config.json").write_text("{not json")
    assert "unreadable config.json" in _message(load_policy, path)
    (path / "config.json").write_text(
        json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    )
    # A Llama config over GPT-2 weights: loaded as the Llama it claims to be, and refused for its weights.
    assert "cannot load the LlamaForCausalLM weights" in _message(load_policy, path)
    (path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    assert "expected a BertLMHeadModel checkpoint, a policy (causal LM); found BertModel" in _message(
        load_policy, path
    )
    (path / "config.json").write_text(json.dumps({"model_type": "resnet", "architectures": ["ResNetModel"]}))
    assert "expected a policy (causal LM) class transformers knows for model_type='resnet'" in _message(
        load_policy, path
    )


def test_weights_that_do_not_fit_the_model_are_refused(policy: GPT2LMHeadModel, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = save_checkpoint(policy, tmp_path / "ckpt")
    weights = load_file(path / "model.safetensors")
    del weights["transformer.h.0.mlp.c_fc.weight"]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    assert "missing or misshapen transformer.h.0.mlp.c_fc.weight" in _message(load_policy, path)

    config = json.loads((path / "config.json").read_text())
    path2 = save_checkpoint(policy, tmp_path / "ckpt2")
    (path2 / "config.json").write_text(json.dumps({**config, "n_inner": 8}))
    assert "cannot load the GPT2LMHeadModel weights" in _message(
        load_policy, path2
    )  # transformers raises on shapes
