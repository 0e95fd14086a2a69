"""JSONL files of records: a reader that validates every line, and an atomic writer.

A bad file fails before training starts, with every problem named by file, line and field
(`data/sft.jsonl:12: field 'response': Field required`).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from nemotron.data.records import PROMPT_TAGS
from nemotron.errors import UserError

DEFAULT_MAX_LINE_BYTES = 1 << 20
# Enough to fix a file in one go without flooding the terminal.
MAX_REPORTED_PROBLEMS = 10

RecordT = TypeVar("RecordT", bound=BaseModel)


class DataError(UserError):
    """A data file that is missing, unreadable, or holds a line that is not a valid record."""


def read_jsonl(
    path: str | os.PathLike[str],
    record_type: type[RecordT],
    *,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> list[RecordT]:
    """Read and validate every line of a JSONL file as a `record_type`.

    Blank lines are skipped. Raises `DataError` listing up to ten bad lines: bad JSON, a line that is
    not an object, missing, extra or mistyped fields, empty text, bytes that are not UTF-8, a line
    over `max_line_bytes` (newline excluded), and a file with no records at all.
    """
    return [record for _, record in read_jsonl_numbered(path, record_type, max_line_bytes=max_line_bytes)]


def read_jsonl_numbered(
    path: str | os.PathLike[str],
    record_type: type[RecordT],
    *,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> list[tuple[int, RecordT]]:
    """`read_jsonl`, each record with its line number (from 1), for a later check that names the line."""
    path = Path(path)
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected a JSONL file") from None
    except PermissionError:
        raise DataError(f"{path}: permission denied") from None

    records: list[tuple[int, RecordT]] = []
    problems: list[str] = []
    n_bad = 0
    with handle:
        for line_number, raw in enumerate(_lines(handle, max_line_bytes), start=1):
            if raw is None:
                problem: str | None = f"line is longer than {max_line_bytes} bytes"
            else:
                if line_number == 1:
                    encoding = _wide_encoding(raw)
                    if encoding:  # every line would be "not UTF-8": one line that names the encoding instead
                        raise DataError(
                            f"{path}: encoded as {encoding}, not UTF-8: convert it, e.g. "
                            f"`iconv -f {encoding.split()[0]} -t UTF-8 {path.name} > {path.stem}.utf8{path.suffix}`"
                        )
                    raw = raw.removeprefix(b"\xef\xbb\xbf")
                parsed = _parse_line(raw, record_type)
                problem = parsed if isinstance(parsed, str) else None
                if isinstance(parsed, BaseModel):
                    records.append((line_number, parsed))
            if problem is not None:
                n_bad += 1
                if len(problems) < MAX_REPORTED_PROBLEMS:
                    problems.append(f"{path}:{line_number}: {problem}")
    if n_bad:
        more = n_bad - len(problems)
        if more:
            problems.append(f"... and {more} more bad lines")
        raise DataError(
            f"{path}: {n_bad} invalid line{'s' if n_bad > 1 else ''} (expected {record_type.__name__} records)",
            problems,
        )
    if not records:
        raise DataError(f"{path}: no records (the file is empty)")
    return records


def write_jsonl_atomic(path: str | os.PathLike[str], records: Iterable[BaseModel]) -> int:
    """Write one JSON object per record to `path` and return how many were written.

    The lines go to a temporary file beside `path` that is renamed over it at the end, so readers
    see either the old file or the whole new one, never a half-written file. An optional field left unset (None)
    is not written: a prompt without a reference answer is `{"prompt": ...}`, as before records had answers.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    count = 0
    try:
        with tmp.open("w", encoding="utf-8") as out:
            for record in records:
                out.write(record.model_dump_json(exclude_none=True))
                out.write("\n")
                count += 1
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return count


# byte order marks of the encodings a Windows editor or PowerShell's `>` saves text in; UTF-32's first, as its
# little-endian mark begins with UTF-16's
_WIDE_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32LE"),
    (b"\x00\x00\xfe\xff", "UTF-32BE"),
    (b"\xff\xfe", "UTF-16LE"),
    (b"\xfe\xff", "UTF-16BE"),
)


def _wide_encoding(head: bytes) -> str | None:
    """The UTF-16/32 encoding a file's first line is in, by its byte order mark or, without one, by ASCII text's
    zero bytes (`{"` is 7B 00 22 00 in UTF-16LE); None for UTF-8 and anything else."""
    for bom, name in _WIDE_BOMS:
        if head.startswith(bom):
            return f"{name} (byte order mark {bom.hex(' ').upper()})"
    sample = head[:64].rstrip(b"\r\n")
    if len(sample) >= 4 and b"\x00" in sample:
        if not any(sample[1::2]):
            return "UTF-16LE (no byte order mark)"
        if not any(sample[0::2]):
            return "UTF-16BE (no byte order mark)"
    return None


def _lines(handle: BinaryIO, max_line_bytes: int) -> Iterable[bytes | None]:
    """Yield each line's bytes without its line ending, or None for a line over the limit."""
    while True:
        raw = handle.readline(max_line_bytes + 1)
        if not raw:
            return
        if raw.endswith(b"\n"):
            yield raw.rstrip(b"\r\n")
        elif len(raw) <= max_line_bytes:
            yield raw.rstrip(b"\r")  # the last line, without a newline
        else:
            # Skip the rest of the long line in bounded reads, so one huge line costs no memory.
            while raw and not raw.endswith(b"\n"):
                raw = handle.readline(max_line_bytes + 1)
            yield None


def _parse_line(raw: bytes, record_type: type[RecordT]) -> RecordT | str | None:
    """The record on this line, what is wrong with it, or None for a blank line."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"not valid UTF-8 (bad byte at offset {err.start})"
    if not text.strip():
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        return f"bad JSON: {err.msg} at column {err.colno}"
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    try:
        return record_type.model_validate(obj)
    except ValidationError as err:
        return "; ".join(_describe(e) for e in err.errors())


def _describe(error: ErrorDetails) -> str:
    """One pydantic error as `field 'name': message`."""
    loc = ".".join(str(part) for part in error["loc"] if part not in PROMPT_TAGS)
    message = error["msg"]
    if error["type"] == "string_type":
        message += f", got {type(error['input']).__name__}"
    return f"field '{loc}': {message}" if loc else f"record: {message}"
