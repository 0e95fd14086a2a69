"""What the artifact store asks of its database, whichever it is (SQLite: sqlite_index.py; PostgreSQL:
pg_index.py): connections that run the store's SQL with `?` parameters, write transactions that serialize what
must not interleave, and the few expressions the two dialects spell differently."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol


class Cursor(Protocol):
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    def execute(self, sql: str, parameters: Any = ..., /) -> Cursor: ...


class Index(Protocol):
    """One store's database. `where` names it in messages (a directory, or a URL without its password)."""

    where: str
    # The SQL of an artifact's step (from its metadata JSON), spelled as the step index is, so filters use it.
    step_sql: str
    # The SQL of the total size of artifact `a`'s files (from its file manifest JSON).
    files_bytes_sql: str

    def exists(self) -> bool:
        """Whether anything was ever written (a read of an empty store writes nothing)."""
        ...

    def connect(self, write: bool) -> AbstractContextManager[Connection]:
        """A connection in autocommit mode; transactions are begun explicitly and ended with COMMIT/ROLLBACK."""
        ...

    def begin_write(self, conn: Connection, names: Sequence[str] = (), exclusive: bool = False) -> None:
        """Begin a write transaction that allocates versions of `names` (none: it allocates none). Registrations
        of different names may run at once; `exclusive` (deletions) waits for every other writer and excludes
        them."""
        ...

    def stream(self, conn: Connection, sql: str, args: Sequence[Any]) -> Iterator[Any]:
        """The rows of a query that may be long (`ls --all`), fetched a batch at a time, not all at once."""
        ...

    def begin_snapshot(self, conn: Connection) -> None:
        """Begin a read transaction in which every statement sees the same state of the store."""
        ...


@contextmanager
def committed(conn: Connection) -> Iterator[None]:
    """The transaction begun on `conn` (begin_write, BEGIN) committed when the block ends, return included, and
    rolled back when it raises, whatever it raises (an interrupt too)."""
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
