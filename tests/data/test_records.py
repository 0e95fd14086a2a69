"""Record schemas: strict fields, NeMo-Aligner's DPO field names accepted, and pairs that prefer something."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from nemotron.data.records import PreferenceRecord, SFTRecord


def test_nemo_aligner_dpo_names_are_read_as_chosen_and_rejected() -> None:
    record = PreferenceRecord.model_validate(
        {"prompt": "p", "chosen_response": "a", "rejected_response": "b"}
    )
    assert record == PreferenceRecord(prompt="p", chosen="a", rejected="b")
    assert record.model_dump(exclude_none=True) == {"prompt": "p", "chosen": "a", "rejected": "b"}


def test_nemo_aligner_dpo_rewards_are_read_and_optional() -> None:
    """rl/dpo's RPO losses read them; a line without them stays the three fields it was (the writer leaves None
    out)."""
    record = PreferenceRecord.model_validate_json(
        '{"prompt": "p", "chosen": "a", "rejected": "b", "chosen_reward": 2, "rejected_reward": -0.5}'
    )
    assert (record.chosen_reward, record.rejected_reward) == (2.0, -0.5)
    assert PreferenceRecord(prompt="p", chosen="a", rejected="b").chosen_reward is None


def test_a_pair_with_the_same_text_twice_is_refused() -> None:
    with pytest.raises(ValidationError, match="prefers nothing"):
        PreferenceRecord(prompt="p", chosen="same", rejected="same")


def test_records_are_frozen_values() -> None:
    record = SFTRecord(prompt="p", response="r")
    with pytest.raises(ValidationError):
        record.prompt = "q"  # type: ignore[misc]
    assert record == SFTRecord(prompt="p", response="r")


CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def test_a_prompt_may_be_a_conversation_ending_with_the_user() -> None:
    from nemotron.data.records import PromptRecord, prompt_text

    record = PromptRecord.model_validate(
        {"prompt": [{"role": "system", "content": "be kind"}, {"role": "user", "content": "the movie was"}]}
    )
    assert prompt_text(record.prompt) == "system: be kind\nuser: the movie was"
    assert prompt_text(PromptRecord(prompt="the movie was").prompt) == "the movie was"
    for bad, why in [
        ([], "at least one message"),
        (
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
            "ends with the user's turn",
        ),
        ([{"role": "robot", "content": "hi"}], "role"),
        ([{"role": "user", "content": "  "}], "empty or only whitespace"),
        ([{"role": "user", "content": "hi", "name": "x"}], "Extra inputs"),
    ]:
        with pytest.raises(ValidationError, match=why):
            PromptRecord.model_validate({"prompt": bad})


def test_conversations_go_through_the_chat_template_and_text_through_ours() -> None:
    from nemotron.core.paths import shipped_root
    from nemotron.data.records import PromptRecord
    from nemotron.errors import UserError
    from nemotron.models.checkpoint import load_tokenizer
    from nemotron.models.tokenizer import encode_prompt, format_prompt

    tokenizer = load_tokenizer(shipped_root() / "tiny" / "sft_policy")
    conversation = PromptRecord.model_validate(
        {"prompt": [{"role": "user", "content": "the movie was"}]}
    ).prompt
    with pytest.raises(UserError, match="has no chat template"):
        encode_prompt(tokenizer, conversation)
    tokenizer.chat_template = CHAT_TEMPLATE
    ids = encode_prompt(tokenizer, conversation)
    assert tokenizer.decode(ids) == tokenizer.decode(tokenizer.encode("user: the movie was\nassistant:"))
    assert encode_prompt(tokenizer, "the movie was") == tokenizer.encode(format_prompt("the movie was"))
