"""The HF reward-model adapter: batching and padding never change a score; truncation keeps the end."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from nemotron.models.tiny import tiny_model
from nemotron.reward.scorer import Scorer, batch_encoder, scorer_from_reward_model


def test_batched_scores_equal_unbatched_model_calls(
    reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, model_scorer: Scorer
) -> None:
    sentences = ["bad", "the movie was great", "fun plot and good acting but very boring"]
    with torch.no_grad():
        alone = [
            float(reward_model(torch.tensor([tokenizer(s)["input_ids"]])).logits[0, 0]) for s in sentences
        ]
    batched = model_scorer.score_sentences(sentences)
    assert batched == pytest.approx(alone, abs=1e-5)
    assert len(set(batched)) == 3  # a random model still tells these apart


def test_token_rows_and_sentences_agree(tokenizer: PreTrainedTokenizerFast, model_scorer: Scorer) -> None:
    assert model_scorer.score_tokens is not None
    rows = [tokenizer(s)["input_ids"] for s in ["good", "awful acting"]]
    assert model_scorer.score_tokens(rows) == pytest.approx(
        model_scorer.score_sentences(["good", "awful acting"])
    )
    assert model_scorer.vocab_size == len(tokenizer)


def test_truncation_keeps_the_last_tokens(
    reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast
) -> None:
    scorer = scorer_from_reward_model(reward_model, tokenizer, max_length=3)
    long, tail = "the movie was very good fun", "good fun"
    # 6 words -> the last 3 ("very good fun"), which differs from scoring the last 2 words only.
    assert scorer.score_sentences([long]) == pytest.approx(scorer.score_sentences(["very good fun"]))
    assert scorer.score_sentences([long]) != pytest.approx(scorer.score_sentences([tail]))


def test_empty_rows_are_refused(model_scorer: Scorer) -> None:
    assert model_scorer.score_tokens is not None
    with pytest.raises(ValueError, match="empty"):
        model_scorer.score_tokens([[3], []])


def test_model_without_pad_token_is_refused(tokenizer: PreTrainedTokenizerFast) -> None:
    model = tiny_model(30, "reward_model", n_embd=8, n_layer=1, n_head=1)
    model.config.pad_token_id = None
    with pytest.raises(ValueError, match="pad_token_id"):
        scorer_from_reward_model(model, tokenizer, max_length=8)


def test_max_length_beyond_positions_is_refused(
    reward_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast
) -> None:
    with pytest.raises(ValueError, match="64 positions"):
        scorer_from_reward_model(reward_model, tokenizer, max_length=65)


def test_the_batch_encoder_gives_the_tokenizers_own_ids(tokenizer: PreTrainedTokenizerFast) -> None:
    texts = ["the movie was great", "", "  spaced   out  ", "unknown words here", "[EOS] good [PAD]", "é ü"]
    expected = tokenizer(texts)["input_ids"]
    assert batch_encoder(tokenizer)(texts) == expected
    assert (
        batch_encoder(tokenizer, add_special_tokens=False)(texts)
        == tokenizer(texts, add_special_tokens=False)["input_ids"]
    )
    # The tokenizer's own call leaves its backend set to whatever the last caller asked for; ours is unmoved.
    encode = batch_encoder(tokenizer)
    tokenizer(texts, truncation=True, max_length=2, padding="max_length")
    assert encode(texts) == expected
    assert any(len(row) > 2 for row in expected)  # so truncation would have shown
