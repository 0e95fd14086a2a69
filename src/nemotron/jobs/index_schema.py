"""What both jobs-index back ends share (index.py on SQLite, index_pg.py on the team's PostgreSQL): the
version, the columns a row holds, and the error a store that failed leaves as."""

from __future__ import annotations

INDEX_VERSION = 2  # PRAGMA user_version; the index is derived, so another version is rebuilt, not migrated
COLS = ("id", "seen", "stamp", "listed", "step", "preset", "profile", "executor", "state", "created", "ended",
         "exit_code", "outputs", "remote_id", "error")  # fmt: skip


class IndexUnavailable(Exception):
    """The team store failed (unreachable, refused, dropped the connection): one line, no driver traceback."""
