"""Listings that cost a page: `artifacts ls` newest first in SQL, lineage as a graph (each ancestor once), gc planned
in SQL and deleted in batches; and a store written by the previous release opens and upgrades in place."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from nemotron.artifacts.gc import GcRun
from nemotron.artifacts.store import SCHEMA_VERSION, ArtifactStore, open_store

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _file(tmp: Path, name: str, text: str = "{}\n") -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def self_rewarding_loop(store: ArtifactStore, src: Path, rounds: int) -> None:
    """Round k is trained from round k-1 as the policy AND judged by round k-1 as the judge."""
    prev = store.register([("policy", "checkpoint_hf", src, {"step": "sft"})], "sft-20260101-000000-0000")[0]
    for k in range(1, rounds + 1):
        prev = store.register([("policy", "checkpoint_hf", src, {"step": "rl/self-reward"})], f"rl-self-reward-{k}",
                              parents=[("policy", prev.id), ("judge", prev.id)])[0]  # fmt: skip


def test_a_store_written_by_the_previous_release_opens_and_upgrades(
    tmp_path: Path, home: Path, run_cli: Any
) -> None:
    shutil.copytree(FIXTURES / "store_v1", home / "artifacts")  # written by release 1 (schema version 1)
    r = run_cli("artifacts", "ls", "--json")
    assert r.code == 0, r.err
    assert [a["ref"] for a in json.loads(r.out)] == ["policy:v2", "policy:v1", "data:v1"]
    conn = sqlite3.connect(home / "artifacts" / "index.sqlite")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    assert {"artifacts_type", "artifacts_step", "edges_parent"} <= {
        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")
    }
    conn.close()
    lineage = json.loads(run_cli("artifacts", "lineage", "policy:v2", "--json").out)
    assert [n["ref"] for n in lineage["nodes"]] == ["policy:v2", "policy:v1", "data:v1"]


def test_artifacts_ls_pages_newest_first_with_filters(
    home: Path, tmp_path: Path, run_cli: Any, store_backend: str
) -> None:
    store = open_store(home / "artifacts")
    src = _file(tmp_path, "x.jsonl")
    for i in range(6):
        store.register(
            [(f"n{i % 2}", "prompt_jsonl" if i < 4 else "checkpoint_hf", src, {"step": f"s{i % 3}"})], f"j{i}"
        )
    refs = lambda *args: [a["ref"] for a in json.loads(run_cli("artifacts", "ls", "--json", *args).out)]  # noqa: E731
    assert refs("--limit", "2") == ["n1:v3", "n0:v3"]
    assert refs("--name", "n0") == refs("n0") == ["n0:v3", "n0:v2", "n0:v1"]
    assert refs("--type", "checkpoint_hf") == ["n1:v3", "n0:v3"]
    assert refs("--step", "s0") == ["n1:v2", "n0:v1"]
    assert (
        refs("--since", "2000-01-01") == refs("--all")
        and refs("--since", "1d") == refs()
        and len(refs()) == 6
    )
    assert refs("--since", "2999-01-01") == []
    r = run_cli("artifacts", "ls", "--limit", "4")
    assert (
        r.code == 0 and "n1:v3" in r.out and "n0:v1" not in r.out and "2 more artifacts, use --all" in r.err
    )
    lines = run_cli("artifacts", "ls", "--jsonl", "--limit", "3").out.splitlines()
    assert [json.loads(line)["ref"] for line in lines] == ["n1:v3", "n0:v3", "n1:v2"]
    with store._connect() as conn:  # the filters page on indexes, not a scan

        def plan(where: str) -> str:
            query = f"SELECT * FROM artifacts WHERE {where} ORDER BY id DESC LIMIT 50"
            if store_backend == "sqlite":
                return " ".join(r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {query}"))
            conn.execute("SET enable_seqscan = off")  # six rows: the planner would scan, unless it cannot
            return " ".join(r[0] for r in conn.execute(f"EXPLAIN {query}"))

        assert "artifacts_type" in plan("type='x'") and "artifacts_step" in plan(
            f"{store.index.step_sql}='x'"
        )


def test_lineage_of_a_self_rewarding_loop_prints_each_ancestor_once(
    home: Path, tmp_path: Path, run_cli: Any, store_backend: str
) -> None:
    self_rewarding_loop(open_store(home / "artifacts"), _file(tmp_path, "ckpt.json"), rounds=15)
    r = run_cli("artifacts", "lineage", "policy:latest")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    printed = [line for line in lines if "←" in line]
    assert len(printed) == 16 and len(lines) == 16 + 15  # every round once, plus one back-reference per round
    assert sum("↳ policy:v15 (above)" in line for line in lines) == 1
    graph = json.loads(run_cli("artifacts", "lineage", "policy:latest", "--json").out)
    assert graph["root"] == "policy:v16" and len(graph["nodes"]) == 16 and len(graph["edges"]) == 30
    assert {"child": "policy:v16", "parent": "policy:v15", "input": "judge"} in graph["edges"]
    shallow = json.loads(run_cli("artifacts", "lineage", "policy:latest", "--json", "--depth", "3").out)
    assert [n["ref"] for n in shallow["nodes"]] == ["policy:v16", "policy:v15", "policy:v14", "policy:v13"]
    assert (
        sum(
            "←" in line
            for line in run_cli("artifacts", "lineage", "policy:latest", "--depth", "3").out.splitlines()
        )
        == 4
    )


def test_lineage_back_references_point_below_when_the_ancestor_is_expanded_later() -> None:
    from nemotron.cli.lineage_view import lineage_lines

    # 1 <- a: 2 <- x: 3 ; 1 <- b: 3   (3 is nearest through b, so under a it is a reference to below)
    edges = [(1, 2, "a"), (1, 3, "b"), (2, 3, "x")]
    lines = lineage_lines(1, edges, {1: 0, 2: 1, 3: 1})
    assert lines == [(0, "", 1, "node"), (1, "a", 2, "node"), (2, "x", 3, "below"), (1, "b", 3, "node")]


def test_gc_yes_removes_40000_artifacts_in_batches(home: Path, tmp_path: Path, run_cli: Any) -> None:
    store = ArtifactStore(home / "artifacts")
    src = _file(tmp_path, "x.jsonl")
    store.register([(f"n{i % 8}", "prompt_jsonl", src, {}) for i in range(40_008)], "j")
    r = run_cli("artifacts", "gc")
    assert (
        r.code == 0
        and "would remove 5000 versions of n0 (v1..v5000)" in r.out
        and "8 kept, 40000 removable" in r.out
    )
    assert len(r.out.splitlines()) == 9  # a line per name and the total, not a line per artifact
    r = run_cli("artifacts", "gc", "--yes", timeout=300)
    assert r.code == 0, r.err
    assert "8 kept, 40000 removed" in r.out and src.exists()  # files outside the home are left alone
    assert sorted(a["ref"] for a in json.loads(run_cli("artifacts", "ls", "--json").out)) == [
        f"n{i}:v5001" for i in range(8)
    ]


def _consistent(db: Path) -> None:
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    dangling = conn.execute("SELECT COUNT(*) FROM edges WHERE child NOT IN (SELECT id FROM artifacts)"
                            " OR parent NOT IN (SELECT id FROM artifacts)").fetchone()[0]  # fmt: skip
    conn.close()
    assert dangling == 0


def test_an_interrupted_gc_leaves_a_consistent_store(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "a")
    src = _file(tmp_path, "x.jsonl")
    ids = [a.id for a in store.register([("d", "prompt_jsonl", src, {}) for _ in range(1200)], "j")]
    with sqlite3.connect(store.db_path) as conn:  # a chain: d:v(i+1) made from d:v(i)
        conn.executemany(
            "INSERT INTO edges VALUES (?,?,?)", [(ids[i], ids[i - 1], "prev") for i in range(1, 1200)]
        )
    conn.close()
    store.register([("m", "prompt_jsonl", src, {}) for _ in range(1200)], "j")
    batches: list[int] = []

    def interrupt(paths: list[str]) -> None:
        batches.append(len(paths))
        if len(batches) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), GcRun(store, keep=1, write=True) as run:
        assert run.gone == 1199  # d:v1..v1199 are ancestors of d:v1200: only m's old versions can go
        run.delete(interrupt)
    _consistent(store.db_path)
    assert store.count(name="m") == 1200 - sum(batches)
    with GcRun(store, keep=1, write=True) as run:
        assert run.delete(lambda paths: None) == 1199 - sum(batches)
    _consistent(store.db_path)
    assert store.count() == 1201


def test_gc_keeps_what_an_artifact_registered_during_the_gc_was_made_from(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "a")
    src = _file(tmp_path, "x.jsonl")
    old, _ = store.register([("d", "prompt_jsonl", src, {}), ("d", "prompt_jsonl", src, {})], "j")
    with GcRun(store, keep=1, write=True) as run:
        assert run.gone == 1
        store.register(
            [("m", "prompt_jsonl", src, {})], "j2", parents=[("data", old.id)]
        )  # a job finishing now
        assert run.delete(lambda paths: None) == 0
    assert store.get(old.id).ref == "d:v1"
    _consistent(store.db_path)


def test_a_long_listing_prints_columns_every_row_uncut(
    home: Path, tmp_path: Path, run_cli: Any, store_backend: str
) -> None:
    store = open_store(home / "artifacts")
    store.register(
        [("a_rather_long_artifact_name", "prompt_jsonl", _file(tmp_path, "x.jsonl"), {}) for _ in range(250)],
        "j",
    )
    r = run_cli("artifacts", "ls", "--all")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[1].split() == ["ref", "type", "step", "job", "sha256", "created"] and "…" not in r.out
    assert [line.split()[0] for line in lines[2:]] == [
        f"a_rather_long_artifact_name:v{v}" for v in range(250, 0, -1)
    ]
