"""Aliases: NAME@ALIAS (`best`, `prod`) names one version of NAME until it is moved. Every move is a row of the
alias history (from which version, to which, when, by which OS user on which host); `latest` is every name's
implicit alias and is never stored."""

from __future__ import annotations

import getpass
import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime

from nemotron.artifacts.index import Connection, committed
from nemotron.artifacts.refs import check_alias_name
from nemotron.artifacts.store import Artifact, ArtifactStore
from nemotron.errors import NotFound, UserError


@dataclass(frozen=True)
class AliasMove:
    """One move of an alias: set (from_version None), moved, or removed (to_version None)."""

    name: str
    alias: str
    from_version: int | None
    to_version: int | None
    at: str  # UTC, ISO 8601 to the second
    by_user: str
    host: str

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.alias}"

    def describe(self) -> str:
        """`best: v1 -> v3` as the history prints it; `(none)` where the alias did not exist before or after."""
        was = "(none)" if self.from_version is None else f"v{self.from_version}"
        now = "(none)" if self.to_version is None else f"v{self.to_version}"
        return f"{self.alias}: {was} -> {now}"


def os_user() -> str:
    """Who moves an alias: the OS user (a container without a passwd entry for its uid gets `uid N`)."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return f"uid {os.getuid()}"


_MOVE_COLS = "name, alias, from_version, to_version, at, by_user, host"


def move_alias(store: ArtifactStore, target: Artifact, alias: str) -> AliasMove | None:
    """Point `target.name`@`alias` at `target`, set or moved, and record the move; None when it points there
    already (nothing moved, nothing recorded). The read of where the alias pointed, the move and its history row
    are one write transaction, so movers in several processes leave a history in which each move starts where the
    one before it ended."""
    why = check_alias_name(alias)
    if why is not None:
        raise UserError(f"cannot set alias: {why}")
    with store._connect(write=True) as conn:
        store.index.begin_write(conn, [target.name])  # one mover of the name's aliases at a time
        with committed(conn):
            if conn.execute("SELECT 1 FROM artifacts WHERE id=?", (target.id,)).fetchone() is None:
                raise NotFound(f"{target.ref} is no longer in the store (gc removed it)")
            was = conn.execute(
                "SELECT a.version FROM aliases al JOIN artifacts a ON a.id = al.artifact_id"
                " WHERE al.name=? AND al.alias=?",
                (target.name, alias),
            ).fetchone()
            if was is not None and was[0] == target.version:
                return None  # committed: nothing to move
            conn.execute(
                "INSERT INTO aliases (name, alias, artifact_id) VALUES (?,?,?)"
                " ON CONFLICT (name, alias) DO UPDATE SET artifact_id=excluded.artifact_id",
                (target.name, alias, target.id),
            )
            move = _record(conn, target.name, alias, None if was is None else was[0], target.version)
    return move


def remove_alias(store: ArtifactStore, name: str, alias: str) -> AliasMove:
    """Remove NAME@ALIAS and record it; NotFound (exit 2) when there is no such alias."""
    if alias == "latest":
        raise UserError(f"cannot remove {name}@latest: `latest` is every name's implicit alias")
    with store._connect(write=True) as conn:
        store.index.begin_write(conn, [name])
        with committed(conn):
            was = conn.execute(
                "SELECT a.version FROM aliases al JOIN artifacts a ON a.id = al.artifact_id"
                " WHERE al.name=? AND al.alias=?",
                (name, alias),
            ).fetchone()
            if was is None:
                raise NotFound(f"there is no alias {name}@{alias}")
            conn.execute("DELETE FROM aliases WHERE name=? AND alias=?", (name, alias))
            move = _record(conn, name, alias, was[0], None)
    return move


def _record(conn: Connection, name: str, alias: str, was: int | None, now: int | None) -> AliasMove:
    move = AliasMove(name, alias, was, now, datetime.now(UTC).isoformat(timespec="seconds"), os_user(),
                     socket.gethostname())  # fmt: skip
    conn.execute(
        f"INSERT INTO alias_history ({_MOVE_COLS}) VALUES (?,?,?,?,?,?,?)",
        (move.name, move.alias, move.from_version, move.to_version, move.at, move.by_user, move.host),
    )
    return move


def aliases_of(store: ArtifactStore, artifact_ids: list[int]) -> dict[int, list[str]]:
    """The aliases pointing at each of `artifact_ids` (a page of a listing), sorted; ids without one are left out."""
    found: dict[int, list[str]] = {}
    with store._connect() as conn:
        for i in range(0, len(artifact_ids), 500):
            batch = artifact_ids[i : i + 500]
            rows = conn.execute(
                f"SELECT artifact_id, alias FROM aliases WHERE artifact_id IN ({','.join('?' * len(batch))})"
                " ORDER BY alias",
                batch,
            )
            for artifact_id, alias in rows:
                found.setdefault(artifact_id, []).append(alias)
    return found


def history_of(store: ArtifactStore, art: Artifact, limit: int = 20) -> tuple[list[AliasMove], int]:
    """What `artifacts show` prints: every move of the aliases now pointing at `art`, and every other move to or
    away from it; newest first, at most `limit`, with how many more there are."""
    cond = ("name=? AND (alias IN (SELECT alias FROM aliases WHERE artifact_id=?) OR from_version=? OR"
            " to_version=?)")  # fmt: skip
    args = (art.name, art.id, art.version, art.version)
    with store._connect() as conn:
        rows = conn.execute(
            f"SELECT {_MOVE_COLS} FROM alias_history WHERE {cond} ORDER BY id DESC LIMIT ?", (*args, limit)
        ).fetchall()
        total = int(conn.execute(f"SELECT COUNT(*) FROM alias_history WHERE {cond}", args).fetchone()[0])
    return [AliasMove(*r) for r in rows], max(0, total - len(rows))


def alias_history(store: ArtifactStore, name: str, alias: str) -> list[AliasMove]:
    """Every move of NAME@ALIAS, oldest first."""
    with store._connect() as conn:
        rows = conn.execute(
            f"SELECT {_MOVE_COLS} FROM alias_history WHERE name=? AND alias=? ORDER BY id", (name, alias)
        ).fetchall()
    return [AliasMove(*r) for r in rows]
