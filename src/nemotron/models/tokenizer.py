"""The tokenizer we train for the tiny task, and the one prompt format every step uses.

A byte-pair-encoding tokenizer trained on the task's own words until every word is a single token;
characters outside the task still encode (letters, digits, ASCII punctuation), so any text a user sends
the reward server gets tokens. SFT, the reward model and RL all build their inputs with `format_prompt`,
`encode_prompt` and `encode_response`, so the policy is trained and scored on exactly the same template.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Sequence
from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from nemotron.data.records import Message
from nemotron.errors import UserError
from nemotron.models.prompts import PROMPT_TEMPLATE as PROMPT_TEMPLATE
from nemotron.models.prompts import format_prompt as format_prompt

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)

# Far above what the tiny corpus can fill: the trainer stops once every word is one token.
_VOCAB_CEILING = 4096


def train_tokenizer(corpus: Iterable[str], *, model_max_length: int = 64) -> PreTrainedTokenizerFast:
    """Train a BPE tokenizer on `corpus` (plus the prompt template) and wrap it for transformers.

    Text is NFKC-normalised and lower-cased, split on spaces (each word keeps a leading `▁`, so
    decoding restores the spaces), and merged until each corpus word is one token. Training is
    deterministic: the same corpus gives the same vocabulary. Special tokens: pad=0, eos=1, unk=2.
    """
    tok = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    alphabet = list(string.ascii_lowercase + string.digits + string.punctuation)
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_CEILING,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator([format_prompt(""), *corpus], trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=model_max_length,
        padding_side="right",
    )


def word_tokenizer(words: Sequence[str]) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer for tests and benchmarks: [PAD] = 0, [UNK] = 1, [EOS] = 2, then `words`."""
    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2} | {w: i + 3 for i, w in enumerate(words)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]"
    )


def encode_prompt(tokenizer: PreTrainedTokenizerFast, prompt: str | Sequence[Message]) -> list[int]:
    """Token ids of a prompt; the response's ids follow them directly.

    Text: `format_prompt(prompt)`. A conversation (a list of `Message`s): the tokenizer's chat template with the
    assistant's turn opened (`add_generation_prompt`), as TRL and vLLM render conversational prompts; a tokenizer
    without a chat template is a usage error.
    """
    if isinstance(prompt, str):
        ids: list[int] = tokenizer.encode(format_prompt(prompt), add_special_tokens=False)
        return ids
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(
            "the prompts are conversations (lists of messages), but the model's tokenizer has no chat template: "
            "use a checkpoint whose tokenizer_config.json has one, or give the prompts as text"
        )
    messages = [{"role": m.role, "content": m.content} for m in prompt]
    encoded: Any = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    rows = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(i) for i in rows]


def encode_response(tokenizer: PreTrainedTokenizerFast, response: str) -> list[int]:
    """Token ids of the response followed by EOS, the tokens SFT trains on and RL samples."""
    ids: list[int] = tokenizer.encode(response, add_special_tokens=False)
    return [*ids, _eos_id(tokenizer)]


def _eos_id(tokenizer: PreTrainedTokenizerFast) -> int:
    eos = tokenizer.eos_token_id
    if not isinstance(eos, int):
        raise ValueError("the tokenizer has no EOS token")
    return eos
