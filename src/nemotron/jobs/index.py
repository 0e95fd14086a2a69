"""The jobs index: one row per job directory, so `jobs ls` reads a page instead of every job.yaml.

The directories under $NEMOTRON_HOME/jobs stay the record of truth (users rsync, copy and delete them by hand). The
index lives beside them in $NEMOTRON_HOME/jobs.sqlite, or on the team's PostgreSQL when $NEMOTRON_STORE_URL is set
(index_pg.py, rows keyed by home and job id): it is written when a job is created and at every state change,
and before each listing it is brought up to date with the directories by comparing the dir names and the mtime, size
and inode of each job.yaml and status.json with what it recorded (a scan of stats, no YAML). Delete the file (or the
table) and it is rebuilt; an index that cannot be opened is replaced by one in memory, filled from the dirs.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from nemotron.core.paths import jobs_dir
from nemotron.core.storeurl import StoreUrl, store_url
from nemotron.errors import UserError
from nemotron.jobs.index_schema import COLS, INDEX_VERSION, IndexUnavailable
from nemotron.jobs.record import parse_record, read_status, safe_load

log = logging.getLogger("nemotron")

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY,
  seen TEXT NOT NULL,          -- mtime, size and inode of job.yaml and status.json when this row was read
  stamp TEXT NOT NULL,         -- the creation time in the id (YYYYMMDD-HHMMSS), '' if none: the listing order
  listed INTEGER NOT NULL,     -- 0 for a dir without job.yaml (not a job)
  step TEXT, preset TEXT, profile TEXT, executor TEXT,
  state TEXT NOT NULL,
  created TEXT, ended TEXT, exit_code INTEGER,
  outputs TEXT NOT NULL,       -- JSON: output name -> artifact name
  remote_id TEXT,
  error TEXT                   -- why the record is unreadable
);
CREATE INDEX IF NOT EXISTS jobs_newest ON jobs(listed, stamp, created, id);
CREATE INDEX IF NOT EXISTS jobs_step ON jobs(step, listed, stamp, created, id);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, listed, stamp, created, id);
"""
_ID_STAMP = re.compile(r"-(\d{8}-\d{6})-[0-9a-f]+$")
_BATCH = 500  # ids per statement: well within SQLite's variable limit
_WARNED: set[str] = set()  # store URLs found unusable in this process: warned about once, not tried again


