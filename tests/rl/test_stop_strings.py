"""`generation.stop_strings` acts: the sampler is given the strings (it was accepted and passed to no sampler), and
a tiny run with a space as stop string produces responses a fraction as long as without."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from nemotron.rl.experience import sampling_params
from nemotron.stepconfig import Generation


def test_sampling_params_carry_the_stop_strings_and_a_decoder() -> None:
    tokenizer = SimpleNamespace(eos_token_id=2, pad_token_id=0, decode=lambda ids: "".join(chr(96 + i) for i in ids))
    params = sampling_params(Generation(stop_strings=[" ", "\n\n"]), tokenizer)
    assert params.stop_strings == (" ", "\n\n") and params.decode is not None
    assert params.decode([1, 2, 3]) == "abc"
    assert sampling_params(Generation(), tokenizer).stop_strings == ()


def _mean_length(home: Path, *overrides: str) -> float:
    env = {**os.environ, "NEMOTRON_HOME": str(home)}
    args = ["steps", "run", "rl/reinforce", "-c", "tiny", "trainer.max_steps=2", "eval.num_prompts=0", *overrides]
    done = subprocess.run([sys.executable, "-m", "nemotron", *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (job,) = (home / "jobs").iterdir()
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    lengths = [r["response_lengths"] for r in rows if "response_lengths" in r]
    ended = [r["fraction_of_samples_properly_ended"] for r in rows if "fraction_of_samples_properly_ended" in r]
    assert lengths and ended
    return sum(lengths) / len(lengths)


@pytest.mark.slow
def test_a_space_as_stop_string_cuts_responses_after_the_first_word(tmp_path: Path) -> None:
    without = _mean_length(tmp_path / "a")
    with_stop = _mean_length(tmp_path / "b", 'generation.stop_strings=[" "]')
    print(f"mean response length: {without:.2f} tokens without stop strings, {with_stop:.2f} with [' ']")
    assert with_stop < 0.6 * without
