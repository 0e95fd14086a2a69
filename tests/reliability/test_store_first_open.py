"""Any number of simultaneous first users of a fresh home: 16 processes register into a store that does not exist
yet, released at once, 20 rounds. The schema switch (WAL, tables) used to race into `database is locked`."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemotron.artifacts import schema as schema_module
from nemotron.artifacts.store import SCHEMA, SCHEMA_VERSION, ArtifactStore

PROCESSES, ROUNDS = 16, 20
WORKER = """
import sys, time
from pathlib import Path
from nemotron.artifacts.store import ArtifactStore
root, src, go = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
(go.parent / f"ready{sys.argv[4]}").touch()
given_up = time.monotonic() + 300  # a test killed before the release must not leave 16 processes spinning
while not go.exists():
    if time.monotonic() > given_up:
        sys.exit("never released")
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


# tests/fixtures/store_v1: a store written by release 1 (schema version 1: the tables, no indexes) with three
# artifacts, data:v1 -> policy:v1 -> policy:v2 (policy:v2 consumed policy:v1 as both policy and judge).
STORE_V1 = Path(__file__).resolve().parents[1] / "fixtures" / "store_v1"
# The indexes schema version 2 added (artifacts ls filters, gc, lineage's parent lookups).
NEW_INDEXES = {
    "artifacts": {"artifacts_type", "artifacts_step", "artifacts_job", "artifacts_created", "artifacts_sha"},
    "edges": {"edges_parent"},
}


def _indexes(db: Path) -> dict[str, dict[str, str | None]]:
    """{table: {index name: its CREATE statement (None for the ones SQLite makes for keys)}}"""
    conn = sqlite3.connect(db)
    try:
        return {
            table: {
                row[1]: conn.execute("SELECT sql FROM sqlite_master WHERE name=?", (row[1],)).fetchone()[0]
                for row in conn.execute(f"PRAGMA index_list({table})")
            }
            for table in NEW_INDEXES
        }
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("version", "first_use"),
    [(1, "read"), (1, "write"), (0, "write")],  # 0: written before stores carried a version (same tables)
)
def test_an_older_store_with_rows_is_upgraded_in_place(tmp_path: Path, version: int, first_use: str) -> None:
    root = tmp_path / "artifacts"
    shutil.copytree(STORE_V1, root)
    old = sqlite3.connect(root / "index.sqlite")
    old.execute(f"PRAGMA user_version={version}")
    (v2_id,) = old.execute("SELECT id FROM artifacts WHERE name='policy' AND version=2").fetchone()
    old.close()
    assert all(NEW_INDEXES[t].isdisjoint(names) for t, names in _indexes(root / "index.sqlite").items())
    store = ArtifactStore(root)
    src = tmp_path / "p.jsonl"
    src.write_text('{"prompt": "hi"}\n')
    if first_use == "read":
        assert [a.ref for a in store.list_artifacts()] == ["data:v1", "policy:v1", "policy:v2"]
    else:
        (v3,) = store.register(
            [("policy", "prompt_jsonl", src, {"step": "rl/ppo"})], "j", [("policy", v2_id)]
        )
        assert v3.ref == "policy:v3"  # versions go on from the old rows
        assert [(name, a.ref) for name, a in store.parents(v3.id)] == [("policy", "policy:v2")]
    fresh = ArtifactStore(tmp_path / "fresh")
    fresh.register([("x", "prompt_jsonl", src, {})], None)
    upgraded = _indexes(root / "index.sqlite")
    assert upgraded == _indexes(
        fresh.db_path
    )  # the same indexes, defined the same way, as a store made today
    assert all(NEW_INDEXES[t] <= set(names) for t, names in upgraded.items())
    conn = sqlite3.connect(root / "index.sqlite")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
    # The old rows read back whole, their lineage too.
    again = ArtifactStore(root)
    policy = again.resolve("policy", "v2")
    assert (policy.type, policy.job_id, policy.metadata) == (
        "prompt_jsonl",
        "rl-ppo-20251103-000000-cccc",
        {"step": "rl/ppo"},
    )
    assert [(name, a.ref) for name, a in again.parents(policy.id)] == [
        ("judge", "policy:v1"),
        ("policy", "policy:v1"),
    ]
    assert [a.ref for a in again.newest(None, step="data/prep")] == ["data:v1"]
    assert again.by_job("sft-20251102-000000-bbbb")[0].ref == "policy:v1"


def test_a_schema_creation_that_fails_half_way_leaves_no_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Readers take no file lock, so they must never see some tables without the others.
    monkeypatch.setattr(schema_module, "SCHEMA", SCHEMA + "CREATE TABLE broken (;")
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
