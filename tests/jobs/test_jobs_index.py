"""The jobs index ($NEMOTRON_HOME/jobs.sqlite, or the team's PostgreSQL when $NEMOTRON_STORE_URL is set): written
when a job is recorded, brought up to date with job dirs added, removed or edited by hand, rebuilt when deleted;
`jobs ls` pages it newest first with filters. The tests that take `store` run on both back ends."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from nemotron.core.procs import free_port
from nemotron.core.storeurl import StoreUrl
from nemotron.jobs import dirs as jobs
from nemotron.jobs import index as jobindex
from nemotron.jobs.index import JobsIndex
from nemotron.jobs.index_pg import PostgresDb


def make_job(
    home: Path,
    job_id: str,
    step: str = "sft",
    state: str = "succeeded",
    created: str = "2026-01-01T00:00:00+00:00",
) -> Path:
    d = home / "jobs" / job_id
    d.mkdir(parents=True)
    (d / "job.yaml").write_text(
        f"job_id: {job_id}\nstep: {step}\npreset: tiny\nmode: batch\nexecutor: local\n"
        f"created_at: '{created}'\nprofile: {{name: local}}\nconfig: {{}}\nconfig_hash: h\n"
        "launch: ''\noutputs: {policy: {artifact: sft_policy, type: checkpoint_hf}}\n"
    )
    (d / "status.json").write_text(
        json.dumps({"state": state, "exit_code": 0 if state == "succeeded" else None})
    )
    return d


def ids(rows: list[jobindex.JobRow]) -> list[str]:
    return [r.job_id for r in rows]


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, home: Path, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """The back end under test: None for jobs.sqlite, else the URL of a fresh PostgreSQL database, set in
    $NEMOTRON_STORE_URL for this process and the CLI processes it starts."""
    monkeypatch.setattr(jobindex, "_WARNED", set())
    if request.param == "sqlite":
        monkeypatch.delenv("NEMOTRON_STORE_URL", raising=False)
        return None
    url: str = request.getfixturevalue("postgres_url")
    monkeypatch.setenv("NEMOTRON_STORE_URL", url)
    return url


def drop_index(home: Path, store: str | None) -> None:
    """Delete the index as a user would: the file, or the tables."""
    if store is None:
        (home / "jobs.sqlite").unlink()
        return
    with psycopg.connect(store, autocommit=True) as conn:
        conn.execute("DROP TABLE job_index, job_index_version")


def test_the_index_follows_dirs_added_removed_and_edited_by_hand(
    home: Path, store: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = make_job(home, "sft-20260101-000001-aaaa")
    b = make_job(home, "rl-ppo-20260101-000002-bbbb", step="rl/ppo")
    index = JobsIndex()
    assert ids(index.page(None)[0]) == [b.name, a.name]
    assert (home / "jobs.sqlite").is_file() == (store is None) and not (
        home / "jobs" / "jobs.sqlite"
    ).exists()
    reads: list[Path] = []
    real = jobindex.read_row
    monkeypatch.setattr(jobindex, "read_row", lambda d, s: reads.append(d) or real(d, s))
    assert ids(index.page(None)[0]) == [b.name, a.name] and reads == []  # nothing changed: no job.yaml read
    shutil.copytree(a, home / "jobs" / "sft-20260101-000003-cccc")  # rsync'd in from elsewhere
    shutil.rmtree(b)  # deleted by hand
    (a / "status.json").write_text(json.dumps({"state": "failed", "exit_code": 1}))  # rewritten in place
    rows, more = index.page(None)
    assert ids(rows) == ["sft-20260101-000003-cccc", a.name] and more == 0
    assert (
        rows[1].state == "failed"
        and rows[1].exit_code == 1
        and sorted(p.name for p in reads) == sorted(["sft-20260101-000003-cccc", a.name])
    )
    drop_index(home, store)  # a deleted index is rebuilt from the dirs
    assert ids(index.page(None)[0]) == ["sft-20260101-000003-cccc", a.name]


def test_a_state_change_is_written_through(
    home: Path, store: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = make_job(home, "sft-20260101-000001-aaaa", state="pending")
    index = JobsIndex()
    assert index.page(None)[0][0].state == "pending"
    jobs.update_status(a, state="running", pid=1)
    reads: list[Path] = []
    monkeypatch.setattr(jobindex, "read_row", lambda d, s: reads.append(d))
    (row,) = index.page(None)[0]
    assert row.state == "running" and reads == []  # recorded by update_status, not found by the scan


def test_an_older_index_version_is_rebuilt(home: Path, store: str | None) -> None:
    make_job(home, "sft-20260101-000001-aaaa")
    if store is None:
        conn = sqlite3.connect(home / "jobs.sqlite")
        conn.executescript("CREATE TABLE jobs (id TEXT); PRAGMA user_version=0;")
        conn.close()
    else:
        assert ids(JobsIndex().page(None)[0]) == ["sft-20260101-000001-aaaa"]
        with psycopg.connect(store, autocommit=True) as pg:  # a row the dirs would never give, at version 0
            pg.execute("UPDATE job_index SET step='stale' WHERE id='sft-20260101-000001-aaaa'")
            pg.execute("UPDATE job_index_version SET version=0")
    (row,) = JobsIndex().page(None)[0]
    assert row.job_id == "sft-20260101-000001-aaaa" and row.step == "sft"


def test_a_newer_index_version_on_the_server_is_left_alone(
    home: Path, postgres_url: str, run_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newer nemotron sharing the server owns a newer table: this release lists from the dirs (one warning)
    instead of rebuilding it, else the two releases would rebuild each other's table at every listing."""
    monkeypatch.setenv("NEMOTRON_STORE_URL", postgres_url)
    a = make_job(home, "sft-20260101-000001-aaaa")
    assert ids(JobsIndex().page(None)[0]) == [a.name]
    with psycopg.connect(postgres_url, autocommit=True) as pg:
        pg.execute("UPDATE job_index_version SET version=%s", (jobindex.INDEX_VERSION + 1,))
    r = run_cli("jobs", "ls", "--json")
    assert r.code == 0 and [j["job_id"] for j in json.loads(r.out)] == [a.name]
    assert r.err.count("\n") == 1 and "newer than this nemotron's" in r.err, r.err
    with psycopg.connect(postgres_url, autocommit=True) as pg:
        assert pg.execute("SELECT version FROM job_index_version").fetchall() == [
            (jobindex.INDEX_VERSION + 1,)
        ]
        assert pg.execute("SELECT count(*) FROM job_index").fetchone() == (1,)  # its rows kept


