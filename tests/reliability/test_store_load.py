"""The artifact store under load: eight processes register and resolve at once, 200 operations each.

Afterwards the index must be whole (SQLite integrity and foreign-key checks), every name's versions must run
1..n with no gap and no duplicate, every write a worker saw succeed must be there exactly once (with the
version the worker was told), every lineage edge must join existing rows, and no reader may ever have seen a
name's `latest` go backwards or miss its own write. The throughput goes to the terminal.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nemotron.artifacts.store import ArtifactStore
from nemotron.errors import NotFound

PROCESSES = 8
OPERATIONS = 200  # per process: every other one a register, the rest resolves
NAMES = ["data", "model", "eval"]

# One worker: wait for the start signal, then alternate resolve (of a random name) and register (of a random
# name, its parent the artifact the previous resolve returned); log every operation with its outcome.
WORKER = """
import json, random, sys, time
from pathlib import Path
from nemotron.artifacts.store import ArtifactStore
from nemotron.errors import NotFound
from nemotron.errors import NotFound

root, worker, count, src, go, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *map(Path, sys.argv[4:7])
names = json.loads(sys.argv[7])
store = ArtifactStore(Path(root))
rng = random.Random(worker)
out.with_suffix(".ready").touch()
deadline = time.monotonic() + 60
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.005)
log, parent = [], None
started = time.time()
for i in range(count):
    name = rng.choice(names)
    if i % 2 == 0:
        try:
            found = store.resolve(name)
            parent = found.id
            log.append({"op": "resolve", "name": name, "version": found.version, "id": found.id, "t": time.time()})
        except NotFound:
            log.append({"op": "resolve", "name": name, "version": None, "id": None, "t": time.time()})
    else:
        parents = [("input", parent)] if parent is not None else []
        made = store.register([(name, "prompt_jsonl", src, {"worker": worker, "i": i})], f"w{worker}", parents)[0]
        log.append({"op": "register", "name": name, "version": made.version, "id": made.id, "i": i,
                    "parent": parent, "t": time.time()})
out.write_text(json.dumps({"started": started, "ended": time.time(), "log": log}))
"""


def run_workers(tmp_path: Path) -> tuple[list[dict[str, Any]], float]:
    """Start the workers together; return their logs and the seconds from the start signal to the last end."""
    src = tmp_path / "prompts.jsonl"
    src.write_text('{"prompt": "hi"}\n')
    go = tmp_path / "go"
    # The race starts on a store that does not exist yet: readers may meet a file without tables.
    outs = [tmp_path / f"worker{w}.json" for w in range(PROCESSES)]
    args = [str(tmp_path / "store"), str(OPERATIONS), str(src), str(go)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, args[0], str(w), *args[1:], str(out), json.dumps(NAMES)],
            stderr=subprocess.PIPE,
        )
        for w, out in enumerate(outs)
    ]
    try:
        deadline = time.monotonic() + 60
        while not all(out.with_suffix(".ready").exists() for out in outs):
            assert time.monotonic() < deadline, "the workers did not start"
            assert all(p.poll() is None for p in procs), "a worker died before the start"
            time.sleep(0.01)
        go.touch()
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = [json.loads(out.read_text()) for out in outs]
    started = min(entry["started"] for entry in logs)
    return logs, max(entry["ended"] for entry in logs) - started


def test_eight_processes_at_once_lose_and_duplicate_nothing(
    tmp_path: Path, report: Callable[[str], None]
) -> None:
    logs, seconds = run_workers(tmp_path)
    store = ArtifactStore(tmp_path / "store")

    with sqlite3.connect(store.db_path) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []  # every edge joins existing rows
        edges = db.execute("SELECT child, parent, input_name FROM edges").fetchall()
    rows = {a.id: a for a in store.list_artifacts() if a.name != "seed"}

    # Versions per name: 1..n, no gap, no duplicate.
    by_name: dict[str, list[int]] = defaultdict(list)
    for artifact in rows.values():
        by_name[artifact.name].append(artifact.version)
    for name, versions in by_name.items():
        assert sorted(versions) == list(range(1, len(versions) + 1)), name

    # Every acknowledged write is there exactly once, as the worker was told; nothing else is there.
    registers = [(w, e) for w, log in enumerate(logs) for e in log["log"] if e["op"] == "register"]
    assert len(registers) == PROCESSES * OPERATIONS // 2 == len(rows)
    for worker, entry in registers:
        made = rows[entry["id"]]
        assert (made.name, made.version) == (entry["name"], entry["version"])
        assert made.metadata == {"worker": worker, "i": entry["i"]}
    assert len({(a.metadata["worker"], a.metadata["i"]) for a in rows.values()}) == len(rows)

    # Lineage: exactly the edge each register asked for.
    expected_edges = sorted((e["id"], e["parent"], "input") for _, e in registers if e["parent"] is not None)
    assert sorted(edges) == expected_edges

    # Readers: what `latest` returned existed, never went backwards, and never missed the reader's own write.
    for log in logs:
        newest: dict[str, int] = {}
        for entry in log["log"]:
            if entry["op"] == "resolve" and entry["version"] is None:
                assert entry["name"] not in newest, "a name this worker had seen vanished"
                continue
            if entry["op"] == "resolve":
                assert (
                    rows[entry["id"]].version == entry["version"] and rows[entry["id"]].name == entry["name"]
                )
                assert entry["version"] >= newest.get(entry["name"], 0), "latest went backwards"
            newest[entry["name"]] = max(newest.get(entry["name"], 0), entry["version"])

    total = PROCESSES * OPERATIONS
    report(
        f"artifact store: {PROCESSES} processes x {OPERATIONS} operations ({total // 2} registers, {total // 2} "
        f"resolves) in {seconds:.2f} s = {total / seconds:.0f} operations/s; "
        f"versions per name {dict(sorted((n, len(v)) for n, v in by_name.items()))}, {len(edges)} edges",
    )


def test_a_reader_racing_the_first_writer_sees_an_empty_store(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    store.root.mkdir()
    sqlite3.connect(store.db_path).close()  # the first writer's connect has made the file, not yet the tables
    with pytest.raises(NotFound):
        store.resolve("data")