class IndexDb(Protocol):
    """One open index, SQLite or PostgreSQL. Statements are written with `?` marks and the unqualified table name
    `jobs`; `scope` is the condition (and its values) that limits every statement to this home's rows."""

    scope: tuple[list[str], list[Any]]
    newest_first: str  # the listing's ORDER BY: NULL created last, as SQLite orders it

    def all(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...
    def run(self, sql: str, args: Sequence[Any] = ()) -> int: ...
    def upsert(self, rows: Sequence[tuple[Any, ...]]) -> None: ...
    def transaction(self) -> AbstractContextManager[None]: ...
    def close(self) -> None: ...


class SqliteDb:
    """The index in $NEMOTRON_HOME/jobs.sqlite (or in memory): one home per file, so no scope."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.scope: tuple[list[str], list[Any]] = ([], [])
        self.newest_first = "stamp DESC, created DESC, id DESC"

    def all(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, args).fetchall()

    def run(self, sql: str, args: Sequence[Any] = ()) -> int:
        return self.conn.execute(sql, args).rowcount

    def upsert(self, rows: Sequence[tuple[Any, ...]]) -> None:
        marks = ",".join("?" * len(COLS))
        self.conn.executemany(f"INSERT OR REPLACE INTO jobs ({','.join(COLS)}) VALUES ({marks})", rows)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.conn.close()


def _in_memory() -> SqliteDb:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.executescript(SCHEMA)
    return SqliteDb(conn)


def _warn_unavailable(url: StoreUrl, why: str) -> None:
    if url.url not in _WARNED:
        _WARNED.add(url.url)
        log.warning(
            "warning: jobs index on %s unavailable (%s); reading the job dirs instead", url.shown, why
        )


@dataclass(frozen=True)
class JobRow:
    """What `jobs ls` shows of a job: one row of the index."""

    job_id: str
    step: str | None
    preset: str | None
    profile: str | None
    executor: str | None
    state: str
    created_at: str | None
    ended_at: str | None
    exit_code: int | None
    outputs: dict[str, str]
    remote_id: str | None
    error: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "step": self.step, "preset": self.preset, "profile": self.profile,
                "executor": self.executor, "state": self.state, "created_at": self.created_at,
                "ended_at": self.ended_at, "exit_code": self.exit_code, "outputs": self.outputs,
                "remote_id": self.remote_id}  # fmt: skip


def _seen(job_dir: Path) -> str | None:
    """What changes when a job's record or state changes, by a nemotron process, a hand or a copy: the mtime, size
    and inode of job.yaml and of status.json. None if the dir is gone."""
    parts = []
    for name in ("job.yaml", "status.json"):
        try:
            st = (job_dir / name).stat()
            parts.append(f"{st.st_mtime_ns}.{st.st_size}.{st.st_ino}")
        except FileNotFoundError:
            parts.append("-")
        except OSError:
            return None
    if parts == ["-", "-"] and not job_dir.is_dir():
        return None
    return ":".join(parts)


def read_row(job_dir: Path, seen: str) -> tuple[Any, ...]:
    """The index row of one job dir, read from job.yaml (the C YAML loader) and status.json."""
    m = _ID_STAMP.search(job_dir.name)
    stamp = m.group(1) if m else ""
    path = job_dir / "job.yaml"
    if not path.is_file():
        return (
            job_dir.name,
            seen,
            stamp,
            0,
            None,
            None,
            None,
            None,
            "unknown",
            None,
            None,
            None,
            "{}",
            None,
            None,
        )
    st = read_status(job_dir)
    try:
        try:
            data = safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise UserError(f"cannot read {path}: {e}") from None
        rec = parse_record(data, path)
    except UserError as e:
        return (job_dir.name, seen, stamp, 1, None, None, None, None, "unreadable", None, None, None, "{}", None,
                e.render())  # fmt: skip
    code = st.get("exit_code")
    return (job_dir.name, seen, stamp, 1, rec.step, rec.preset, str(rec.profile.get("name") or "") or None,
            rec.executor, str(st.get("state") or "unknown"), rec.created_at, st.get("ended_at"),
            code if isinstance(code, int) else None, json.dumps({k: v.artifact for k, v in rec.outputs.items()}),
            st.get("remote_id"), None)  # fmt: skip


class JobsIndex:
    """The index of the jobs in one home. Writes are best effort for callers that record a job (a failed index
    write never fails a job: the next listing finds the change by its mtimes)."""

    def __init__(self, path: Path | None = None, root: Path | None = None) -> None:
        self.root = root or jobs_dir()
        self.path = path or self.root.parent / "jobs.sqlite"

    @contextmanager
    def _connect(self) -> Iterator[IndexDb]:
        """The index: on the team store when $NEMOTRON_STORE_URL is set, else the file, created (or rebuilt at
        another version) under a file lock; an in-memory one when the home is missing or cannot be written, or the
        team store is down (warned once), so a listing still works (by scanning)."""
        url = store_url()
        db: IndexDb
        if url is not None:
            db = self._open_store(url)
        else:
            try:
                db = SqliteDb(self._open_file())
            except (OSError, sqlite3.Error) as e:
                log.debug("jobs index %s unusable (%s): indexing in memory", self.path, e)
                db = _in_memory()
        try:
            yield db
        finally:
            db.close()

    def _open_store(self, url: StoreUrl) -> IndexDb:
        if not self.path.parent.is_dir() or url.url in _WARNED:
            return _in_memory()
        try:
            from nemotron.jobs.index_pg import PostgresDb  # psycopg only for a team store
        except ImportError as e:
            raise UserError(f"NEMOTRON_STORE_URL={url.shown!r} needs psycopg, which is not installed here ({e})",
                            hint="pip install 'nemotron[postgres]', or unset NEMOTRON_STORE_URL") from None  # fmt: skip

        try:
            return PostgresDb.open(url, str(self.path.parent.resolve()))
        except IndexUnavailable as e:
            _warn_unavailable(url, str(e))
            return _in_memory()

    def _open_file(self) -> sqlite3.Connection:
        if not self.path.parent.is_dir():
            raise OSError(f"no home at {self.path.parent}")
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout=30000")
            if conn.execute("PRAGMA user_version").fetchone()[0] != INDEX_VERSION:
                with (self.path.parent / "jobs.sqlite.lock").open("a") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    if conn.execute("PRAGMA user_version").fetchone()[0] != INDEX_VERSION:
                        conn.execute("PRAGMA journal_mode=WAL")
                        conn.executescript(f"BEGIN IMMEDIATE; DROP TABLE IF EXISTS jobs; {SCHEMA};"
                                           f" PRAGMA user_version={INDEX_VERSION}; COMMIT;")  # fmt: skip
        except BaseException:
            conn.close()
            raise
        return conn

    def record(self, job_dir: Path, status: dict[str, Any] | None = None) -> None:
        """Write one job's row after its record or state changed (`status`: the status.json just written)."""
        if not self.path.parent.is_dir():
            return
        seen = _seen(job_dir)
        try:
            with self._connect() as db:
                scope, scope_args = db.scope
                where = " AND ".join([*scope, "id=?"])
                if seen is None:
                    db.run(f"DELETE FROM jobs WHERE {where}", [*scope_args, job_dir.name])
                    return
                if status is not None:
                    code = status.get("exit_code")
                    changed = db.run(
                        f"UPDATE jobs SET seen=?, state=?, ended=?, exit_code=?, remote_id=? WHERE {where}"
                        " AND listed=1 AND state != 'unreadable'",
                        (seen, str(status.get("state") or "unknown"), status.get("ended_at"),
                         code if isinstance(code, int) else None, status.get("remote_id"), *scope_args,
                         job_dir.name),
                    )  # fmt: skip
                    if changed:
                        return
                db.upsert([read_row(job_dir, seen)])
        except (OSError, sqlite3.Error, IndexUnavailable, UserError) as e:
            log.debug("jobs index not updated for %s: %s", job_dir.name, e)

    def sync(self, db: IndexDb) -> int:
        """Bring the index up to date with the job dirs: read the dirs added or changed since it was written, drop
        the rows of dirs removed. Returns how many rows changed."""
        on_disk: dict[str, str] = {}
        if self.root.is_dir():
            with os.scandir(self.root) as entries:
                for e in entries:
                    if e.name.startswith(".") or not e.is_dir():
                        continue  # a job dir being created is a hidden temporary dir until its rename
                    seen = _seen(Path(e.path))
                    if seen is not None:
                        on_disk[e.name] = seen
        scope, scope_args = db.scope
        where = f" WHERE {' AND '.join(scope)}" if scope else ""
        indexed = dict(db.all(f"SELECT id, seen FROM jobs{where}", scope_args))
        # sorted: concurrent syncs of one home touch rows in the same order, so they queue instead of deadlocking
        gone = sorted(i for i in indexed if i not in on_disk)
        changed = sorted((n, s) for n, s in on_disk.items() if indexed.get(n) != s)
        if not gone and not changed:
            return 0
        rows = [read_row(self.root / n, s) for n, s in changed]
        with db.transaction():
            for i in range(0, len(gone), _BATCH):
                batch = gone[i : i + _BATCH]
                cond = " AND ".join([*scope, f"id IN ({','.join('?' * len(batch))})"])
                db.run(f"DELETE FROM jobs WHERE {cond}", [*scope_args, *batch])
            db.upsert(rows)
        return len(gone) + len(rows)

    def page(self, limit: int | None, step: str | None = None, state: str | None = None,
             since: str | None = None) -> tuple[list[JobRow], int]:  # fmt: skip
        """Jobs newest first (by the creation time in the id, then the record's), filtered, at most `limit`; and
        how many more match."""
        filters, args = ["listed=1"], list[Any]()
        if step:
            filters, args = [*filters, "step=?"], [*args, step]
        if state:
            filters, args = [*filters, "state=?"], [*args, state]
        if since:
            filters, args = [*filters, "created>=?"], [*args, since]
        url = store_url()
        try:
            with self._connect() as db:
                return self._page(db, limit, filters, args)
        except (
            IndexUnavailable
        ) as e:  # the team store failed after it opened: list from the dirs all the same
            if url is None:
                raise
            _warn_unavailable(url, str(e))
            with closing(_in_memory()) as memory:
                return self._page(memory, limit, filters, args)

    def _page(self, db: IndexDb, limit: int | None, filters: list[str],
              args: list[Any]) -> tuple[list[JobRow], int]:  # fmt: skip
        self.sync(db)
        cond = " AND ".join([*db.scope[0], *filters])
        args = [*db.scope[1], *args]
        sql = (f"SELECT id, step, preset, profile, executor, state, created, ended, exit_code, outputs, remote_id,"
               f" error FROM jobs WHERE {cond} ORDER BY {db.newest_first}")  # fmt: skip
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        rows = [JobRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], json.loads(r[9]), r[10], r[11])
                for r in db.all(sql, args)]  # fmt: skip
        more = 0
        if limit is not None and len(rows) == limit:
            more = db.all(f"SELECT COUNT(*) FROM jobs WHERE {cond}", args)[0][0] - limit
        return rows, more
