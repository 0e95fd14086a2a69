"""Prompts longer than the model's room are cut from the left with a count, before any rollout."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nemotron.errors import UserError
from nemotron.models.prompts import fit_prompts, left_truncate, model_positions


def test_left_truncate_keeps_the_last_tokens_and_counts_the_cut() -> None:
    # room 3: [1,2,3,4,5] -> [3,4,5] (cut), [6,7] stays, [8,9,10] stays (exactly 3)
    out, cut = left_truncate([[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]], 3)
    assert out == [[3, 4, 5], [6, 7], [8, 9, 10]] and cut == 1


def test_fit_prompts_uses_the_room_left_by_max_new_tokens() -> None:
    # 32 positions - 28 new tokens = 4 tokens of prompt
    assert fit_prompts([list(range(10)), [1, 2]], 32, 28) == [[6, 7, 8, 9], [1, 2]]
    assert fit_prompts([list(range(100))], None, 28) == [list(range(100))]  # a model without a stated length


def test_no_room_at_all_is_bad_input() -> None:
    with pytest.raises(
        UserError, match=r"max_new_tokens=32 .* leaves no room for a prompt in the model's 32 positions"
    ):
        fit_prompts([[1]], 32, 32)


def test_model_positions_reads_both_names() -> None:
    assert model_positions(SimpleNamespace(n_positions=32)) == 32
    assert model_positions(SimpleNamespace(max_position_embeddings=4096, n_positions=None)) == 4096
    assert model_positions(SimpleNamespace()) is None


@pytest.mark.slow
def test_a_long_prompt_run_warns_and_trains_instead_of_failing_mid_rollout(
    tmp_path: Path, nemotron_cmd: Any
) -> None:
    env = {**os.environ, "NEMOTRON_HOME": str(tmp_path / "home")}
    one_step = ("trainer.max_steps=1", "eval.num_prompts=0")
    args = nemotron_cmd(
        "steps", "run", "rl/reinforce", "-c", "tiny", *one_step, "generation.max_new_tokens=28"
    )
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "prompts are longer than 4 tokens (the model's 32 positions minus max_new_tokens 28)" in done.stderr
    )
    (job,) = (tmp_path / "home" / "jobs").iterdir()
    assert json.loads((job / "status.json").read_text())["state"] == "succeeded"
    too_many = subprocess.run(
        [*args[:-1], "generation.max_new_tokens=40"], env=env, capture_output=True, text=True, timeout=300
    )
    assert too_many.returncode == 2 and "leaves no room for a prompt" in too_many.stderr
    assert "Traceback" not in too_many.stderr


def test_the_first_rollout_shows_the_tokens_read_without_padding() -> None:
    """Row 0 of a left-padded batch: its 2 prompt tokens (not the pad before them), its response up to EOS."""
    import torch

    from nemotron.core.paths import shipped_root
    from nemotron.models.checkpoint import load_tokenizer
    from nemotron.rl.experience import Experience
    from nemotron.rl.stages import first_rollout

    tokenizer = load_tokenizer(shipped_root() / "tiny" / "sft_policy")
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    the, movie, was, great = tokenizer.convert_tokens_to_ids(["▁the", "▁movie", "▁was", "▁great"])
    # prompt width 3: row 0 is [pad, the, movie], row 1 [the, movie, was]; row 0 answers "great <eos>", then pad
    sequences = torch.tensor([[pad, the, movie, great, eos, pad], [the, movie, was, great, great, eos]])
    attention = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    zeros = torch.zeros(2, 3)
    exp = Experience(sequences, attention, 3, mask, mask.all(1), torch.arange(2), zeros, zeros, zeros, torch.zeros(2),
                     ["", ""], ["", ""], {})  # fmt: skip
    assert first_rollout(exp, tokenizer) == "prompt 'the movie' (2 tokens), response 'great<eos>'"