def test_jobs_ls_pages_newest_first_with_filters(home: Path, store: str | None, run_cli: Any) -> None:
    for i in range(7):
        step = "sft" if i % 2 else "rl/ppo"
        make_job(
            home,
            f"{step.replace('/', '-')}-2026010{i + 1}-000000-{i:04x}",
            step=step,
            state="failed" if i == 3 else "succeeded",
            created=f"2026-01-0{i + 1}T00:00:00+00:00",
        )
    r = run_cli("jobs", "ls", "--json", "--limit", "3")
    assert r.code == 0, r.err
    assert [j["job_id"] for j in json.loads(r.out)] == [
        "rl-ppo-20260107-000000-0006",
        "sft-20260106-000000-0005",
        "rl-ppo-20260105-000000-0004",
    ]
    assert "4 more jobs, use --all" in r.err
    assert len(json.loads(run_cli("jobs", "ls", "--json", "--all").out)) == 7
    assert [j["job_id"] for j in json.loads(run_cli("jobs", "ls", "--json", "--step", "sft").out)] == [
        "sft-20260106-000000-0005",
        "sft-20260104-000000-0003",
        "sft-20260102-000000-0001",
    ]
    assert [j["job_id"] for j in json.loads(run_cli("jobs", "ls", "--json", "--state", "failed").out)] == [
        "sft-20260104-000000-0003"
    ]
    since = json.loads(run_cli("jobs", "ls", "--json", "--since", "2026-01-06").out)
    assert [j["job_id"] for j in since] == ["rl-ppo-20260107-000000-0006", "sft-20260106-000000-0005"]
    assert since[0]["outputs"] == {"policy": "sft_policy"} and since[0]["profile"] == "local"
    table = run_cli("jobs", "ls", "--limit", "1")
    assert table.code == 0 and "rl-ppo-20260107-000000-0006" in table.out and "6 more jobs" in table.err
    bad = run_cli("jobs", "ls", "--since", "last tuesday")
    assert bad.code == 2 and "--since 'last tuesday'" in bad.err and "Traceback" not in bad.err


