"""Reading JSONL validates every line and names file, line and field; writing is atomic."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemotron.data.jsonl import DataError, read_jsonl, read_jsonl_numbered, write_jsonl_atomic
from nemotron.data.records import PreferenceRecord, PromptRecord, SFTRecord
from nemotron.errors import UserError


def _file(tmp_path: Path, content: bytes | str, name: str = "data.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def _error(path: Path, record_type: type = SFTRecord, **kwargs: int) -> str:
    with pytest.raises(DataError) as info:
        read_jsonl(path, record_type, **kwargs)
    return str(info.value)


def test_reads_valid_records_and_skips_blank_lines(tmp_path: Path) -> None:
    path = _file(tmp_path, '{"prompt": "a", "response": "b"}\n\n  \n{"prompt": "c", "response": "d"}')
    assert read_jsonl(path, SFTRecord) == [
        SFTRecord(prompt="a", response="b"),
        SFTRecord(prompt="c", response="d"),
    ]


def test_numbered_records_carry_the_line_they_stand_on(tmp_path: Path) -> None:
    """Blank lines count (a CRLF ending is one line end, a no-break space alone is blank), as an editor counts."""
    content = '\r\n{"prompt": "a", "response": "b"}\r\n\u00a0\n\n{"prompt": "c", "response": "d"}'
    numbered = read_jsonl_numbered(_file(tmp_path, content), SFTRecord)
    assert [(line, r.prompt) for line, r in numbered] == [(2, "a"), (5, "c")]


def test_round_trip_through_the_atomic_writer(tmp_path: Path) -> None:
    records = [PreferenceRecord(prompt="p", chosen="good ü", rejected="bad")] * 3
    path = tmp_path / "sub" / "pairs.jsonl"
    assert write_jsonl_atomic(path, records) == 3
    assert read_jsonl(path, PreferenceRecord) == records
    assert "ü" in path.read_text(encoding="utf-8")  # written as UTF-8, not \\u escapes


def test_bad_json_names_file_and_line(tmp_path: Path) -> None:
    path = _file(tmp_path, '{"prompt": "a", "response": "b"}\n{"prompt": "a", \n')
    message = _error(path)
    assert f"{path}:2: bad JSON" in message


def test_missing_field_names_the_field(tmp_path: Path) -> None:
    message = _error(_file(tmp_path, '{"prompt": "a"}\n'))
    assert ":1: field 'response': Field required" in message


def test_extra_field_is_refused(tmp_path: Path) -> None:
    message = _error(_file(tmp_path, '{"prompt": "a", "response": "b", "score": 1}\n'))
    assert ":1: field 'score': Extra inputs are not permitted" in message


def test_wrong_type_is_refused_not_coerced(tmp_path: Path) -> None:
    message = _error(_file(tmp_path, '{"prompt": 7, "response": "b"}\n'))
    assert ":1: field 'prompt': Input should be a valid string, got int" in message


def test_empty_prompt_is_refused(tmp_path: Path) -> None:
    message = _error(_file(tmp_path, '{"prompt": "   ", "response": "b"}\n'), SFTRecord)
    assert ":1: field 'prompt': Value error, must not be empty" in message


def test_a_line_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    message = _error(_file(tmp_path, '["a", "b"]\n'))
    assert ":1: expected a JSON object, got list" in message


def test_bytes_that_are_not_utf8_are_refused(tmp_path: Path) -> None:
    message = _error(_file(tmp_path, b'{"prompt": "a", "response": "b"}\n{"prompt": "\xff"}\n'))
    assert ":2: not valid UTF-8 (bad byte at offset 12)" in message


def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = _file(tmp_path, b'\xef\xbb\xbf{"prompt": "a"}\n')
    assert read_jsonl(path, PromptRecord) == [PromptRecord(prompt="a")]


def test_over_long_lines_are_refused_and_the_rest_still_checked(tmp_path: Path) -> None:
    long_line = '{"prompt": "' + "x" * 100 + '"}'
    path = _file(tmp_path, f'{{"prompt": "ok"}}\n{long_line}\n{{"prompt": ""}}\n')
    message = _error(path, PromptRecord, max_line_bytes=64)
    assert ":2: line is longer than 64 bytes" in message
    assert ":3: field 'prompt'" in message  # reading resumed after the long line
    # Exactly at the limit is fine: the newline does not count.
    exact = '{"prompt": "' + "y" * (64 - 14) + '"}'
    assert len(exact) == 64
    assert read_jsonl(_file(tmp_path, exact + "\n", "exact.jsonl"), PromptRecord, max_line_bytes=64)


def test_empty_and_missing_files(tmp_path: Path) -> None:
    assert "no records (the file is empty)" in _error(_file(tmp_path, ""))
    assert "no records" in _error(_file(tmp_path, "\n\n", "blank.jsonl"))
    assert "no such file" in _error(tmp_path / "absent.jsonl")
    assert "is a directory" in _error(tmp_path)


def test_every_bad_line_is_reported_up_to_ten(tmp_path: Path) -> None:
    path = _file(tmp_path, '{"prompt": "a"}\n' * 12)
    with pytest.raises(DataError) as info:
        read_jsonl(path, SFTRecord)
    assert "12 invalid lines (expected SFTRecord records)" in info.value.message
    assert len(info.value.problems) == 11  # ten lines, then "... and 2 more bad lines"
    assert info.value.problems[-1] == "... and 2 more bad lines"
    assert isinstance(info.value, UserError)  # the CLI prints it without a traceback


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    write_jsonl_atomic(path, [PromptRecord(prompt="old")])

    def records_then_crash() -> object:
        yield PromptRecord(prompt="new")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        write_jsonl_atomic(path, records_then_crash())  # type: ignore[arg-type]
    assert read_jsonl(path, PromptRecord) == [PromptRecord(prompt="old")]
    assert [p.name for p in tmp_path.iterdir()] == ["prompts.jsonl"]


def test_a_bad_conversation_prompt_names_the_message_and_field(tmp_path: Path) -> None:
    bad = '{"prompt": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}], "response": "b"}\n'
    message = _error(_file(tmp_path, bad))
    assert ":1: field 'prompt.1.role': Input should be 'system', 'user' or 'assistant'" in message
    assert "valid string" not in message  # one expectation per error, not the text branch's too
