"""The artifact store's SQLite database (WAL), index.sqlite under the store's root: the default, for one user or
one host. Writers serialize on SQLite's write lock (BEGIN IMMEDIATE). sqlite3 is imported where a connection opens,
not with the module: a dry run opens the store without querying it."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemotron.artifacts.index import Connection
from nemotron.artifacts.schema import MIGRATIONS, SCHEMA_VERSION, schema_sql
from nemotron.core.paths import writable_dir
from nemotron.errors import disk_full, disk_full_while

if TYPE_CHECKING:
    import sqlite3


class SqliteIndex:
    step_sql = "json_extract(metadata, '$.step')"
    files_bytes_sql = "(SELECT COALESCE(SUM(json_extract(f.value, '$.size')), 0) FROM json_each(a.files) f)"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.db_path = root / "index.sqlite"
        self.where = str(root)
        self._created = False

    def exists(self) -> bool:
        return self.db_path.is_file()

    def begin_write(self, conn: Connection, names: Sequence[str] = (), exclusive: bool = False) -> None:
        conn.execute("BEGIN IMMEDIATE")  # one writer at a time, whatever it writes

    def stream(self, conn: Connection, sql: str, args: Sequence[Any]) -> Iterator[Any]:
        yield from conn.execute(sql, args)  # sqlite3 steps through the rows as they are read

    def begin_snapshot(self, conn: Connection) -> None:
        conn.execute("BEGIN")

    def _create_once(self) -> None:
        """Create the schema and switch to WAL exactly once per store, under an exclusive file lock: any number of
        processes may open a fresh home at once (the schema switch is where simultaneous first users raced into
        `database is locked`). `PRAGMA user_version` records the schema version, so later opens skip all DDL and an
        older store is brought up to date in place."""
        if self._created:
            return
        import sqlite3

        with (self.root / "index.sqlite.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            conn = sqlite3.connect(self.db_path, timeout=60, isolation_level=None)
            try:
                conn.execute("PRAGMA busy_timeout=60000")
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version < SCHEMA_VERSION:
                    conn.execute("PRAGMA journal_mode=WAL")  # cannot change inside a transaction
                    # One transaction: a reader (which takes no file lock) sees all the tables or none, and a
                    # creation or upgrade that fails half-way leaves nothing behind.
                    conn.executescript(
                        f"BEGIN IMMEDIATE; {schema_sql(version)}; PRAGMA user_version={SCHEMA_VERSION}; COMMIT;"
                    )
            finally:
                conn.close()
        self._created = True

    def _upgrade_for_reading(self) -> None:
        """A store written by an older release gets its new indexes on first read too; a store this user cannot
        write is read as it is (slower listings, same answers)."""
        if self._created:
            return
        import sqlite3

        try:
            conn = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=60)
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
            finally:
                conn.close()
            if 0 < version < SCHEMA_VERSION and os.access(self.root, os.W_OK):
                self._create_once()
        except (OSError, sqlite3.Error):
            return

    @contextmanager
    def connect(self, write: bool) -> Iterator[sqlite3.Connection]:
        import sqlite3

        if not write:
            with self._open(False) as conn:
                yield conn
            return
        try:
            with self._open(True) as conn:
                yield conn
        except sqlite3.OperationalError as err:
            # SQLite says `disk I/O error` or `database or disk is full`: name the store and the space left
            if disk_full(err, self.root) is not None:
                raise disk_full_while("the artifact store", self.db_path) from err
            raise

    @contextmanager
    def _open(self, write: bool) -> Iterator[sqlite3.Connection]:
        import sqlite3

        if write:
            writable_dir(self.root, "artifact store")
        elif not self.exists():
            # Reads on an empty home must not create anything (dry-run writes nothing).
            conn = sqlite3.connect(":memory:", isolation_level=None)
            conn.executescript(schema_sql())
            try:
                yield conn
            finally:
                conn.close()
            return
        if write:
            self._create_once()
        else:
            self._upgrade_for_reading()
        conn = sqlite3.connect(self.db_path, timeout=60, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout=60000")
            if not write:
                conn = self._readable(conn)
            if (
                not write
                and not conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type='table' AND name='artifacts'"
                ).fetchone()
            ):
                # The first writer created the file but not yet its tables: to a reader the store is still empty.
                conn.close()
                conn = sqlite3.connect(":memory:", isolation_level=None)
                conn.executescript(schema_sql())
            elif (
                not write and not conn.execute("SELECT 1 FROM sqlite_master WHERE name='aliases'").fetchone()
            ):
                # A store older than aliases that this user cannot upgrade has none: empty tables of this
                # connection's own (TEMP: nothing is written to the store) answer the queries that join them.
                conn.executescript(MIGRATIONS[3].replace("CREATE TABLE", "CREATE TEMP TABLE"))
            yield conn
        finally:
            conn.close()

    def _readable(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        """`conn`, or where it cannot read, the file as it is. A reader of a WAL database creates its shared-memory
        index (index.sqlite-shm) first, which fails on a full or read-only filesystem as `disk I/O error`: with no
        committed transaction waiting in the WAL the main file holds everything, so it is read as immutable (no
        -shm, no locks; nothing can write it meanwhile, since no write fits either)."""
        import sqlite3

        try:
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")
            return conn
        except sqlite3.OperationalError:
            wal = Path(f"{self.db_path}-wal")
            if wal.is_file() and wal.stat().st_size > 0:
                raise
            conn.close()
            return sqlite3.connect(f"file:{self.db_path}?immutable=1", uri=True, isolation_level=None)
