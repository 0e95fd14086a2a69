"""SFT and preference batches: the token layout, padding, and where the loss falls, checked by hand."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from nemotron.data.records import PreferenceRecord, SFTRecord
from nemotron.models.batches import IGNORE_INDEX, preference_batch, sft_batch
from nemotron.models.tokenizer import train_tokenizer

X = IGNORE_INDEX


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return train_tokenizer(["a b c"])


def ids(tok: PreTrainedTokenizerFast, *tokens: str) -> list[int]:
    return [tok.convert_tokens_to_ids(t) for t in tokens]


def test_sft_batch_trains_only_on_response_and_eos(tok: PreTrainedTokenizerFast) -> None:
    records = [SFTRecord(prompt="a", response="b c"), SFTRecord(prompt="a b", response="c")]
    batch = sft_batch(tok, records, max_length=16)
    a, b, c, arrow, eos, pad = ids(tok, "▁a", "▁b", "▁c", "▁=>", "<eos>", "<pad>")
    # Row 0: "a =>" + "b c" + EOS = 5 tokens. Row 1: "a b =>" + "c" + EOS = 5 tokens.
    assert batch.input_ids.tolist() == [[a, arrow, b, c, eos], [a, b, arrow, c, eos]]
    assert batch.attention_mask.tolist() == [[1] * 5, [1] * 5]
    assert batch.labels.tolist() == [[X, X, b, c, eos], [X, X, X, c, eos]]
    assert pad == tok.pad_token_id


def test_sft_batch_pads_on_the_right_and_masks_padding(tok: PreTrainedTokenizerFast) -> None:
    records = [SFTRecord(prompt="a", response="b"), SFTRecord(prompt="a", response="b c a")]
    batch = sft_batch(tok, records, max_length=16)
    a, b, arrow, eos, pad = ids(tok, "▁a", "▁b", "▁=>", "<eos>", "<pad>")
    assert batch.input_ids[0].tolist() == [a, arrow, b, eos, pad, pad]
    assert batch.attention_mask[0].tolist() == [1, 1, 1, 1, 0, 0]
    assert batch.labels[0].tolist() == [X, X, b, eos, X, X]


def test_sft_batch_cuts_long_responses_and_refuses_long_prompts(tok: PreTrainedTokenizerFast) -> None:
    batch = sft_batch(tok, [SFTRecord(prompt="a", response="b c a b")], max_length=4)
    a, b, c, arrow = ids(tok, "▁a", "▁b", "▁c", "▁=>")
    assert batch.input_ids.tolist() == [[a, arrow, b, c]]  # EOS and the rest cut
    with pytest.raises(ValueError, match="max_length is 2"):
        sft_batch(tok, [SFTRecord(prompt="a b", response="c")], max_length=2)


def test_preference_batch_stacks_chosen_rows_then_rejected_rows(tok: PreTrainedTokenizerFast) -> None:
    records = [
        PreferenceRecord(prompt="a", chosen="b", rejected="c c"),
        PreferenceRecord(prompt="b", chosen="a a", rejected="c"),
    ]
    batch = preference_batch(tok, records, max_length=16)
    a, b, c, arrow, eos, pad = ids(tok, "▁a", "▁b", "▁c", "▁=>", "<eos>", "<pad>")
    assert batch.input_ids.tolist() == [
        [a, arrow, b, eos, pad],  # chosen 0
        [b, arrow, a, a, eos],  # chosen 1
        [a, arrow, c, c, eos],  # rejected 0
        [b, arrow, c, eos, pad],  # rejected 1
    ]
    assert torch.equal(batch.attention_mask, (batch.input_ids != pad).long())


def test_an_empty_batch_is_an_error(tok: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match="no records"):
        sft_batch(tok, [], max_length=8)


@pytest.mark.slow
def test_sft_on_these_batches_teaches_the_grammar() -> None:
    import random

    from nemotron.models.tiny import build_policy
    from nemotron.tasks.sentiment import SentimentTask

    torch.set_num_threads(1)
    task = SentimentTask()
    tok = train_tokenizer(task.corpus())
    train, held_out = task.sft_records(2000, seed=0), task.sft_records(256, seed=1)
    policy = build_policy(
        len(tok), 2, 64, 4, 32, seed=0, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
    )

    def held_out_loss() -> float:
        with torch.no_grad():
            return float(policy(**sft_batch(tok, held_out, max_length=32)._asdict()).loss)

    before = held_out_loss()
    opt = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    rng = random.Random(0)
    for _ in range(150):
        loss = policy(**sft_batch(tok, rng.sample(train, 64), max_length=32)._asdict()).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = held_out_loss()
    # A random model is near uniform over 481 tokens: ln(481) = 6.18. The grammar's own entropy keeps the
    # trained loss near 1.8 (adjectives are a free choice among 69 words).
    assert before > 5.5
    assert after < 2.2, (before, after)

    # Greedy continuations are sentences of the grammar.
    prompt = torch.tensor([tok.encode("the movie was =>", add_special_tokens=False)])
    out = policy.generate(prompt, max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id)
    text = tok.decode(out[0, prompt.shape[1] :], skip_special_tokens=True)
    assert task.is_well_formed(text), text