def test_an_unreadable_record_lists_after_a_job_of_the_same_second(home: Path, store: str | None) -> None:
    make_job(home, "sft-20260101-000001-aaaa")
    broken = make_job(home, "sft-20260101-000001-bbbb")  # same stamp, higher id
    (broken / "job.yaml").write_text("job_id: [unclosed\n")
    (home / "jobs" / "sft-20260101-000001-cccc").mkdir()  # no job.yaml: not a job
    rows = JobsIndex().page(None)[0]
    # the record's creation time breaks the tie before the id, and a missing one sorts last (SQLite's NULL order)
    assert [(r.job_id, r.state) for r in rows] == [
        ("sft-20260101-000001-aaaa", "succeeded"),
        ("sft-20260101-000001-bbbb", "unreadable"),
    ]


def test_jobs_ls_on_an_empty_home_creates_nothing(home: Path, store: str | None, run_cli: Any) -> None:
    r = run_cli("jobs", "ls", "--json")
    assert r.code == 0 and json.loads(r.out) == [] and not home.exists()


class TracedIndex(JobsIndex):
    """The index, recording every statement its connections run (with the bound values written in)."""

    def __init__(self) -> None:
        super().__init__()
        self.statements: list[str] = []

    def _open_file(self) -> sqlite3.Connection:
        conn = super()._open_file()
        conn.set_trace_callback(self.statements.append)
        return conn


def test_a_page_is_read_in_index_order_without_sorting(home: Path) -> None:
    make_job(home, "sft-20260101-000001-aaaa", state="failed")
    make_job(home, "sft-20260102-000001-bbbb", state="failed")
    make_job(home, "rl-ppo-20260103-000001-cccc", step="rl/ppo")
    conn = sqlite3.connect(home / "jobs.sqlite")
    for filters in ({}, {"step": "sft"}, {"state": "failed"}, {"since": "2026-01-01"}):
        index = TracedIndex()
        rows, more = index.page(1, **filters)
        assert len(rows) == 1 and more >= 1, filters  # a page of one with more: the page and its count ran
        listing = [q for q in index.statements if q.startswith("SELECT") and " ORDER BY " in q]
        counts = [q for q in index.statements if q.startswith("SELECT COUNT(*)")]
        assert len(listing) == len(counts) == 1, index.statements
        for query in listing + counts:
            plan = " ".join(r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {query}"))
            assert "USING" in plan and "INDEX" in plan and "TEMP B-TREE" not in plan, (filters, query, plan)
    conn.close()


def test_two_homes_on_one_database_list_only_their_own_jobs(
    tmp_path: Path, postgres_url: str, run_cli: Any
) -> None:
    a, b = tmp_path / "team-a", tmp_path / "team-b"
    shared = make_job(a, "sft-20260101-000001-aaaa")
    make_job(a, "sft-20260102-000001-bbbb")
    shutil.copytree(shared, b / "jobs" / shared.name)  # the same id in both homes: one row each
    (b / "jobs" / shared.name / "status.json").write_text(json.dumps({"state": "failed", "exit_code": 1}))
    make_job(b, "rl-ppo-20260103-000001-cccc", step="rl/ppo")

    def ls(home: Path) -> list[tuple[str, str]]:
        r = run_cli(
            "jobs", "ls", "--json", env={"NEMOTRON_HOME": str(home), "NEMOTRON_STORE_URL": postgres_url}
        )
        assert r.code == 0 and "warning" not in r.err, r.err
        return [(j["job_id"], j["state"]) for j in json.loads(r.out)]

    assert ls(a) == [("sft-20260102-000001-bbbb", "succeeded"), (shared.name, "succeeded")]
    assert ls(b) == [("rl-ppo-20260103-000001-cccc", "succeeded"), (shared.name, "failed")]
    shutil.rmtree(shared)  # gone from team a only
    assert ls(a) == [("sft-20260102-000001-bbbb", "succeeded")]
    assert ls(b) == [("rl-ppo-20260103-000001-cccc", "succeeded"), (shared.name, "failed")]
    with psycopg.connect(postgres_url) as conn:
        homes = conn.execute("SELECT home, COUNT(*) FROM job_index GROUP BY home ORDER BY home").fetchall()
    assert homes == [(str(a.resolve()), 1), (str(b.resolve()), 2)]


# Each process waits for the go file, then lists (creating the schema, reading every dir and upserting: a cold sync).
_LIST_WHEN_TOLD = """
import os, sys, time
from pathlib import Path
from nemotron.jobs.index import JobsIndex
while not Path(sys.argv[1]).exists():
    time.sleep(0.005)
rows, more = JobsIndex().page(None)
print(len(rows), len({r.job_id for r in rows}))
"""


def test_four_processes_syncing_at_once_neither_fail_nor_duplicate(
    home: Path, store: str | None, tmp_path: Path
) -> None:
    n = 300
    for i in range(n):
        make_job(home, f"sft-20260101-{i:06d}-{i:04x}")
    go = tmp_path / "go"
    argv = [sys.executable, "-c", _LIST_WHEN_TOLD, str(go)]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)
    ]
    time.sleep(1.0)  # all four imported and waiting
    go.touch()
    done = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, done
    assert [out for out, _ in done] == [f"{n} {n}\n"] * 4 and all(err == "" for _, err in done), done
    if store is None:
        conn = sqlite3.connect(home / "jobs.sqlite")
        counted = conn.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM jobs").fetchone()
        conn.close()
    else:
        with psycopg.connect(store) as pg:
            counted = pg.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM job_index").fetchone()
    assert counted == (n, n)


