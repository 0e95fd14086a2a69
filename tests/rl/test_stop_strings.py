"""`generation.stop_strings` acts: the sampler is given the strings (it was accepted and passed to no sampler), it
decodes only a short tail each step (on the GPT-2 fast path and the Hugging Face path), and a tiny run with a space as
stop string produces responses a fraction as long as without."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import PreTrainedModel

from nemotron.config.stepconfig import Generation
from nemotron.models.tiny import tiny_model
from nemotron.rl import gpt2_fast
from nemotron.rl.experience import sampling_params
from nemotron.rl.rollout import SamplingParams, generate
from nemotron.rl.stop_strings import completes_stop_string, ends_in_stop_string, stop_window


def letters(ids: list[int]) -> str:
    """One letter per token: 0 -> a, 1 -> b, ..."""
    return "".join(chr(ord("a") + i % 26) for i in ids)


def test_the_window_is_the_longest_stop_string_in_bytes_plus_one() -> None:
    assert stop_window([]) == 0
    assert stop_window([" "]) == 2  # 1 byte + 1
    assert stop_window(["ab", "\n\n\n"]) == 4  # 3 bytes + 1
    assert stop_window(["é"]) == 3  # U+00E9 is 2 bytes in UTF-8, + 1


def test_a_tail_ends_in_a_stop_string_when_its_text_contains_one() -> None:
    tails = torch.tensor([[0, 1, 2], [2, 3, 1], [3, 1, 2]])  # "abc", "cdb", "dbc"
    hits = ends_in_stop_string(tails, letters, ["bc", "x"])
    assert hits.tolist() == [True, False, True]
    assert ends_in_stop_string(tails[:, 2:], letters, ["d"]).tolist() == [False, False, False]


def test_a_stop_string_split_inside_a_character_is_seen_once_its_last_byte_arrives() -> None:
    def utf8(ids: list[int]) -> str:  # one byte per token, like GPT-2's byte-level BPE
        return bytes(ids).decode("utf-8", errors="replace")

    e_acute = list("é".encode())  # [0xC3, 0xA9]
    window = stop_window(["é"])
    first_byte = torch.tensor([[ord("x"), ord("y"), e_acute[0]]])
    both = torch.tensor([[ord("y"), *e_acute]])
    assert ends_in_stop_string(first_byte[:, -window:], utf8, ["é"]).tolist() == [False]
    assert ends_in_stop_string(both[:, -window:], utf8, ["é"]).tolist() == [True]


def test_the_extra_token_keeps_a_leading_space_a_sentencepiece_decoder_drops() -> None:
    pieces = ["▁the", "▁cat", "s"]  # SentencePiece drops the first piece's leading space when decoding

    def sp(ids: list[int]) -> str:
        return "".join(pieces[i] for i in ids).replace("▁", " ").lstrip(" ")

    tail = torch.tensor([[0, 1]])  # "the cat": the stop string " c" starts in the last token
    assert stop_window([" c"]) == 3
    assert ends_in_stop_string(tail[:, -3:], sp, [" c"]).tolist() == [True]
    assert ends_in_stop_string(tail[:, -1:], sp, [" c"]).tolist() == [
        False
    ]  # a window without the extra token


PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14], [20, 21, 22, 23], [30, 31], [40, 41, 42, 43, 44]]


def stop_string_model(kind: str) -> PreTrainedModel:
    # No EOS in the configs: the rows here stop only on the stop string.
    if kind == "gpt2":
        return tiny_model(211, seed=1, n_embd=64, n_head=4)
    return tiny_model(
        211,
        seed=1,
        family="llama",
        n_head=4,
        num_key_value_heads=2,
        intermediate_size=64,
        tie_word_embeddings=False,
    )


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_generate_stops_at_the_first_match_decoding_only_a_tail(kind: str) -> None:
    model = stop_string_model(kind)
    assert gpt2_fast.supports(model) == (kind == "gpt2")  # both sampling paths are covered
    width = 16
    free = generate(model, PROMPTS, SamplingParams(max_new_tokens=width), torch.Generator().manual_seed(11))
    texts = [letters(r) for r in free.responses.tolist()]
    stop = texts[1][3:5]  # two tokens of row 1
    # Each row's draws do not depend on the others, so a stopped row is its free run up to the first match.
    expected = [text.find(stop) + len(stop) if stop in text else width for text in texts]
    assert width in expected and min(expected) < width, "the seed should leave rows with and without a match"

    decoded_lengths: list[int] = []

    def counting(ids: list[int]) -> str:
        decoded_lengths.append(len(ids))
        return letters(ids)

    params = SamplingParams(max_new_tokens=width, stop_strings=(stop,), decode=counting)
    out = generate(model, PROMPTS, params, torch.Generator().manual_seed(11))
    assert out.response_lengths.tolist() == expected
    assert out.is_end.tolist() == [e < width for e in expected]
    assert out.response_mask.sum(1).tolist() == expected  # nothing after the match is in the mask
    assert max(decoded_lengths) == stop_window([stop]) == 3  # the whole response was never decoded


def test_sampling_params_carry_the_generation_keys_the_stop_strings_and_a_decoder() -> None:
    tokenizer = SimpleNamespace(
        eos_token_id=2, pad_token_id=0, decode=lambda ids: "".join(chr(96 + i) for i in ids)
    )
    keys = Generation(stop_strings=[" ", "\n\n"])
    params = sampling_params(keys, tokenizer, stop_strings=keys.stop_strings)
    assert params.stop_strings == (" ", "\n\n") and params.decode is not None
    assert params.decode([1, 2, 3]) == "abc"
    assert sampling_params(Generation(), tokenizer).stop_strings == ()
    sampled = Generation(max_new_tokens=9, temperature=0.7, top_k=5, top_p=0.9)
    assert sampling_params(sampled, tokenizer) == SamplingParams(
        max_new_tokens=9, temperature=0.7, top_k=5, top_p=0.9, eos_token_id=2, pad_token_id=0
    )
    assert (
        sampling_params(sampled, tokenizer, greedy=True).greedy
        and not sampling_params(sampled, tokenizer).greedy
    )


def _mean_length(home: Path, *overrides: str) -> float:
    env = {**os.environ, "NEMOTRON_HOME": str(home)}
    args = [
        "steps",
        "run",
        "rl/reinforce",
        "-c",
        "tiny",
        "trainer.max_steps=2",
        "eval.num_prompts=0",
        *overrides,
    ]
    done = subprocess.run(
        [sys.executable, "-m", "nemotron", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (job,) = (home / "jobs").iterdir()
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    lengths = [r["response_lengths"] for r in rows if "response_lengths" in r]
    ended = [
        r["fraction_of_samples_properly_ended"] for r in rows if "fraction_of_samples_properly_ended" in r
    ]
    assert lengths and ended
    return sum(lengths) / len(lengths)


@pytest.mark.slow
def test_a_space_as_stop_string_cuts_responses_after_the_first_word(tmp_path: Path) -> None:
    without = _mean_length(tmp_path / "a")
    with_stop = _mean_length(tmp_path / "b", 'generation.stop_strings=[" "]')
    print(f"mean response length: {without:.2f} tokens without stop strings, {with_stop:.2f} with [' ']")
    assert with_stop < 0.6 * without


def test_only_active_rows_are_checked_on_a_tail_of_their_own_tokens() -> None:
    responses = torch.tensor(
        [
            [0, 1, 2, 9, 9],  # "abc": ends in "bc" at t=2
            [1, 2, 0, 9, 9],  # "bca": contains "bc", but not ending at t=2; dropped from the batch anyway
            [3, 1, 2, 9, 9],  # "dbc": ends in "bc", but it finished earlier (inactive)
            [2, 3, 3, 9, 9],  # "cdd": no match
        ]
    )
    live = torch.tensor([0, 2, 3])  # the model's batch holds rollout rows 0, 2 and 3
    active = torch.tensor([True, False, True])
    decoded: list[list[int]] = []

    def recording(ids: list[int]) -> str:
        decoded.append(ids)
        return letters(ids)

    hits = completes_stop_string(responses, live, active, 2, recording, ["bc"])
    assert hits.tolist() == [True, False, False]
    # stop_window(["bc"]) = 3 tokens, columns 0..2 of the active rows 0 and 3 only.
    assert decoded == [[0, 1, 2], [2, 3, 3]]
    decoded.clear()
    completes_stop_string(responses, live, active, 4, recording, ["b"])  # window 2: columns 3..4
    assert decoded == [[9, 9], [9, 9]]
