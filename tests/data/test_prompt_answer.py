"""A prompt record's optional reference answer: old files stay valid, an answer is text, never blank."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from nemotron.data.jsonl import read_jsonl, write_jsonl_atomic
from nemotron.data.records import PromptRecord


def test_a_prompt_without_an_answer_is_still_a_prompt() -> None:
    assert PromptRecord.model_validate({"prompt": "the movie was"}).answer is None


def test_a_prompt_without_an_answer_is_written_as_before(tmp_path: Path) -> None:
    """data/prep's prompt files stay byte for byte what they were before records had answers (the shipped tiny data
    is checked against its sha256): no `"answer": null`."""
    path = tmp_path / "prompts.jsonl"
    write_jsonl_atomic(path, [PromptRecord(prompt="the movie was"), PromptRecord(prompt="1+1=", answer="2")])
    assert path.read_text() == '{"prompt":"the movie was"}\n{"prompt":"1+1=","answer":"2"}\n'
    assert [r.answer for r in read_jsonl(path, PromptRecord)] == [None, "2"]


def test_an_answer_is_kept_as_written() -> None:
    record = PromptRecord.model_validate({"prompt": "1/4 + 1/4 =", "answer": "\\frac{1}{2}"})
    assert record.answer == "\\frac{1}{2}"


@pytest.mark.parametrize(("answer", "says"), [(0.5, "valid string"), ("  ", "must not be empty")])
def test_an_answer_is_nonblank_text(answer: object, says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        PromptRecord.model_validate({"prompt": "1/4 + 1/4 =", "answer": answer})
