"""Garbage collection of the artifact store: the plan is computed in SQL (a window per name for the newest versions
and the aliased ones, a recursive query for their ancestors), summarised per name, and deleted in batches, each
batch its own transaction, so an interrupted gc leaves a consistent store (files are removed after their batch
commits: at worst an interruption leaves unreferenced files, never an index row without its files or an edge to a
deleted row)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from nemotron.artifacts.index import Connection, committed
from nemotron.artifacts.store import Artifact, ArtifactStore

# Artifacts per deleting transaction. Each statement binds at most BATCH variables: well within SQLite's limit
# (32,766 since 3.32, 999 before).
BATCH = 500

# Kept: the newest `keep` of each name, what an alias points at, what a running job holds (pins), and their
# ancestors; an edge to a row gone already (a store written before pins) keeps nothing.
_PLAN = """
INSERT INTO gc_keep (id)
WITH RECURSIVE
  newest(id) AS (SELECT id FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY name ORDER BY version DESC) AS rn
                                 FROM artifacts) AS ranked WHERE rn <= ? UNION SELECT artifact_id FROM aliases{pins}),
  kept(id) AS (SELECT id FROM newest UNION SELECT e.parent FROM edges e JOIN kept ON e.child = kept.id)
SELECT kept.id FROM kept JOIN artifacts a ON a.id = kept.id
"""
# The artifacts only an alias, or a running job, keeps (older than the newest `keep` of their name): what the plan
# says of them.
_OLDER = "(SELECT COUNT(*) FROM artifacts b WHERE b.name = a.name AND b.version > a.version) >= ?"
_BY_ALIAS = f"""
SELECT al.name, a.version, al.alias FROM aliases al JOIN artifacts a ON a.id = al.artifact_id
WHERE {_OLDER} ORDER BY al.name, a.version, al.alias
"""


@dataclass(frozen=True)
class NameSummary:
    """The removable versions of one artifact name."""

    name: str
    count: int
    bytes: int
    first: int  # lowest removable version
    last: int  # highest removable version


class GcRun(AbstractContextManager["GcRun"]):
    """One gc over one connection: `with GcRun(store, keep, write) as run:` computes the plan into temporary
    tables; `summary`, `removable` and `delete` read them. A dry run (write=False) writes nothing to the store."""

    def __init__(
        self, store: ArtifactStore, keep: int, write: bool = False, ended: Callable[[str], bool] | None = None
    ) -> None:
        """`ended(job_id)`: whether a job that pinned artifacts is known to have ended (its pins are dropped first,
        when writing); a job it does not know keeps what it pinned."""
        self.store, self.keep, self.write, self.ended = store, keep, write, ended
        self._cm = store._connect(write=write)
        self.conn: Connection
        self.by_job: list[tuple[str, int, str]] = []
        self.pins = True  # the store has pins (a store written before them, read as it is, has none)

    def _pinning_jobs(self) -> list[str] | None:
        """The jobs holding pins; None for a store written before pins that this user cannot bring up to date."""
        try:
            return [r[0] for r in self.conn.execute("SELECT DISTINCT job_id FROM pins ORDER BY job_id")]
        except sqlite3.OperationalError:
            return None

    def __enter__(self) -> GcRun:
        self.conn = self._cm.__enter__()
        c = self.conn
        jobs = self._pinning_jobs()
        self.pins = jobs is not None
        if jobs and self.write and self.ended is not None:
            # one statement, its own transaction: a job found ended holds nothing any more
            self.store.unpin([j for j in jobs if self.ended(j)])
        c.execute("CREATE TEMP TABLE gc_keep (id BIGINT PRIMARY KEY)")
        c.execute(
            "CREATE TEMP TABLE gc_gone (id BIGINT PRIMARY KEY, name TEXT, version INTEGER, bytes BIGINT)"
        )
        # One read transaction: the plan sees one state of the store, and artifacts registered later are newer.
        self.store.index.begin_snapshot(c)
        self.max_id = int(c.execute("SELECT COALESCE(MAX(id), 0) FROM artifacts").fetchone()[0])
        c.execute(
            _PLAN.format(pins="" if jobs is None else " UNION SELECT artifact_id FROM pins"), (self.keep,)
        )
        c.execute(f"INSERT INTO gc_gone SELECT a.id, a.name, a.version, {self.store.index.files_bytes_sql}"
                  " FROM artifacts a WHERE a.id NOT IN (SELECT id FROM gc_keep) AND a.id <= ?", (self.max_id,))  # fmt: skip
        c.execute("COMMIT")
        self.by_alias: list[tuple[str, int, str]] = c.execute(_BY_ALIAS, (self.keep,)).fetchall()
        if jobs:
            self.by_job = self._kept_by_jobs()
        self.kept = int(c.execute("SELECT COUNT(*) FROM gc_keep").fetchone()[0])
        self.gone, self.gone_bytes = (int(x) for x in c.execute(
            "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM gc_gone").fetchone())  # fmt: skip
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._cm.__exit__(et, e, tb)

    def _kept_by_jobs(self) -> list[tuple[str, int, str]]:
        """(name, version, job) of the pinned artifacts only a job keeps. Asked from the pins (a few rows) by id:
        a join SQLite would plan from the artifacts, with the age check on every one (10,000 artifacts: 16 M steps)."""
        pinned = self.conn.execute("SELECT DISTINCT artifact_id, job_id FROM pins").fetchall()
        ids = sorted({int(r[0]) for r in pinned})[:BATCH]
        older = {int(r[0]): (str(r[1]), int(r[2])) for r in self.conn.execute(
            f"SELECT a.id, a.name, a.version FROM artifacts a WHERE a.id IN ({','.join('?' * len(ids))}) AND {_OLDER}",
            [*ids, self.keep])} if ids else {}  # fmt: skip
        return sorted((*older[int(i)], str(j)) for i, j in pinned if int(i) in older)

    def summary(self, limit: int | None = 50) -> tuple[list[NameSummary], int]:
        """Removable versions per name, most first; and how many names more than `limit` there are."""
        sql = ("SELECT name, COUNT(*), COALESCE(SUM(bytes), 0), MIN(version), MAX(version) FROM gc_gone"
               " GROUP BY name ORDER BY COUNT(*) DESC, name")  # fmt: skip
        rows = [NameSummary(r[0], r[1], int(r[2]), r[3], r[4])
                for r in self.conn.execute(sql + ("" if limit is None else f" LIMIT {int(limit)}"))]  # fmt: skip
        names = int(self.conn.execute("SELECT COUNT(DISTINCT name) FROM gc_gone").fetchone()[0])
        return rows, max(0, names - len(rows))

    def removable(self) -> Iterator[Artifact]:
        """Every removable artifact, by name and version, streamed."""
        cols = ", ".join("a." + c.strip() for c in ArtifactStore._COLS.split(","))
        for row in self.conn.execute(f"SELECT {cols} FROM gc_gone g JOIN artifacts a ON a.id = g.id"
                                     " ORDER BY a.name, a.version"):  # fmt: skip
            yield ArtifactStore._row(row)

    def delete(self, remove_files: Callable[[list[str]], None]) -> int:
        """Delete the plan batch by batch, each batch one transaction, then its files (`remove_files(paths)`).
        An artifact registered since the plan keeps its ancestors, and so do one an alias was pointed at since and
        one a job pinned since: an alias never points at a deleted artifact, nor a job's input at a missing one.
        Returns how many artifacts this gc deleted (another gc at once deletes each artifact only once)."""
        c, last, done = self.conn, 0, 0
        while True:
            batch = c.execute("SELECT g.id, a.path FROM gc_gone g JOIN artifacts a ON a.id = g.id WHERE g.id > ?"
                              " ORDER BY g.id LIMIT ?", (last, BATCH)).fetchall()  # fmt: skip
            if not batch:
                return done
            last = batch[-1][0]
            self.store.index.begin_write(c, exclusive=True)
            with committed(c):
                ids = [r[0] for r in batch]
                marks = ",".join("?" * len(ids))
                pins = " UNION SELECT artifact_id FROM pins" if self.pins else ""
                protected = {r[0] for r in c.execute(
                    f"""WITH RECURSIVE p(id) AS (SELECT id FROM artifacts WHERE id > ? UNION SELECT artifact_id FROM aliases{pins}
                        UNION SELECT e.parent FROM edges e JOIN p ON e.child = p.id) SELECT id FROM p WHERE id IN ({marks})""",
                    [self.max_id, *ids])}  # fmt: skip
                present = {r[0] for r in c.execute(f"SELECT id FROM artifacts WHERE id IN ({marks})", ids)}
                if protected or len(present) < len(ids):  # kept since the plan, or deleted by another gc
                    batch = [r for r in batch if r[0] in present and r[0] not in protected]
                    ids = [r[0] for r in batch]
                    marks = ",".join("?" * len(ids))
                for table, column in (("edges", "child"), ("edges", "parent"), ("artifacts", "id")):
                    if ids:  # PostgreSQL refuses an empty IN ()
                        c.execute(f"DELETE FROM {table} WHERE {column} IN ({marks})", ids)
            done += len(batch)
            remove_files([r[1] for r in batch])


def gc_plan(store: ArtifactStore, keep: int) -> tuple[list[Artifact], list[Artifact]]:
    """(kept, removable) as lists: the newest `keep` versions of every name are kept, so is every artifact an alias
    points at, and so is every ancestor of a kept artifact, whatever its age; the rest can go. For tests and small
    stores; the CLI streams a GcRun."""
    with GcRun(store, keep) as run:
        gone = list(run.removable())
    gone_ids = {a.id for a in gone}
    return [a for a in store.list_artifacts() if a.id not in gone_ids], gone


def remove_owned(paths: list[str], home: Path) -> None:
    """Remove the files of deleted artifacts that live under $NEMOTRON_HOME; files elsewhere are the user's."""
    import shutil

    for text in paths:
        p = Path(text).resolve()
        if p.is_relative_to(home):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
