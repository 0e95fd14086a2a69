"""The vllm backend's pure parts, which need no vllm: our sampling settings mapped one to one onto vLLM's, vLLM's
outputs laid out as our rollouts, and NeMo-RL's token_mult_prob_error. The engine itself is tested in tests/vllm
(in .venv-vllm, by scripts/test-vllm.sh)."""

from __future__ import annotations

import math

import torch

from nemotron.rl.experience import token_mult_prob_error
from nemotron.rl.rollout import SamplingParams
from nemotron.rl.vllm_backend import to_rollout, vllm_sampling


def test_sampling_settings_map_one_to_one() -> None:
    params = SamplingParams(max_new_tokens=7, temperature=0.7, top_k=5, top_p=0.9, eos_token_id=(1, 3),
                            pad_token_id=0, stop_strings=("\n",), decode=str)  # fmt: skip
    assert vllm_sampling(params, seed=42) == {
        "n": 1, "temperature": 0.7, "top_k": 5, "top_p": 0.9, "max_tokens": 7, "stop": ["\n"],
        "include_stop_str_in_output": True, "stop_token_ids": [1, 3], "ignore_eos": False,
        "skip_special_tokens": False, "logprobs": 0, "seed": 42,
    }  # fmt: skip
    plain = vllm_sampling(SamplingParams(max_new_tokens=3, greedy=True), seed=0)
    assert plain["temperature"] == 0.0 and plain["top_k"] == -1 and plain["stop"] is None
    assert plain["stop_token_ids"] is None and plain["ignore_eos"] is True  # no EOS: run to max_new_tokens


def test_outputs_become_left_padded_prompts_and_right_padded_responses() -> None:
    rollout = to_rollout(
        [[5, 6], [7]], [[8, 1], [9, 9, 9]], [[-0.5, -1.0], [-0.1, -0.2, -0.3]], [True, False], 0
    )
    assert rollout.prompt_width == 2
    assert rollout.sequences.tolist() == [[5, 6, 8, 1, 0], [0, 7, 9, 9, 9]]
    assert rollout.attention_mask.tolist() == [[1, 1, 1, 1, 0], [0, 1, 1, 1, 1]]
    assert rollout.response_mask.tolist() == [[True, True, False], [True, True, True]]
    assert rollout.response_lengths.tolist() == [2, 3] and rollout.prompt_lengths.tolist() == [2, 1]
    assert rollout.is_end.tolist() == [True, False]
    expected = torch.tensor([[-0.5, -1.0, 0.0], [-0.1, -0.2, -0.3]], dtype=torch.float32)
    assert rollout.logprobs.dtype is torch.float32 and torch.equal(rollout.logprobs, expected)


def test_token_mult_prob_error_by_hand() -> None:
    engine = torch.tensor([[-1.0, -2.0, -9.0]])
    trainer = torch.tensor([[-1.5, -2.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    # tokens 1 and 2: exp(0.5) and exp(0) -> mean (1.6487 + 1) / 2 = 1.3244; the masked third is left out
    assert math.isclose(token_mult_prob_error(engine, trainer, mask), (math.exp(0.5) + 1.0) / 2, rel_tol=1e-6)
    assert token_mult_prob_error(engine, engine, mask) == 1.0
    assert token_mult_prob_error(engine, trainer, torch.zeros_like(mask)) == 1.0
