"""`nemotron artifacts migrate --to postgresql://...`: copy a SQLite store into an empty PostgreSQL one (every
artifact with its version, hash, files, metadata, job and creation time; every lineage edge, its ids remapped;
every alias and the whole alias history), in one transaction, then read both back and compare them by reference.
A target that holds exactly the same store is a verified no-op; one that holds anything else is refused."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nemotron.artifacts.index import Connection
from nemotron.artifacts.store import ArtifactStore
from nemotron.errors import UserError

_ART_COLS = "name, version, type, path, sha256, files, metadata, job_id, created_at"
_MOVE_COLS = "name, alias, from_version, to_version, at, by_user, host"


@dataclass
class StoreContents:
    """A store as references see it, independent of its row ids: what must be equal after a migration."""

    artifacts: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # NAME:vN -> (columns, as stored)
    edges: set[tuple[str, str, str]] = field(default_factory=set)  # (child ref, parent ref, input name)
    aliases: dict[str, str] = field(default_factory=dict)  # NAME@ALIAS -> NAME:vN
    history: list[tuple[Any, ...]] = field(default_factory=list)  # every alias move, oldest first

    def empty(self) -> bool:
        return not (self.artifacts or self.edges or self.aliases or self.history)

    def counts(self) -> str:
        def n(count: int, one: str, many: str) -> str:
            return f"{count} {one if count == 1 else many}"

        return ", ".join([n(len(self.artifacts), "artifact", "artifacts"),
                          n(len(self.edges), "lineage edge", "lineage edges"),
                          n(len(self.aliases), "alias", "aliases"),
                          n(len(self.history), "alias move", "alias moves")])  # fmt: skip

    def differences(self, other: StoreContents) -> list[str]:
        """What differs from `other`, a line per kind, for the verification's error."""
        found = []
        for what, mine, theirs in (("artifacts", self.artifacts, other.artifacts), ("aliases", self.aliases,
                                   other.aliases)):  # fmt: skip
            differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
            if differ:
                found.append(f"{what} differ: {', '.join(differ[:10])}{' ...' if len(differ) > 10 else ''}")
        if self.edges != other.edges:
            found.append(f"lineage edges differ: {sorted(self.edges ^ other.edges)[:5]}")
        if self.history != other.history:
            found.append("the alias history differs")
        return found


def read_contents(conn: Connection) -> StoreContents:
    out = StoreContents()
    refs: dict[int, str] = {}
    for row in conn.execute(f"SELECT id, {_ART_COLS} FROM artifacts ORDER BY id"):
        refs[row[0]] = f"{row[1]}:v{row[2]}"
        out.artifacts[refs[row[0]]] = tuple(row[1:])
    out.edges = {
        (refs[c], refs[p], n) for c, p, n in conn.execute("SELECT child, parent, input_name FROM edges")
    }
    out.aliases = {
        f"{n}@{a}": refs[i] for n, a, i in conn.execute("SELECT name, alias, artifact_id FROM aliases")
    }
    out.history = [tuple(r) for r in conn.execute(f"SELECT {_MOVE_COLS} FROM alias_history ORDER BY id")]
    return out


@dataclass(frozen=True)
class Migration:
    contents: StoreContents
    copied: bool  # False: the target held this store already


def migrate(source: ArtifactStore, target: ArtifactStore) -> Migration:
    """Copy `source` into `target` (empty, or holding exactly the same store), then verify. Exit 2 when the target
    holds anything else; RuntimeError when what was written does not read back equal (the transaction committed:
    the message says so)."""
    with source._connect() as conn:
        source.index.begin_snapshot(conn)  # one state of a store that may be written meanwhile
        src = read_contents(conn)
        conn.execute("COMMIT")
    with target._connect(write=True) as conn:
        # Exclusive: no one registers into the target between the check that it is empty and the copy.
        target.index.begin_write(conn, exclusive=True)
        try:
            held = read_contents(conn)
            if not held.empty():
                if held.differences(src):
                    raise UserError(
                        f"{target.index.where} already holds {held.counts()}, not the same as {source.index.where}"
                        f" ({src.counts()}); migrate copies into an empty store only",
                        hint="create an empty database for it (createdb), or drop the one there",
                    )
                conn.execute("ROLLBACK")
                return Migration(held, copied=False)
            _copy(conn, source, src)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    with target._connect() as conn:
        after = read_contents(conn)
    wrong = after.differences(src)
    if wrong:
        raise RuntimeError(
            f"the copy in {target.index.where} does not match {source.index.where}: {'; '.join(wrong)}"
        )
    return Migration(after, copied=True)


def _copy(conn: Connection, source: ArtifactStore, src: StoreContents) -> None:
    """Insert `src` in registration order (new ids keep the old order, so `ls` lists newest first alike)."""
    ids: dict[str, int] = {}
    for ref, row in src.artifacts.items():
        ids[ref] = conn.execute(f"INSERT INTO artifacts ({_ART_COLS}) VALUES (?,?,?,?,?,?,?,?,?) RETURNING id",
                                row).fetchone()[0]  # fmt: skip
    for child, parent, input_name in sorted(src.edges):
        conn.execute("INSERT INTO edges VALUES (?,?,?)", (ids[child], ids[parent], input_name))
    for ref, target in sorted(src.aliases.items()):
        name, _, alias = ref.partition("@")
        conn.execute(
            "INSERT INTO aliases (name, alias, artifact_id) VALUES (?,?,?)", (name, alias, ids[target])
        )
    for move in src.history:
        conn.execute(f"INSERT INTO alias_history ({_MOVE_COLS}) VALUES (?,?,?,?,?,?,?)", move)
