"""Aliases (NAME@ALIAS): parsed wherever a reference is, set and moved with a recorded history, bound as step inputs
(dry run without torch), kept by gc, refused deletion; the schema migration from a store made by release 2; and
four processes moving one alias at once leave one consistent history."""

from __future__ import annotations

import itertools
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nemotron.artifacts.aliases import alias_history, move_alias, remove_alias
from nemotron.artifacts.gc import GcRun, gc_plan
from nemotron.artifacts.refs import check_alias_name, parse_ref, store_ref
from nemotron.artifacts.sqlite_index import SqliteIndex
from nemotron.artifacts.store import SCHEMA_VERSION, ArtifactStore, open_store
from nemotron.errors import NotFound, UserError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NEVER = ("torch", "transformers", "safetensors", "nemo_run", "leptonai", "torchx")


def _versions(store: ArtifactStore, tmp: Path, name: str, count: int, step: str = "data/prep") -> list[Any]:
    """`count` versions of `name`, each its own file (distinct content), in the store's home when it has one."""
    arts = []
    for i in range(count):
        f = tmp / f"{name}-{i}.jsonl"
        f.write_text(json.dumps({"prompt": f"{name} {i}"}) + "\n")
        arts += store.register([(name, "prompt_jsonl", f, {"step": step})], f"job-{name}-{i}")
    return arts


def test_references_name_an_alias_with_an_at_sign(tmp_path: Path) -> None:
    ref = parse_ref("tiny_ppo_policy@best")
    assert (ref.kind, ref.name, ref.version, ref.alias) == ("store", "tiny_ppo_policy", "@best", "best")
    assert parse_ref("art://tiny_ppo_policy@prod-2").alias == "prod-2"
    assert parse_ref("p@latest").version == "latest"  # every name's implicit alias
    assert parse_ref("p:v3").alias == "" and store_ref("p").version == "latest"
    with pytest.raises(UserError, match="a version is written p:v3"):
        parse_ref("p@v3")
    with pytest.raises(UserError, match="'LATEST' is reserved"):
        parse_ref("p@LATEST")
    with pytest.raises(UserError, match="not an alias name"):
        parse_ref("p@9lives")
    (tmp_path / "dir@best").mkdir()
    assert parse_ref("dir@best", base_dir=tmp_path).kind == "path"  # an existing path still wins
    assert check_alias_name("best") is None and check_alias_name("v2") is not None
    assert check_alias_name("x" * 65) is not None and check_alias_name("a.b") is not None


def test_set_move_resolve_and_remove_are_recorded(tmp_path: Path, store_backend: str) -> None:
    store = open_store(tmp_path / "a")
    v1, v2, v3 = _versions(store, tmp_path, "policy", 3)
    assert move_alias(store, v1, "best") is not None
    assert store.resolve("policy", "@best").id == v1.id and store.resolve("policy").id == v3.id
    assert move_alias(store, v1, "best") is None  # already there: nothing moves, nothing is recorded
    move = move_alias(store, v2, "best")
    assert move is not None and (move.from_version, move.to_version) == (1, 2)
    assert move.by_user and move.host and move.at.endswith("+00:00")
    assert store.resolve("policy", "@best").id == v2.id
    assert remove_alias(store, "policy", "best").from_version == 2
    assert [(m.from_version, m.to_version) for m in alias_history(store, "policy", "best")] == [
        (None, 1),
        (1, 2),
        (2, None),
    ]
    with pytest.raises(NotFound, match=r"has no alias 'best' \(it has none; set one with"):
        store.resolve("policy", "@best")
    move_alias(store, v3, "prod")
    with pytest.raises(NotFound, match="did you mean 'prod'"):
        store.resolve("policy", "@prd")
    with pytest.raises(NotFound, match="no alias policy@best"):
        remove_alias(store, "policy", "best")


