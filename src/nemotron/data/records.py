"""The record schemas of our JSONL data: one pydantic model per kind of line.

Field names follow the seeds where they agree: `prompt` as in NeMo-Aligner and TRL, `response` for the
SFT target, and `chosen`/`rejected` for preferences as in TRL and NeMo-Aligner's reward-model data.
NeMo-Aligner's DPO files name the last two `chosen_response`/`rejected_response`; those names are
accepted on input (and written back as `chosen`/`rejected`). NeMo-RL's chat-format datasets
(`context`/`completions` with ranks) are a different shape and are not read here.

A prompt is either text or a conversation: `{"prompt": [{"role": "system", "content": ...}, {"role": "user",
"content": ...}]}` (OpenAI/TRL messages, ending with the user's turn). Text goes through our prompt template; a
conversation through the tokenizer's chat template (`models.tokenizer.encode_prompt`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictStr,
    Tag,
    field_validator,
    model_validator,
)


class _Record(BaseModel):
    # strict: a number is not a string; frozen: records are values.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @field_validator("*")
    @classmethod
    def _not_blank(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            raise ValueError("must not be empty or only whitespace")
        return value


class Message(_Record):
    """One turn of a conversation, as in the OpenAI chat API and TRL's conversational datasets."""

    role: Literal["system", "user", "assistant"]
    content: StrictStr


def _prompt_kind(value: object) -> str:
    """Which branch validates a prompt, so an error names one expectation, not both."""
    return "messages" if isinstance(value, list) else "text"


# The tags appear in pydantic's error locations; jsonl's messages leave them out (`field 'prompt.0.role'`).
PROMPT_TAGS = ("text", "messages")
Prompt = Annotated[
    Annotated[StrictStr, Tag("text")] | Annotated[list[Message], Tag("messages")],
    Discriminator(_prompt_kind),
]


def _check_conversation(prompt: Prompt) -> Prompt:
    if isinstance(prompt, list):
        if not prompt:
            raise ValueError("a conversation needs at least one message")
        if prompt[-1].role != "user":
            raise ValueError(
                f"a conversation prompt ends with the user's turn, this one with {prompt[-1].role!r}"
            )
    return prompt


def prompt_text(prompt: Prompt) -> str:
    """The prompt as plain text (for judges, task scorers and logs): a conversation's turns as `role: content`."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.role}: {m.content}" for m in prompt)


class PromptRecord(_Record):
    """A prompt for RL rollouts: `{"prompt": "the movie was"}`, with an optional reference answer for evaluation:
    `{"prompt": "What is 1/4 + 1/4?", "answer": "\\frac{1}{2}"}` (eval/policy's scorers.math; RL steps ignore it)."""

    prompt: Prompt
    # Optional on the same record type, not a subtype: a prompt file with answers stays a prompt file every RL step
    # reads (NeMo-RL's math data carries the ground truth beside the prompt the same way), and old files stay valid.
    answer: StrictStr | None = None

    _conversation = field_validator("prompt")(_check_conversation)


class SFTRecord(_Record):
    """A supervised example: the prompt and the response the policy should learn to write."""

    prompt: Prompt
    response: StrictStr

    _conversation = field_validator("prompt")(_check_conversation)


class PreferenceRecord(_Record):
    """A preference pair for reward-model training: two responses to one prompt, the better one first."""

    prompt: Prompt
    chosen: StrictStr = Field(validation_alias=AliasChoices("chosen", "chosen_response"))
    rejected: StrictStr = Field(validation_alias=AliasChoices("rejected", "rejected_response"))
    # Ground-truth scores of the two responses, which only rl/dpo's RPO losses read (NeMo-Aligner's DPO data
    # carries them under these names; absent, it takes 1 and 0).
    chosen_reward: float | None = None
    rejected_reward: float | None = None

    _conversation = field_validator("prompt")(_check_conversation)

    @model_validator(mode="after")
    def _a_real_preference(self) -> PreferenceRecord:
        if self.chosen == self.rejected:
            raise ValueError("chosen and rejected are the same text, so the pair prefers nothing")
        return self
