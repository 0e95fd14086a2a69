"""Reads an offline W&B run's `.wandb` file back as wandb's own protobuf Records, for the tests to check what the
tracker wrote. wandb 0.31 ships no Python reader any more (its writer and reader moved into the Go wandb-core
binary; the Python DataStore of earlier releases is gone), so the framing is read here: the file is a LevelDB log
(leveldb's doc/log_format.md: 32 KiB blocks of chunks, each a 7-byte header of CRC, length and type FULL, FIRST,
MIDDLE or LAST) behind a 7-byte W&B header. Each chunk's checksum is verified (zlib's CRC-32 over type and data, as
W&B writes it) and each whole record is parsed by `wandb.proto.wandb_internal_pb2.Record`."""

from __future__ import annotations

import json
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2 as pb

_FILE_HEADER = struct.Struct("<4sHB")  # ":W&B", magic 0xBEE1, version 0
_CHUNK_HEADER = struct.Struct("<IHB")  # checksum, length, type
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[pb.Record]:
    data = path.read_bytes()
    ident, magic, version = _FILE_HEADER.unpack_from(data)
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), f"{path} is not a W&B record file"
    pos, pending = _FILE_HEADER.size, b""
    while pos + _CHUNK_HEADER.size <= len(data):
        room = _BLOCK - pos % _BLOCK
        if room < _CHUNK_HEADER.size:  # a block's tail too short for a header is zero padding
            pos += room
            continue
        crc, length, kind = _CHUNK_HEADER.unpack_from(data, pos)
        if pos + _CHUNK_HEADER.size + length > len(data):  # a chunk the writer is still writing
            break
        chunk = data[pos + _CHUNK_HEADER.size : pos + _CHUNK_HEADER.size + length]
        pos += _CHUNK_HEADER.size + length
        if kind == 0:  # zero-filled rest of a block written while the run was open
            continue
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"corrupt chunk at {pos} in {path}"
        assert (kind in (_FULL, _FIRST)) == (pending == b""), f"chunk of type {kind} out of order in {path}"
        pending += chunk
        if kind in (_FULL, _LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def run_files(job_dir: Path, timeout_s: float = 20.0) -> list[Path]:
    """The `.wandb` file of every offline run under the job dir, oldest first, each once it is complete. The
    wandb-core service writes a run's records after `run.finish()` has returned, so this waits (up to timeout_s)
    for each file's exit record."""
    files = sorted(job_dir.glob("wandb/offline-run-*/run-*.wandb"))
    deadline = time.monotonic() + timeout_s
    for path in files:
        while not of_type(path, "exit"):
            assert time.monotonic() < deadline, f"{path} has no exit record after {timeout_s} s"
            time.sleep(0.05)
    return files


def of_type(path: Path, kind: str) -> list[Any]:
    """The payloads of one record type ("history", "artifact", "use_artifact", "stats", "run", "config", ...)."""
    return [getattr(r, kind) for r in records(path) if r.WhichOneof("record_type") == kind]


def _named(item: Any) -> str:
    # wandb-core writes a name as nested_key (one part for a flat name) and leaves key empty
    return str(item.key or ".".join(item.nested_key))


def points(path: Path) -> list[tuple[int, str]]:
    """(step, metric) of every value in the run's history records, in order and without merging, so a point sent
    twice shows twice (W&B's own `_step`, `_runtime`, `_timestamp` left out)."""
    return [
        (h.step.num, _named(i))
        for h in of_type(path, "history")
        for i in h.item
        if not _named(i).startswith("_")
    ]


def history(path: Path) -> dict[int, dict[str, Any]]:
    """step -> {metric: value} of the run's history rows, without W&B's own `_step`, `_runtime`, `_timestamp`."""
    rows: dict[int, dict[str, Any]] = {}
    for h in of_type(path, "history"):
        named = ((_named(i), i.value_json) for i in h.item)
        row = {k: json.loads(v) for k, v in named if not k.startswith("_")}
        rows.setdefault(h.step.num, {}).update(row)
    return rows


def config(path: Path) -> dict[str, Any]:
    """The run's config as the user set it: the run record's, with later config records over it (W&B's own
    `_wandb` entry left out)."""
    items: dict[str, Any] = {}
    for c in [r.config for r in of_type(path, "run")] + of_type(path, "config"):
        for i in c.update:
            if i.key != "_wandb":
                items[i.key] = json.loads(i.value_json)
    return items
