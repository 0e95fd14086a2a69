"""The jobs index: one SQLite row per job directory, so `jobs ls` reads a page instead of every job.yaml.

The directories under $NEMOTRON_HOME/jobs stay the record of truth (users rsync, copy and delete them by hand). The
index lives beside them in $NEMOTRON_HOME/jobs.sqlite: it is written when a job is created and at every state change,
and before each listing it is brought up to date with the directories by comparing the dir names and the mtime, size
and inode of each job.yaml and status.json with what it recorded (a scan of stats, no YAML). Delete the file and it is rebuilt.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nemotron.errors import UserError
from nemotron.jobrecord import parse_record, read_status, safe_load
from nemotron.paths import jobs_dir

log = logging.getLogger("nemotron")

INDEX_VERSION = 2  # PRAGMA user_version; the index is derived, so another version is rebuilt, not migrated
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
_COLS = ("id", "seen", "stamp", "listed", "step", "preset", "profile", "executor", "state", "created", "ended",
         "exit_code", "outputs", "remote_id", "error")  # fmt: skip
_ID_STAMP = re.compile(r"-(\d{8}-\d{6})-[0-9a-f]+$")
_BATCH = 500  # ids per statement: well within SQLite's variable limit


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
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """The index file, created (or rebuilt at another version) under a file lock; an in-memory one when the
        home cannot be written, so a read-only home still lists (by scanning)."""
        try:
            conn = self._open_file()
        except (OSError, sqlite3.Error) as e:
            log.debug("jobs index %s unusable (%s): indexing in memory", self.path, e)
            conn = sqlite3.connect(":memory:", isolation_level=None)
            conn.executescript(SCHEMA)
        try:
            yield conn
        finally:
            conn.close()

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
            with self._connect() as conn:
                if seen is None:
                    conn.execute("DELETE FROM jobs WHERE id=?", (job_dir.name,))
                    return
                if status is not None:
                    code = status.get("exit_code")
                    cur = conn.execute(
                        "UPDATE jobs SET seen=?, state=?, ended=?, exit_code=?, remote_id=? WHERE id=? AND listed=1"
                        " AND state != 'unreadable'",
                        (seen, str(status.get("state") or "unknown"), status.get("ended_at"),
                         code if isinstance(code, int) else None, status.get("remote_id"), job_dir.name),
                    )  # fmt: skip
                    if cur.rowcount:
                        return
                self._upsert(conn, [read_row(job_dir, seen)])
        except (OSError, sqlite3.Error) as e:
            log.debug("jobs index not updated for %s: %s", job_dir.name, e)

    @staticmethod
    def _upsert(conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        marks = ",".join("?" * len(_COLS))
        conn.executemany(f"INSERT OR REPLACE INTO jobs ({','.join(_COLS)}) VALUES ({marks})", rows)

    def sync(self, conn: sqlite3.Connection) -> int:
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
        indexed = dict(conn.execute("SELECT id, seen FROM jobs").fetchall())
        gone = [i for i in indexed if i not in on_disk]
        changed = [(n, s) for n, s in on_disk.items() if indexed.get(n) != s]
        if not gone and not changed:
            return 0
        rows = [read_row(self.root / n, s) for n, s in changed]
        conn.execute("BEGIN IMMEDIATE")
        try:
            for i in range(0, len(gone), _BATCH):
                batch = gone[i : i + _BATCH]
                conn.execute(f"DELETE FROM jobs WHERE id IN ({','.join('?' * len(batch))})", batch)
            self._upsert(conn, rows)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return len(gone) + len(rows)

    def page(self, limit: int | None, step: str | None = None, state: str | None = None,
             since: str | None = None) -> tuple[list[JobRow], int]:  # fmt: skip
        """Jobs newest first (by the creation time in the id, then the record's), filtered, at most `limit`; and
        how many more match."""
        where, args = ["listed=1"], list[Any]()
        if step:
            where, args = [*where, "step=?"], [*args, step]
        if state:
            where, args = [*where, "state=?"], [*args, state]
        if since:
            where, args = [*where, "created>=?"], [*args, since]
        cond = " AND ".join(where)
        with self._connect() as conn:
            self.sync(conn)
            sql = (f"SELECT id, step, preset, profile, executor, state, created, ended, exit_code, outputs, remote_id,"
                   f" error FROM jobs WHERE {cond} ORDER BY stamp DESC, created DESC, id DESC")  # fmt: skip
            if limit is not None:
                sql += f" LIMIT {int(limit)}"
            rows = [JobRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], json.loads(r[9]), r[10], r[11])
                    for r in conn.execute(sql, args)]  # fmt: skip
            more = 0
            if limit is not None and len(rows) == limit:
                more = conn.execute(f"SELECT COUNT(*) FROM jobs WHERE {cond}", args).fetchone()[0] - limit
        return rows, more