def test_the_cli_sets_shows_lists_and_refuses_with_one_line(
    home: Path, tmp_path: Path, run_cli: Any, store_backend: str
) -> None:
    store = open_store(home / "artifacts")
    _versions(store, tmp_path, "policy", 3)
    _versions(store, tmp_path, "data", 2)
    r = run_cli("artifacts", "alias", "policy:v1", "best")
    assert r.code == 0 and r.out.strip() == "policy@best -> policy:v1 (new alias)", r.err
    moved = json.loads(run_cli("artifacts", "alias", "policy:v2", "best", "--json").out)
    assert moved == {"alias": "policy@best", "to": "policy:v2", "moved": True, "from": "policy:v1"}
    # an alias's target is a reference too: prod goes where best is
    assert run_cli("artifacts", "alias", "policy@best", "prod").code == 0
    assert run_cli("artifacts", "alias", "data:v1", "best").code == 0  # an alias belongs to one name
    shown = json.loads(run_cli("artifacts", "show", "policy@best", "--json").out)
    assert (shown["ref"], shown["aliases"]) == ("policy:v2", ["best", "prod"])
    assert [(h["alias"], h["from"], h["to"]) for h in shown["alias_history"]] == [
        ("policy@prod", None, "policy:v2"),
        ("policy@best", "policy:v1", "policy:v2"),
        ("policy@best", None, "policy:v1"),
    ]
    assert run_cli("artifacts", "verify", "art://policy@best").out.startswith("✓ policy:v2")
    assert json.loads(run_cli("artifacts", "lineage", "policy@prod", "--json").out)["root"] == "policy:v2"
    text = run_cli("artifacts", "show", "policy:v1").out  # v1: the move away from it
    assert "aliases: (none)" in text and "best: v1 -> v2  by " in text and "prod" not in text
    listed = json.loads(run_cli("artifacts", "ls", "--alias", "best", "--json").out)
    assert [(a["ref"], a["aliases"]) for a in listed] == [
        ("data:v1", ["best"]),
        ("policy:v2", ["best", "prod"]),
    ]
    table = run_cli("artifacts", "ls", "policy").out
    assert "aliases" in table and "@best @prod" in table
    assert "aliases" not in run_cli("artifacts", "ls", "data", "--limit", "1").out  # no alias on the page
    with store._connect() as conn:
        before = conn.execute("SELECT COUNT(*) FROM alias_history").fetchone()[0]
    for args, expect in [
        (("alias", "policy:v1", "latest"), "'latest' is reserved"),
        (("alias", "policy:v1", "v7"), "'v7' is reserved"),
        (("alias", "policy:v1", "no good"), "not an alias name"),
        (("alias", "policy:v9", "best"), "has no version v9"),
        (("alias", "nosuch:v1", "best"), "no artifact named 'nosuch'"),
        (("unalias", "policy@latest"), "implicit alias"),
        (("unalias", "policy@gone"), "no alias policy@gone"),
        (("unalias", "policy:v1"), "unalias takes NAME@ALIAS"),
        (("show", "policy@bset"), "did you mean 'best'"),
    ]:
        r = run_cli("artifacts", *args)
        # one line: the message (a missing version's, from before aliases, adds where to look)
        lines = r.err.strip().splitlines()
        assert r.code == 2 and expect in lines[0] and len(lines) == 1 + ("v9" in args[1]), (args, r.err)
        assert "Traceback" not in r.err
    with store._connect() as conn:
        assert conn.execute("SELECT COUNT(*) FROM alias_history").fetchone()[0] == before  # nothing written
    r = run_cli("artifacts", "unalias", "policy@prod")
    assert r.code == 0 and r.out.strip() == "removed policy@prod (it pointed at policy:v2)"
    removed = json.loads(run_cli("artifacts", "unalias", "data@best", "--json").out)
    assert removed == {"alias": "data@best", "removed": True, "from": "data:v1"}


def test_a_step_input_binds_through_an_alias_dry_run_without_torch(
    home: Path, fixture_steps: Path, tmp_path: Path, run_cli: Any, run_cli_imports: Any, store_backend: str
) -> None:
    store = open_store(home / "artifacts")
    v1, v2, _ = _versions(store, tmp_path, "numbers", 3)
    move_alias(store, v2, "best")
    r, imported = run_cli_imports(
        "steps", "run", "test/count", "-c", "tiny", "--dry-run", "inputs.numbers=numbers@best"
    )
    assert r.code == 0, r.err
    assert "<- numbers@best  [store: numbers:v2; type prompt_jsonl]" in r.out  # v2 although v3 is latest
    assert not [m for m in imported if m.split(".")[0] in NEVER] and "nemotron.compile" in imported
    move_alias(store, v1, "best")
    r = run_cli("steps", "run", "test/count", "-c", "tiny", "inputs.numbers=numbers@best")  # a real run
    assert r.code == 0, r.err
    (job_dir,) = (home / "jobs").iterdir()
    record = (job_dir / "job.yaml").read_text()  # the job keeps what the user wrote and what it resolved to
    assert "ref: numbers@best" in record and "artifact: numbers:v1" in record
    lineage = json.loads(run_cli("artifacts", "lineage", "count_result:latest", "--json").out)
    assert lineage["edges"] == [{"child": "count_result:v1", "parent": "numbers:v1", "input": "numbers"}]
    r = run_cli("steps", "run", "test/count", "-c", "tiny", "--dry-run", "inputs.numbers=numbers@worst")
    assert r.code == 2 and "input 'numbers': artifact 'numbers' has no alias 'worst'" in r.err


