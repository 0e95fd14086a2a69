"""A job's resolved inputs are pinned from its submit until it registers its outputs or ends: `artifacts gc` run
beside it never removes them (issue 42: gc removed a running step's input, the step then registered an edge to
the deleted row, and `artifacts lineage` was a traceback). Run as a user would: the CLI in subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.slurm.jobs import wait_for

from nemotron.artifacts.gc import GcRun
from nemotron.artifacts.store import ArtifactStore, open_store


def _numbers(store: ArtifactStore, where: Path, count: int) -> list[Any]:
    """`count` versions of `numbers`, each its own file under the home (gc removes their files too)."""
    where.mkdir(parents=True, exist_ok=True)
    arts = []
    for i in range(count):
        f = where / f"numbers-{i}.jsonl"
        f.write_text(json.dumps({"prompt": f"numbers {i}"}) + "\n")
        arts += store.register([("numbers", "prompt_jsonl", f, {"step": "data/prep"})], f"job-numbers-{i}")
    return arts


def _pins(store: ArtifactStore) -> list[tuple[int, str]]:
    with store._connect() as conn:
        return [tuple(r) for r in conn.execute("SELECT artifact_id, job_id FROM pins ORDER BY artifact_id")]


def test_gc_beside_a_running_step_keeps_its_input_and_lineage_stays_whole(
    home: Path, fixture_steps: Path, run_cli: Any, store_backend: str
) -> None:
    store = open_store(home / "artifacts")
    v1, _ = _numbers(store, home / "data", 2)
    # the step resolves numbers:v1 and runs for a few seconds
    step = subprocess.Popen(
        [sys.executable, "-m", "nemotron", "steps", "run", "test/count", "-c", "tiny", f"inputs.numbers={v1.ref}",
         "trainer.max_steps=4", "trainer.sleep_s=1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    try:
        wait_for(lambda: list((home / "jobs").glob("*/metrics.jsonl")), 120, "a step logging")
        job_id = next((home / "jobs").glob("*/metrics.jsonl")).parent.name
        dry = run_cli("artifacts", "gc")  # v1 is older than the newest numbers: only the step keeps it
        assert dry.code == 0 and f"keeping numbers:v1: job {job_id} uses it as an input" in dry.out, dry.out
        r = run_cli("artifacts", "gc", "--yes")
        assert r.code == 0 and "0 removed" in r.out and "job " + job_id in r.out, r.out
        assert Path(v1.path).is_file() and store.resolve("numbers", "v1").id == v1.id
        assert _pins(store) == [(v1.id, job_id)]
    finally:
        _, err = step.communicate(timeout=240)
    assert step.returncode == 0, err[-2000:]
    assert _pins(store) == []  # registering the output let go of the input in the same transaction
    lineage = json.loads(run_cli("artifacts", "lineage", "count_result:latest", "--json").out)
    assert lineage["edges"] == [{"child": "count_result:v1", "parent": "numbers:v1", "input": "numbers"}]


def test_a_failed_job_lets_go_of_its_inputs_at_the_next_gc(
    home: Path, fixture_steps: Path, run_cli: Any, store_backend: str
) -> None:
    store = open_store(home / "artifacts")
    v1, _ = _numbers(store, home / "data", 2)
    failed = run_cli(
        "steps", "run", "test/count", "-c", "tiny", f"inputs.numbers={v1.ref}", "trainer.fail_at=1"
    )
    assert failed.code != 0 and [a for a, _ in _pins(store)] == [v1.id]  # held until someone sees the end
    (job_id,) = [d.name for d in (home / "jobs").iterdir() if d.is_dir()]
    assert json.loads(run_cli("jobs", "show", job_id, "--json").out)["consumed"] == ["numbers: numbers:v1"]
    r = run_cli("artifacts", "gc", "--yes")
    assert r.code == 0 and "removing numbers:v1" in r.out and "1 removed" in r.out, r.out
    assert _pins(store) == [] and not Path(v1.path).exists()
    # the job's record still names the version it read, marked as gone
    shown = run_cli("jobs", "show", job_id, "--json")
    assert json.loads(shown.out)["consumed"] == ["numbers: numbers:v1 (deleted)"], shown.out


def test_an_input_removed_before_its_job_pinned_it_is_bad_input_and_nothing_is_written(
    home: Path, tmp_path: Path, store_backend: str
) -> None:
    store = open_store(home / "artifacts")
    v1, _ = _numbers(store, home / "data", 2)
    with GcRun(store, keep=1, write=True) as run:  # the gc that won the race
        assert run.delete(lambda paths: None) == 1
    assert store.pin("job-late", [v1.id]) == [v1.id] and _pins(store) == []


def test_two_gcs_at_once_count_each_removal_once(home: Path, store_backend: str) -> None:
    store = open_store(home / "artifacts")
    _numbers(store, home / "data", 4)
    with (
        GcRun(store, keep=1, write=True) as first,
        GcRun(open_store(home / "artifacts"), keep=1, write=True) as second,
    ):
        assert first.gone == second.gone == 3  # both planned the same removals
        assert first.delete(lambda paths: None) == 3
        assert second.delete(lambda paths: None) == 0  # and only one removed them


def test_lineage_of_an_edge_to_a_removed_row_names_it_deleted(
    home: Path, fixture_steps: Path, run_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SQLite store written before pins can hold such an edge (the registration raced a gc; SQLite does not
    enforce the edge's foreign key, PostgreSQL refuses the delete): the lineage names the input the job
    recorded, marked deleted, and gc does not count the missing row as kept."""
    monkeypatch.delenv("NEMOTRON_STORE_URL", raising=False)
    store = open_store(home / "artifacts")
    v1, _ = _numbers(store, home / "data", 2)
    assert run_cli("steps", "run", "test/count", "-c", "tiny", f"inputs.numbers={v1.ref}").code == 0
    with store._connect(write=True) as conn:  # what the race left: the row gone, its edge still there
        store.index.begin_write(conn, exclusive=True)
        conn.execute("DELETE FROM artifacts WHERE id=?", (v1.id,))
        conn.execute("COMMIT")
    r = run_cli("artifacts", "lineage", "count_result:latest")
    assert r.code == 0 and "Traceback" not in r.err, r.err
    assert "numbers: numbers:v1 (deleted)" in r.out, r.out
    graph = json.loads(run_cli("artifacts", "lineage", "count_result:latest", "--json").out)
    assert graph["edges"] == [
        {"child": "count_result:v1", "parent": "numbers:v1", "input": "numbers", "deleted": True}
    ]
    gc = run_cli("artifacts", "gc")
    assert gc.code == 0 and "2 kept, 0 removable" in gc.out, gc.out  # numbers:v2 and count_result:v1


def test_a_failed_run_registers_no_external_input_and_a_finished_one_registers_it_with_its_output(
    home: Path, tmp_path: Path, fixture_steps: Path, run_cli: Any, store_backend: str
) -> None:
    """A plain-path input becomes `external.FILE:vN` in the transaction that registers the job's outputs: a run
    that fails leaves the store as it was (issue 42: it was registered when the job started)."""
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text(json.dumps({"prompt": "1"}) + "\n")
    failed = run_cli(
        "steps", "run", "test/count", "-c", "tiny", f"inputs.numbers={numbers}", "trainer.fail_at=1"
    )
    assert failed.code != 0
    store = open_store(home / "artifacts")
    assert not store.exists() or store.list_artifacts() == []
    done = run_cli("steps", "run", "test/count", "-c", "tiny", f"inputs.numbers={numbers}")
    assert done.code == 0, done.err
    lineage = json.loads(run_cli("artifacts", "lineage", "count_result:latest", "--json").out)
    assert lineage["edges"] == [
        {"child": "count_result:v1", "parent": "external.numbers.jsonl:v1", "input": "numbers"}
    ]
    assert sorted(a.ref for a in store.list_artifacts()) == ["count_result:v1", "external.numbers.jsonl:v1"]
