"""The artifact store's PostgreSQL database ($NEMOTRON_STORE_URL): a team's store, written from several hosts.
The files of artifacts stay on the filesystem under the store's root; only the index lives here.

Writers that register different names run at once; two registering one name wait for each other on an advisory
lock of the name (taken in the order of its key, so a job registering several names cannot deadlock with another),
which is what makes versions gapless and unique. Deletions take the store's lock exclusively. psycopg is imported
here only, and this module only when $NEMOTRON_STORE_URL is set."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from nemotron.artifacts.index import Connection, Cursor, committed
from nemotron.artifacts.schema import SCHEMA_VERSION, pg_schema_sql
from nemotron.core.storeurl import StoreUrl
from nemotron.errors import ServiceError, UserError

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("nemotron")

COMPONENT = "artifacts"  # this schema's row in schema_version (the jobs index may keep its own there)
# Advisory lock keys (pg_advisory_xact_lock's two-int form): the first names what is locked.
SCHEMA_LOCK = (0x4E4D5452, 1)  # creating or upgrading the schema
STORE_LOCK = (0x4E4D5452, 2)  # shared by writers, exclusive for deletions
NAME_SPACE = 0x4E4D5453  # with hashtext(name): allocating versions of one name
CONNECT_TRIES = 4
CONNECT_TIMEOUT_S = 5


class PgConnection:
    """A psycopg connection that runs the store's SQL as written for both back ends (`?` parameters)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.raw = conn

    def execute(self, sql: str, parameters: Any = (), /) -> Cursor:
        # The store's SQL has no `%` and no `?` operator: the qmark parameters map one to one onto psycopg's.
        params = list(parameters)
        return self.raw.execute(sql.replace("?", "%s"), params if params else None)


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise UserError(
            "NEMOTRON_STORE_URL names a PostgreSQL store, but psycopg is not installed",
            hint="pip install 'nemotron[postgres]'",
        ) from None
    return psycopg