def test_gc_keeps_aliased_artifacts_and_says_so(
    run_cli: Any, job_outputs: tuple[ArtifactStore, Path]
) -> None:
    store, owned = job_outputs
    data = _versions(store, owned, "data", 3)
    model = store.register([("model", "prompt_jsonl", Path(data[0].path), {})], "m1",
                           parents=[("data", data[0].id)])[0]  # fmt: skip
    store.register([("model", "prompt_jsonl", Path(data[2].path), {})], "m2", parents=[("data", data[2].id)])
    move_alias(store, model, "best")  # model:v1 is old, and it keeps data:v1, its input, too
    kept, gone = gc_plan(store, keep=1)
    assert {a.ref for a in gone} == {"data:v2"} and {"model:v1", "data:v1"} <= {a.ref for a in kept}
    r = run_cli("artifacts", "gc")
    assert "keeping model:v1: alias model@best points at it" in r.out and "would remove data:v2" in r.out
    assert run_cli("artifacts", "gc", "--yes").code == 0
    assert {a.ref for a in store.list_artifacts()} == {"data:v1", "data:v3", "model:v1", "model:v2"}
    assert Path(data[0].path).exists() and not Path(data[1].path).exists()
    # an alias set after gc planned: the batch that would delete its artifact keeps it
    newer = _versions(store, owned, "data", 2)
    with GcRun(store, keep=1, write=True) as run:
        assert newer[0].id in {a.id for a in run.removable()}
        move_alias(store, newer[0], "pinned")
        run.delete(lambda paths: None)
    assert store.resolve("data", "@pinned").id == newer[0].id
    with pytest.raises(UserError, match=r"cannot delete data:v4: alias data@pinned points at it"):
        store.delete([newer[0].id])


def test_a_store_made_by_release_2_is_migrated_with_nothing_lost(
    tmp_path: Path, home: Path, run_cli: Any
) -> None:
    # tests/fixtures/store_v2: written by the code before aliases (schema version 2; its make.py)
    root = home / "artifacts"
    shutil.copytree(FIXTURES / "store_v2", root, ignore=shutil.ignore_patterns("*.py"))
    tables = ("artifacts", "edges")

    def rows(db: Path) -> dict[str, list[Any]]:
        with sqlite3.connect(db) as conn:
            return {t: conn.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in tables}

    def version(db: Path) -> int:
        with sqlite3.connect(db) as conn:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])

    before = rows(root / "index.sqlite")
    assert version(root / "index.sqlite") == 2 and len(before["artifacts"]) == 5 and len(before["edges"]) == 4
    r = run_cli("artifacts", "alias", "policy:v1", "best")  # a write opens the old store first
    assert r.code == 0, r.err
    assert version(root / "index.sqlite") == SCHEMA_VERSION == 4
    assert rows(root / "index.sqlite") == before  # every row as it was, byte for byte
    store = ArtifactStore(root)
    assert store.resolve("policy", "@best").metadata == {"step": "sft"}
    lineage = json.loads(run_cli("artifacts", "lineage", "policy:v2", "--json").out)
    assert {(e["parent"], e["input"]) for e in lineage["edges"]} == {
        ("policy:v1", "policy"), ("data:v2", "prompts"), ("external.rm:v1", "reward_model"), ("data:v1", "data")}  # fmt: skip
    v3 = store.register([("policy", "checkpoint_hf", tmp_path, {})], "j")[0]
    assert v3.ref == "policy:v3"  # versions go on


def test_an_old_store_that_is_not_upgraded_reads_as_having_no_aliases(tmp_path: Path) -> None:
    # A reader that cannot upgrade (a store this user may not write) reads the v2 tables as they are.
    root = tmp_path / "artifacts"
    shutil.copytree(FIXTURES / "store_v2", root, ignore=shutil.ignore_patterns("*.py"))
    store = ArtifactStore(root)
    assert isinstance(store.index, SqliteIndex)
    store.index._created = True  # what a reader without write access is left with: no upgrade
    assert [a.ref for a in store.newest(None, alias="best")] == []
    with pytest.raises(NotFound, match="has no alias 'best'"):
        store.resolve("policy", "@best")
    with GcRun(store, keep=1) as run:
        assert run.by_alias == [] and {a.ref for a in run.removable()} == set()
    with sqlite3.connect(root / "index.sqlite") as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2  # nothing was written


MOVER = """
import random, sys
from pathlib import Path
from nemotron.artifacts.aliases import move_alias
from nemotron.artifacts.store import open_store
root, worker, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = open_store(Path(root))
versions = [store.resolve("m", f"v{v}") for v in range(1, 6)]
rng = random.Random(worker)
moved = sum(move_alias(store, rng.choice(versions), "best") is not None for _ in range(count))
print(moved)
"""


def test_four_processes_moving_one_alias_leave_a_consistent_history(
    tmp_path: Path, store_backend: str
) -> None:
    root = tmp_path / "a"
    store = open_store(root)
    _versions(store, tmp_path, "m", 5)
    workers, per = 4, 30
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MOVER, str(root), str(w), str(per)], stdout=subprocess.PIPE, text=True
        )
        for w in range(workers)
    ]
    moved = [int(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    history = alias_history(store, "m", "best")
    assert len(history) == sum(moved) > workers  # every recorded move is one a writer made, none lost
    assert history[0].from_version is None
    for before, after in itertools.pairwise(history):
        assert after.from_version == before.to_version != after.to_version  # each move starts where one ended
    assert store.resolve("m", "@best").version == history[-1].to_version
