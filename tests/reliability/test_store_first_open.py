"""Any number of simultaneous first users of a fresh home: 16 processes register into a store that does not exist
yet, released at once, 20 rounds. The schema switch (WAL, tables) used to race into `database is locked`."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemotron.artifacts import store as store_module
from nemotron.artifacts.store import SCHEMA, SCHEMA_VERSION, ArtifactStore

PROCESSES, ROUNDS = 16, 20
WORKER = """
import sys, time
from pathlib import Path
from nemotron.artifacts.store import ArtifactStore
root, src, go = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
(go.parent / f"ready{sys.argv[4]}").touch()
while not go.exists():
    time.sleep(0.001)
ArtifactStore(root).register_external("prompt_jsonl", src)
ArtifactStore(root).register([("w" + sys.argv[4], "prompt_jsonl", src, {})], None)
"""


def test_sixteen_first_users_of_a_fresh_store_at_once(tmp_path: Path) -> None:
    src = tmp_path / "p.jsonl"
    src.write_text('{"prompt": "hi"}\n')
    for round_ in range(ROUNDS):
        root, go = tmp_path / f"home{round_}" / "artifacts", tmp_path / f"home{round_}" / "go"
        go.parent.mkdir()  # the home; its store does not exist yet
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WORKER, str(root), str(src), str(go), str(i)],
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(PROCESSES)
        ]
        # Release them only once every one is waiting (python start-up takes seconds on a busy machine).
        ready = [tmp_path / f"home{round_}" / f"ready{i}" for i in range(PROCESSES)]
        deadline = time.monotonic() + 120
        while not all(r.exists() for r in ready) and time.monotonic() < deadline:
            time.sleep(0.01)
        go.touch()
        errors = [p.communicate(timeout=120)[1] for p in procs if p.wait(timeout=120) != 0]
        assert errors == [], f"round {round_}: {errors[0][-2000:]}"
        store = ArtifactStore(root)
        assert sorted(a.name for a in store.list_artifacts() if a.name.startswith("w")) == sorted(
            f"w{i}" for i in range(PROCESSES)
        )
        conn = sqlite3.connect(store.db_path)
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.close()


def test_a_store_written_before_schema_versions_opens_and_is_upgraded(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    old = sqlite3.connect(root / "index.sqlite")
    old.executescript(SCHEMA)  # the previous release's store: tables, no user_version
    old.close()
    src = tmp_path / "p.jsonl"
    src.write_text('{"prompt": "hi"}\n')
    ArtifactStore(root).register([("old", "prompt_jsonl", src, {})], None)
    conn = sqlite3.connect(root / "index.sqlite")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_schema_creation_that_fails_half_way_leaves_no_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Readers take no file lock, so they must never see some tables without the others.
    monkeypatch.setattr(store_module, "SCHEMA", SCHEMA + "CREATE TABLE broken (;")
    root = tmp_path / "artifacts"
    src = tmp_path / "p.jsonl"
    src.write_text('{"prompt": "hi"}\n')
    with pytest.raises(sqlite3.OperationalError):
        ArtifactStore(root).register([("a", "prompt_jsonl", src, {})], None)
    conn = sqlite3.connect(root / "index.sqlite")
    assert conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall() == []
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    conn.close()
    monkeypatch.undo()  # the next open creates the schema in full
    assert [a.name for a in ArtifactStore(root).register([("a", "prompt_jsonl", src, {})], None)] == ["a"]