def test_a_stopped_server_lists_from_the_dirs_with_one_warning(
    home: Path, run_cli: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    a = make_job(home, "sft-20260101-000001-aaaa")
    make_job(home, "rl-ppo-20260102-000001-bbbb", step="rl/ppo")
    url = f"postgresql://postgres:s3cret@127.0.0.1:{free_port()}/team"  # nothing listens there
    monkeypatch.setenv("NEMOTRON_STORE_URL", url)
    r = run_cli("jobs", "ls", "--json")
    assert r.code == 0 and [j["job_id"] for j in json.loads(r.out)] == ["rl-ppo-20260102-000001-bbbb", a.name]
    assert r.err.count("\n") == 1 and r.err.startswith(
        "warning: jobs index on postgresql://postgres:***@127.0.0.1:"
    )
    assert "reading the job dirs instead" in r.err and "s3cret" not in r.err and "Traceback" not in r.err
    table = run_cli("jobs", "ls")
    assert table.code == 0 and a.name in table.out and table.err.count("warning") == 1
    # In one process: a state change and two listings try the server once and warn once.
    monkeypatch.setattr(jobindex, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="nemotron"):
        jobs.update_status(a, state="failed", exit_code=1)
        assert ids(JobsIndex().page(None)[0]) == ["rl-ppo-20260102-000001-bbbb", a.name]
        assert JobsIndex().page(None, state="failed")[0][0].job_id == a.name
    assert [rec.levelname for rec in caplog.records] == ["WARNING"]


def test_jobs_ls_imports_psycopg_only_for_a_store_url(
    home: Path, store: str | None, run_cli_imports: Any
) -> None:
    make_job(home, "sft-20260101-000001-aaaa")
    r, imported = run_cli_imports("jobs", "ls", "--json")
    assert r.code == 0 and len(json.loads(r.out)) == 1, r.err
    assert ("psycopg" in imported) == (store is not None)


class TracedPostgresDb:
    """A PostgresDb that records each query it answers, so the test can ask the server for its plan."""

    def __init__(self, db: PostgresDb, queries: list[tuple[bytes, list[Any]]]) -> None:
        self.db, self.queries = db, queries
        self.scope, self.newest_first = db.scope, db.newest_first

    def all(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self.queries.append((PostgresDb._dialect(sql), list(args)))
        return self.db.all(sql, args)

    def run(self, sql: str, args: Sequence[Any] = ()) -> int:
        return self.db.run(sql, args)

    def upsert(self, rows: Sequence[tuple[Any, ...]]) -> None:
        self.db.upsert(rows)

    def transaction(self) -> AbstractContextManager[None]:
        return self.db.transaction()

    def close(self) -> None:
        self.db.close()


class TracedPostgresIndex(JobsIndex):
    def __init__(self) -> None:
        super().__init__()
        self.queries: list[tuple[bytes, list[Any]]] = []

    def _open_store(self, url: StoreUrl) -> jobindex.IndexDb:
        db = super()._open_store(url)
        assert isinstance(db, PostgresDb), "the store did not open"
        return TracedPostgresDb(db, self.queries)


def test_a_page_on_postgresql_is_read_in_index_order_without_sorting(
    home: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEMOTRON_STORE_URL", postgres_url)
    make_job(home, "sft-20260101-000001-aaaa", state="failed")
    make_job(home, "sft-20260102-000001-bbbb", state="failed")
    make_job(home, "rl-ppo-20260103-000001-cccc", step="rl/ppo")
    with psycopg.connect(postgres_url, autocommit=True) as pg:
        # a table this small is cheapest to scan and sort: forbid both, so only a usable index avoids them
        pg.execute("SET enable_seqscan = off")
        pg.execute("SET enable_sort = off")
        for filters in ({}, {"step": "sft"}, {"state": "failed"}, {"since": "2026-01-01"}):
            index = TracedPostgresIndex()
            rows, more = index.page(1, **filters)
            assert len(rows) == 1 and more >= 1, filters
            pages = [q for q in index.queries if b" ORDER BY " in q[0]]
            counts = [q for q in index.queries if q[0].startswith(b"SELECT COUNT(*)")]
            assert len(pages) == len(counts) == 1, index.queries
            for sql, args in pages + counts:
                plan = "\n".join(r[0] for r in pg.execute(b"EXPLAIN " + sql, args).fetchall())
                assert "Index" in plan and "Sort" not in plan and "Seq Scan" not in plan, (filters, plan)


class DroppedIndex(JobsIndex):
    """The index whose server connection is cut by the server right after it opened (a restart, a failover)."""

    def _open_store(self, url: StoreUrl) -> jobindex.IndexDb:
        db = super()._open_store(url)
        assert isinstance(db, PostgresDb), "the store did not open"
        with psycopg.connect(url.url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (db.conn.info.backend_pid,))
        return db


def test_a_connection_lost_mid_listing_lists_from_the_dirs_with_one_warning(
    home: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("NEMOTRON_STORE_URL", postgres_url)
    monkeypatch.setattr(jobindex, "_WARNED", set())
    make_job(home, "sft-20260101-000001-aaaa")
    make_job(home, "sft-20260102-000001-bbbb", state="failed")
    with caplog.at_level(logging.WARNING, logger="nemotron"):
        rows, more = DroppedIndex().page(1)
        assert ids(rows) == ["sft-20260102-000001-bbbb"] and more == 1
        assert ids(JobsIndex().page(None, state="succeeded")[0]) == ["sft-20260101-000001-aaaa"]
    assert len(caplog.records) == 1 and "reading the job dirs instead" in caplog.records[0].getMessage()


def test_a_store_url_without_psycopg_installed_is_one_line_exit_2(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    make_job(home, "sft-20260101-000001-aaaa")
    hidden = (
        tmp_path / "no-psycopg" / "psycopg"
    )  # first on the path: `import psycopg` fails as if not installed
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('No module named psycopg')\n")
    env = {
        "PYTHONPATH": f"{hidden.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "NEMOTRON_STORE_URL": "postgresql://postgres:s3cret@127.0.0.1:1/team",
    }
    r = run_cli("jobs", "ls", env=env)
    assert r.code == 2 and r.out == "" and "Traceback" not in r.err and "s3cret" not in r.err, r.err
    assert "needs psycopg, which is not installed here" in r.err and "nemotron[postgres]" in r.err