class PostgresIndex:
    step_sql = "((metadata::jsonb) ->> 'step')"
    files_bytes_sql = (
        "(SELECT COALESCE(SUM((f ->> 'size')::bigint), 0) FROM jsonb_array_elements(a.files::jsonb) f)"
    )

    def __init__(self, url: StoreUrl) -> None:
        self.url = url
        self.where = url.shown
        self._version: int | None = None  # the schema version this process saw, once it looked
        # One idle connection kept for the next command of this process: a connection costs a TCP and an auth
        # round trip, several times a query's cost (`artifacts show` makes four). Never shared across a fork.
        self._idle: tuple[int, psycopg.Connection[Any]] | None = None

    def _connect_raw(self) -> psycopg.Connection[Any]:
        """A connection, after up to CONNECT_TRIES tries with backoff; a store that stays unreachable (down, a
        wrong host, refused credentials) is one clear line and exit 3, never a driver traceback."""
        psycopg = _psycopg()
        delay = 0.5
        for attempt in range(1, CONNECT_TRIES + 1):
            try:
                return psycopg.connect(self.url.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)  # type: ignore[no-any-return]
            except psycopg.OperationalError as err:
                why = (str(err).strip().splitlines() or ["no answer"])[-1]
                if attempt == CONNECT_TRIES:
                    raise ServiceError(
                        f"the artifact store {self.where} is unreachable after {attempt} tries: {why}; check that "
                        "the server runs and accepts this host, the user and database in NEMOTRON_STORE_URL, and "
                        "the password ($PGPASSWORD or ~/.pgpass)"
                    ) from None
                log.warning("artifact store %s: %s; retrying in %.1fs", self.where, why, delay)
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _schema_version(self, conn: PgConnection) -> int:
        if conn.execute("SELECT to_regclass('schema_version')").fetchone()[0] is None:
            return 0
        row = conn.execute("SELECT version FROM schema_version WHERE component=?", (COMPONENT,)).fetchone()
        return int(row[0]) if row else 0

    def _ensure_schema(self, conn: PgConnection) -> None:
        """Create or upgrade the schema in one transaction under an advisory lock: simultaneous first opens wait
        for the first, then find its version and apply nothing."""
        conn.execute("BEGIN")
        with committed(conn):
            conn.execute("SELECT pg_advisory_xact_lock(?, ?)", SCHEMA_LOCK)
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version (component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
            )
            version = self._schema_version(conn)
            for statement in pg_schema_sql(version) if version < SCHEMA_VERSION else []:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_version VALUES (?, ?) ON CONFLICT (component) DO UPDATE SET version=?",
                (COMPONENT, SCHEMA_VERSION, SCHEMA_VERSION),
            )
        self._version = SCHEMA_VERSION

    def exists(self) -> bool:
        if not self._version:
            raw = self._connect_raw()
            try:
                self._version = self._schema_version(PgConnection(raw))
            finally:
                raw.close()
        return self._version > 0

    @contextmanager
    def connect(self, write: bool) -> Iterator[PgConnection]:
        psycopg = _psycopg()
        raw = self._take_idle() or self._connect_raw()
        reusable = False
        try:
            conn = PgConnection(raw)
            if self._version is None or self._version < SCHEMA_VERSION:
                self._version = self._schema_version(conn)
            if self._version < SCHEMA_VERSION and (write or self._version > 0):
                self._ensure_schema(conn)
            elif self._version == 0:
                # Reads of a store nothing was written to write nothing: empty tables of this session's own
                # (TEMP, gone when it closes) answer the queries.
                for statement in pg_schema_sql(0):
                    conn.execute(statement.replace("CREATE TABLE", "CREATE TEMP TABLE"))
            yield conn
            reusable = True
        except psycopg.OperationalError as err:  # the server went away mid-command
            why = (str(err).strip().splitlines() or ["connection lost"])[-1]
            raise ServiceError(f"the artifact store {self.where} failed: {why}") from None
        finally:
            self._put_idle(raw, reusable)

    def _take_idle(self) -> psycopg.Connection[Any] | None:
        idle, self._idle = self._idle, None
        if idle is None or idle[0] != os.getpid() or idle[1].closed:
            return (
                None  # a parent's connection is the parent's: never used, nor closed, from a child (psycopg
            )
            # itself does not end it when the child's copy is finalized)
        return idle[1]

    def _put_idle(self, raw: psycopg.Connection[Any], reusable: bool) -> None:
        """Keep `raw` for the next command when it ended cleanly (no transaction open); its temporary tables and
        session settings go first, so the next command starts as on a new connection."""
        from psycopg.pq import TransactionStatus

        if reusable and self._idle is None and raw.info.transaction_status == TransactionStatus.IDLE:
            try:
                raw.execute("DISCARD TEMP")  # not DISCARD ALL: psycopg's prepared statements stay valid
                raw.execute("RESET ALL")
                self._idle = (os.getpid(), raw)
                return
            except Exception:  # a connection that cannot even be reset is not kept
                pass
        raw.close()

    def begin_write(self, conn: Connection, names: Sequence[str] = (), exclusive: bool = False) -> None:
        conn.execute("BEGIN")
        conn.execute(f"SELECT pg_advisory_xact_lock{'' if exclusive else '_shared'}(?, ?)", STORE_LOCK)
        if names:
            keys = sorted({int(r[0]) for r in conn.execute(
                "SELECT hashtext(n) FROM unnest(?::text[]) n", (sorted(set(names)),))})  # fmt: skip
            for key in keys:  # in key order: two jobs that register the same names never wait on each other
                conn.execute("SELECT pg_advisory_xact_lock(?, ?)", (NAME_SPACE, key))

    def stream(self, conn: Connection, sql: str, args: Sequence[Any]) -> Iterator[Any]:
        """A server-side cursor (psycopg's named cursor, inside a read transaction): a client-side one would hold
        the whole result in memory before the first row is printed."""
        assert isinstance(conn, PgConnection)
        conn.execute("BEGIN")
        try:
            with conn.raw.cursor(name="nemotron_stream") as cur:
                cur.itersize = 500
                cur.execute(sql.replace("?", "%s"), list(args) or None)
                yield from cur
        finally:
            conn.execute("COMMIT")

    def begin_snapshot(self, conn: Connection) -> None:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
