"""What the reward server scores with: plain callables, and the adapter that makes them from an HF reward model.

The server never sees a model, only a `Scorer`, so any reward function (a model, a rule, a remote call)
can sit behind the same protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemotron.reward.batcher import UnscorableInput

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class Scorer:
    """`score_sentences(texts) -> rewards`, optionally `score_tokens(token id rows) -> rewards`.

    Both are called from the one inference thread only, with at most `max_batch_size` rows at a time.
    `vocab_size`, when known, lets the server reject out-of-range token ids with a 400 before they
    reach a batch.
    """

    score_sentences: Callable[[list[str]], Sequence[float]]
    score_tokens: Callable[[list[list[int]]], Sequence[float]] | None = None
    vocab_size: int | None = None


def scorer_from_reward_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    *,
    add_special_tokens: bool = True,
) -> Scorer:
    """Wrap a sequence-classification reward model (num_labels=1) as a `Scorer`.

    Rows are right-padded with the model's pad id and the model pools its last non-pad token, exactly
    as for an unbatched call, so batching never changes a score. A row longer than `max_length` keeps
    its last `max_length` tokens, because the reward is read at the last token.
    """
    import torch

    pad_id = model.config.pad_token_id
    if pad_id is None:
        raise ValueError(
            "the reward model has no pad_token_id, so it cannot pool the last token of a padded batch"
        )
    positions = getattr(model.config, "n_positions", None) or getattr(
        model.config, "max_position_embeddings", None
    )
    if positions is not None and max_length > positions:
        raise ValueError(f"max_length {max_length} exceeds the model's {positions} positions")
    model.eval()
    device = model.device
    encode = batch_encoder(tokenizer, add_special_tokens)
    # Only a sentence's last max_length tokens are scored: tokenise no more text than those can span, so a
    # megabyte sentence costs its tail, not its whole token list (~70 bytes a character in the fast tokenizer).
    keep_chars = (max_length + 1) * longest_token_chars(tokenizer)

    def score_tokens(rows: list[list[int]]) -> list[float]:
        """rows: B lists of token ids, each non-empty -> B rewards (the model's logit at the last token)."""
        rows = [row[-max_length:] for row in rows]
        lengths = [len(row) for row in rows]
        if 0 in lengths:
            # e.g. a whitespace-only sentence: the request is at fault, so the server answers 400, not 500
            raise UnscorableInput("cannot score an empty token sequence (the text has no tokens)")
        width = max(lengths)
        # One tensor from padded lists: a torch.tensor call per row costs more than the model at batch 64.
        padded = [row + [pad_id] * (width - len(row)) for row in rows]
        input_ids = torch.tensor(padded, dtype=torch.long, device=device)  # [B, T]
        attention_mask = (
            torch.arange(width, device=device) < torch.tensor(lengths, device=device)[:, None]
        ).long()
        with torch.inference_mode():
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # [B, 1]
        return [float(x) for x in logits[:, 0].float().tolist()]

    def score_sentences(sentences: list[str]) -> list[float]:
        return score_tokens(encode([text[-keep_chars:] for text in sentences]))

    return Scorer(score_sentences, score_tokens, vocab_size=int(model.config.vocab_size))


def longest_token_chars(tokenizer: PreTrainedTokenizerBase) -> int:
    """The most characters of text one token of `tokenizer` can stand for: its longest vocabulary entry (a
    byte-level entry spells one character per byte, so it over-counts, never under-counts).

    N tokens thus span at most N x this many characters, and the last N tokens of a text are those of its last
    N x this (+1 token's worth, for a merge across the cut) characters. Not so for a tokenizer whose unknown
    token stands for a whole word of any length (word-level): there the cut text may give fewer tokens."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1)


def batch_encoder(
    tokenizer: PreTrainedTokenizerBase, add_special_tokens: bool = True
) -> Callable[[list[str]], list[list[int]]]:
    """texts -> their token id rows, exactly as `tokenizer(texts, add_special_tokens=...)["input_ids"]`.

    For a fast tokenizer that call spends more time in Python than its Rust backend takes to encode. The
    encoder here calls a private copy of the backend directly, set as the call sets it (no truncation, no
    padding, special tokens split or not), so another caller's `truncation=True` cannot leak into it.
    """
    backend: Any = getattr(tokenizer, "backend_tokenizer", None)
    if not getattr(tokenizer, "is_fast", False) or backend is None:

        def encode_slow(texts: list[str]) -> list[list[int]]:
            return [list(ids) for ids in tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]]

        return encode_slow
    from tokenizers import Tokenizer

    own = Tokenizer.from_str(backend.to_str())
    own.no_truncation()
    own.no_padding()
    own.encode_special_tokens = bool(getattr(tokenizer, "split_special_tokens", False))
    # encode_batch_fast (tokenizers >= 0.21) skips the character offsets, which we never read.
    encode_batch = getattr(own, "encode_batch_fast", own.encode_batch)

    def encode(texts: list[str]) -> list[list[int]]:
        return [encoding.ids for encoding in encode_batch(texts, add_special_tokens=add_special_tokens)]

    return encode
