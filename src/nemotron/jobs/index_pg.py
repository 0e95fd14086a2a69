"""The jobs index on the team's PostgreSQL ($NEMOTRON_STORE_URL): the same rows and listing as jobs.sqlite, in one
table that every home on the server shares, keyed by (home, job id) so two teams' homes never mix.

Imported only when the URL is set, so psycopg stays off the start-up path of a default install. Like the SQLite
index it is derived from the job dirs and rebuilt, never migrated: a version row stands in for SQLite's
PRAGMA user_version, and another version drops and recreates the table (each home refills its rows on its next
listing). Concurrent syncs of one home take a transaction-scoped advisory lock on the home and upsert with
ON CONFLICT, so two processes syncing at once neither fail nor duplicate.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg.errors

from nemotron.core.storeurl import StoreUrl
from nemotron.jobs.index_schema import COLS, INDEX_VERSION, IndexUnavailable

TABLE = "job_index"
# an unreachable server costs a listing this long once per process, then the dirs are read
CONNECT_TIMEOUT_S = 5
# a sync waiting on another one longer than this is a stuck server: fall back to the dirs
LOCK_TIMEOUT_MS = 30_000
# the advisory-lock class of this index (two-key form: class, hashtext(home) or 0 for the schema)
_LOCKS = 0x4E4A
# Text that is compared or ordered is COLLATE "C" (bytewise, as SQLite compares), whatever the database's locale.
SCHEMA = f"""
CREATE TABLE {TABLE} (
  home TEXT COLLATE "C" NOT NULL,  -- the resolved $NEMOTRON_HOME whose jobs dir holds the job
  id TEXT COLLATE "C" NOT NULL,
  seen TEXT NOT NULL,
  stamp TEXT COLLATE "C" NOT NULL,
  listed INTEGER NOT NULL,
  step TEXT COLLATE "C", preset TEXT, profile TEXT, executor TEXT,
  state TEXT COLLATE "C" NOT NULL,
  created TEXT COLLATE "C", ended TEXT, exit_code INTEGER,
  outputs TEXT NOT NULL,
  remote_id TEXT,
  error TEXT,
  PRIMARY KEY (home, id)
);
CREATE INDEX {TABLE}_newest ON {TABLE}(home, listed, stamp, created NULLS FIRST, id);
CREATE INDEX {TABLE}_step ON {TABLE}(home, step, listed, stamp, created NULLS FIRST, id);
CREATE INDEX {TABLE}_state ON {TABLE}(home, state, listed, stamp, created NULLS FIRST, id);
CREATE TABLE {TABLE}_version (version INTEGER NOT NULL);
"""  # column meanings: index.SCHEMA; created NULLS FIRST so a backward scan gives DESC NULLS LAST
_UPSERT = (
    f"INSERT INTO {TABLE} (home, {', '.join(COLS)}) VALUES ({', '.join(['%s'] * (len(COLS) + 1))})"
    f" ON CONFLICT (home, id) DO UPDATE SET {', '.join(f'{c}=EXCLUDED.{c}' for c in COLS if c != 'id')}"
)


def _current(version: int) -> bool:
    """True for this release's index; False for an older one (rebuilt); a newer one is refused."""
    if version > INDEX_VERSION:
        raise IndexUnavailable(
            f"the team store's jobs index is version {version}, newer than this nemotron's ({INDEX_VERSION}); "
            "upgrade nemotron to use it"
        )
    return version == INDEX_VERSION


def _one_line(e: psycopg.Error) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


class PostgresDb:
    """One connection to the team store, scoped to one home. Statements come in index.py's SQLite dialect (`?`
    marks, table `jobs`) and are rewritten here; every driver error leaves as IndexUnavailable."""

    def __init__(self, conn: psycopg.Connection[tuple[Any, ...]], home: str) -> None:
        self.conn = conn
        self.home = home
        self.scope: tuple[list[str], list[Any]] = (["home=?"], [home])
        # stamp is never NULL; created is, and SQLite sorts NULL lowest (last when descending)
        self.newest_first = "stamp DESC, created DESC NULLS LAST, id DESC"

    @classmethod
    def open(cls, url: StoreUrl, home: str) -> PostgresDb:
        try:
            conn = psycopg.connect(url.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                                   application_name="nemotron jobs index",
                                   options=f"-c lock_timeout={LOCK_TIMEOUT_MS}")  # fmt: skip
        except psycopg.Error as e:
            raise IndexUnavailable(_one_line(e)) from None
        try:
            cls._ensure_schema(conn)
        except IndexUnavailable:
            conn.close()
            raise
        except psycopg.Error as e:
            conn.close()
            raise IndexUnavailable(_one_line(e)) from None
        return cls(conn, home)

    @staticmethod
    def _ensure_schema(conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        """Create the table, or rebuild it from an older version, once across all processes (the lock). A newer
        version belongs to a newer nemotron sharing the server: rebuilding it would make the two releases rebuild
        each other's table on every listing, so this one lists from the dirs instead (IndexUnavailable)."""
        try:
            row = conn.execute(f"SELECT version FROM {TABLE}_version").fetchone()
            if row is not None and _current(row[0]):
                return
        except psycopg.errors.UndefinedTable:
            pass
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (_LOCKS,))
            exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{TABLE}_version",)).fetchone()
            if exists and exists[0]:
                row = conn.execute(f"SELECT version FROM {TABLE}_version").fetchone()
                if row is not None and _current(row[0]):
                    return  # another process built it while this one waited
            conn.execute(f"DROP TABLE IF EXISTS {TABLE}, {TABLE}_version")
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement.encode())  # bytes: DDL built from constants
            conn.execute(f"INSERT INTO {TABLE}_version VALUES (%s)", (INDEX_VERSION,))

    @staticmethod
    def _dialect(sql: str) -> bytes:
        return re.sub(r"\bjobs\b", TABLE, sql.replace("?", "%s")).encode()

    def all(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return self.conn.execute(self._dialect(sql), args).fetchall()
        except psycopg.Error as e:
            raise IndexUnavailable(_one_line(e)) from None

    def run(self, sql: str, args: Sequence[Any] = ()) -> int:
        try:
            return self.conn.execute(self._dialect(sql), args).rowcount
        except psycopg.Error as e:
            raise IndexUnavailable(_one_line(e)) from None

    def upsert(self, rows: Sequence[tuple[Any, ...]]) -> None:
        try:
            with self.conn.cursor() as cur:
                cur.executemany(_UPSERT.encode(), [(self.home, *r) for r in rows])
        except psycopg.Error as e:
            raise IndexUnavailable(_one_line(e)) from None

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction holding this home's lock: a second sync of the home waits for the first, then its upserts
        overwrite the same rows (ON CONFLICT) instead of failing on them."""
        try:
            with self.conn.transaction():
                self.conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_LOCKS, self.home))
                yield
        except psycopg.Error as e:
            raise IndexUnavailable(_one_line(e)) from None

    def close(self) -> None:
        self.conn.close()
