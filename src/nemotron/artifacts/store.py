"""The artifact store: an index of typed, versioned, content-hashed artifacts and their lineage edges, on SQLite
(the default, sqlite_index.py) or PostgreSQL ($NEMOTRON_STORE_URL, pg_index.py); the artifacts' files stay on the
filesystem under the store's root either way."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from nemotron.artifacts.index import Connection, Index, committed
from nemotron.artifacts.schema import MIGRATIONS, SCHEMA, SCHEMA_VERSION, schema_sql
from nemotron.artifacts.sqlite_index import SqliteIndex
from nemotron.errors import NotFound, UserError, did_you_mean

__all__ = ["MIGRATIONS", "SCHEMA", "SCHEMA_VERSION", "Artifact", "ArtifactStore", "content_hash", "open_store",
           "schema_sql"]  # fmt: skip


class Artifact(NamedTuple):
    """One registered version of an artifact, as the store's row holds it."""

    id: int
    name: str
    version: int
    type: str
    path: str
    sha256: str
    files: list[dict[str, Any]]
    metadata: dict[str, Any]
    job_id: str | None
    created_at: str

    @property
    def ref(self) -> str:
        return f"{self.name}:v{self.version}"


def content_hash(path: Path) -> tuple[str, list[dict[str, Any]]]:
    """sha256 over (relative path, size, file sha256) of every file, sorted; plus that file manifest."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    manifest = []
    outer = hashlib.sha256()
    for f in files:
        h = hashlib.sha256()
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        rel = f.name if path.is_file() else f.relative_to(path).as_posix()
        entry = {"path": rel, "size": f.stat().st_size, "sha256": h.hexdigest()}
        manifest.append(entry)
        outer.update(json.dumps(entry, sort_keys=True).encode())
    return outer.hexdigest(), manifest


class ArtifactStore:
    """The store's queries, the same on either database (`index`): SQLite under `root` unless one is given. Every
    caller gets its store from `open_store`, which picks the database $NEMOTRON_STORE_URL names."""

    def __init__(self, root: Path, index: Index | None = None) -> None:
        self.root = root
        self.db_path = root / "index.sqlite"  # the SQLite default's file, whichever database is in use
        self.index: Index = index or SqliteIndex(root)

    def exists(self) -> bool:
        return self.index.exists()

    def _connect(self, write: bool = False) -> AbstractContextManager[Connection]:
        return self.index.connect(write)

    @staticmethod
    def _row(row: Sequence[Any]) -> Artifact:
        return Artifact(
            row[0],
            row[1],
            row[2],
            row[3],
            row[4],
            row[5],
            json.loads(row[6]),
            json.loads(row[7]),
            row[8],
            row[9],
        )

    _COLS = "id, name, version, type, path, sha256, files, metadata, job_id, created_at"

    def register(
        self,
        outputs: Sequence[tuple[str, str, Path, dict[str, Any]]],
        job_id: str | None,
        parents: Sequence[tuple[str, int]] = (),
        *,
        reuse_same_content: bool = False,
    ) -> list[Artifact]:
        """Register (name, type, path, metadata) outputs in ONE transaction, each with edges to `parents`
        ((input name, artifact id)). Versions are allocated inside the transaction, so concurrent writers never
        collide or skip. `reuse_same_content`: an output whose path and content hash are registered already is
        that artifact, looked up inside the same transaction (two jobs binding one plain file at once get one)."""
        hashed = [
            (name, type_, path.resolve(), meta, *content_hash(path)) for name, type_, path, meta in outputs
        ]
        now = datetime.now(UTC).isoformat(timespec="seconds")
        with self._connect(write=True) as conn:
            self.index.begin_write(conn, [h[0] for h in hashed])
            with committed(conn):
                ids = []
                for name, type_, path, meta, sha, files in hashed:
                    same = (
                        reuse_same_content
                        and conn.execute(
                            "SELECT id FROM artifacts WHERE sha256=? AND path=? ORDER BY id DESC LIMIT 1",
                            (sha, str(path)),
                        ).fetchone()
                    )
                    if same:
                        ids.append(same[0])
                        continue
                    (ver,) = conn.execute(
                        "SELECT COALESCE(MAX(version), 0) + 1 FROM artifacts WHERE name=?", (name,)
                    ).fetchone()
                    (new_id,) = conn.execute(
                        "INSERT INTO artifacts (name, version, type, path, sha256, files, metadata, job_id, created_at)"
                        " VALUES (?,?,?,?,?,?,?,?,?) RETURNING id",
                        (
                            name,
                            ver,
                            type_,
                            str(path),
                            sha,
                            json.dumps(files),
                            json.dumps(meta, sort_keys=True),
                            job_id,
                            now,
                        ),
                    ).fetchone()
                    ids.append(new_id)
                    for input_name, parent in parents:
                        conn.execute(
                            "INSERT INTO edges VALUES (?,?,?) ON CONFLICT DO NOTHING",
                            (new_id, parent, input_name),
                        )
                if job_id is not None:  # the job's inputs are held by its edges from now on
                    conn.execute("DELETE FROM pins WHERE job_id=?", (job_id,))
            rows = conn.execute(
                f"SELECT {self._COLS} FROM artifacts WHERE id IN ({','.join('?' * len(ids))}) ORDER BY id",
                ids,
            )
            return [self._row(r) for r in rows]

    def pin(self, job_id: str, artifact_ids: Sequence[int]) -> list[int]:
        """Hold `artifact_ids` (a submitted job's resolved inputs) for `job_id` until the job registers its outputs
        or gc finds it ended: gc removes neither a pinned artifact nor its ancestors. Returns the ids removed since
        they were resolved (none is pinned then); in one transaction, so a gc deletes them first or keeps them."""
        ids = sorted(set(artifact_ids))
        if not ids:
            return []
        now = datetime.now(UTC).isoformat(timespec="seconds")
        with self._connect(write=True) as conn:
            self.index.begin_write(conn)
            with committed(conn):
                present = {r[0] for r in conn.execute(
                    f"SELECT id FROM artifacts WHERE id IN ({','.join('?' * len(ids))})", ids)}  # fmt: skip
                gone = [i for i in ids if i not in present]
                for i in [] if gone else ids:
                    conn.execute("INSERT INTO pins VALUES (?,?,?) ON CONFLICT DO NOTHING", (i, job_id, now))
        return gone

    @contextmanager
    def pinned(self, job_id: str, artifact_ids: Sequence[int]) -> Iterator[list[int]]:
        """`pin`, let go again if the body raises (no job record came to let go of them later). Yields the ids
        removed since they were resolved (none is pinned then)."""
        gone = self.pin(job_id, artifact_ids)
        try:
            yield gone
        except BaseException:
            if not gone:
                self.unpin([job_id])
            raise

    def unpin(self, job_ids: Sequence[str]) -> None:
        """Let go of what the ended jobs `job_ids` held."""
        if job_ids:
            with self._connect(write=True) as conn:
                self.index.begin_write(conn)
                with committed(conn):
                    conn.execute(
                        f"DELETE FROM pins WHERE job_id IN ({','.join('?' * len(job_ids))})", list(job_ids)
                    )

    def register_external(self, type_: str, path: Path) -> Artifact:
        """A plain path used as an input: registered once per content hash, named after the file (when the job that
        read it registers its outputs)."""
        sha, _ = content_hash(path)
        with self._connect() as conn:
            row = conn.execute(
                f"SELECT {self._COLS} FROM artifacts WHERE sha256=? AND path=? ORDER BY id DESC LIMIT 1",
                (sha, str(path.resolve())),
            ).fetchone()
        if row:  # the common case, without taking the write lock
            return self._row(row)
        name = "external." + path.name.replace(":", "_")
        return self.register([(name, type_, path, {"external": True})], job_id=None, reuse_same_content=True)[
            0
        ]

    def resolve(self, name: str, version: str = "latest") -> Artifact:
        """The one lookup of a store reference (binding a step's input, every `artifacts` command): `version` is
        "latest", "vN" or "@ALIAS" (ArtifactRef.version)."""
        aliases: list[str] = []  # the name's aliases, for the error when the one asked for is not among them
        with self._connect() as conn:
            if version == "latest":
                row = conn.execute(
                    f"SELECT {self._COLS} FROM artifacts WHERE name=? ORDER BY version DESC LIMIT 1", (name,)
                ).fetchone()
            elif version.startswith("@"):
                cols = ", ".join("a." + c.strip() for c in self._COLS.split(","))
                row = conn.execute(
                    f"SELECT {cols} FROM aliases al JOIN artifacts a ON a.id = al.artifact_id"
                    " WHERE al.name=? AND al.alias=?",
                    (name, version[1:]),
                ).fetchone()
                aliases = [r[0] for r in conn.execute("SELECT alias FROM aliases WHERE name=?", (name,))]
            else:
                row = conn.execute(
                    f"SELECT {self._COLS} FROM artifacts WHERE name=? AND version=?",
                    (name, int(version.lstrip("v"))),
                ).fetchone()
            if row:
                return self._row(row)
            names = [r[0] for r in conn.execute("SELECT DISTINCT name FROM artifacts")]
        if name in names and version.startswith("@"):
            alias = version[1:]
            near = did_you_mean(alias, aliases) or (f" (its aliases: {', '.join(sorted(aliases))})" if aliases else
                                                    f" (it has none; set one with: nemotron artifacts alias {name}:vN {alias})")  # fmt: skip
            raise NotFound(f"artifact '{name}' has no alias '{alias}'{near}")
        if name in names:
            raise NotFound(
                f"artifact '{name}' has no version {version}",
                hint=f"See its versions with: nemotron artifacts ls {name}",
            )
        raise NotFound(f"no artifact named '{name}' in {self.index.where}{did_you_mean(name, names)}")

    def get(self, artifact_id: int) -> Artifact:
        with self._connect() as conn:
            row = conn.execute(f"SELECT {self._COLS} FROM artifacts WHERE id=?", (artifact_id,)).fetchone()
        if not row:
            raise NotFound(f"no artifact with id {artifact_id}")
        return self._row(row)

    def list_artifacts(self, type_: str | None = None, name: str | None = None) -> list[Artifact]:
        sql, args = f"SELECT {self._COLS} FROM artifacts WHERE 1=1", list[str]()
        if type_:
            sql, args = sql + " AND type=?", [*args, type_]
        if name:
            sql, args = sql + " AND name=?", [*args, name]
        with self._connect() as conn:
            return [self._row(r) for r in conn.execute(sql + " ORDER BY name, version", args)]

    def _filters(
        self,
        name: str | None,
        type_: str | None,
        step: str | None,
        since: str | None,
        alias: str | None = None,
    ) -> tuple[str, list[str]]:
        where, args = ["1=1"], list[str]()
        for sql, value in (("name=?", name), ("type=?", type_), (f"{self.index.step_sql}=?", step),
                           ("created_at>=?", since),
                           ("id IN (SELECT artifact_id FROM aliases WHERE alias=?)", alias)):  # fmt: skip
            if value:
                where, args = [*where, sql], [*args, value]
        return " AND ".join(where), args

    def newest(self, limit: int | None, name: str | None = None, type_: str | None = None, step: str | None = None,
               since: str | None = None, alias: str | None = None) -> Iterator[Artifact]:  # fmt: skip
        """Artifacts newest first (by id: registration order), filtered in SQL on indexed columns, at most `limit`
        (None: all), streamed row by row: a page costs a page, not the history."""
        cond, args = self._filters(name, type_, step, since, alias)
        sql = f"SELECT {self._COLS} FROM artifacts WHERE {cond} ORDER BY id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self._connect() as conn:
            for row in self.index.stream(conn, sql, args):
                yield self._row(row)

    def count(self, name: str | None = None, type_: str | None = None, step: str | None = None,
              since: str | None = None, alias: str | None = None) -> int:  # fmt: skip
        cond, args = self._filters(name, type_, step, since, alias)
        with self._connect() as conn:
            return int(conn.execute(f"SELECT COUNT(*) FROM artifacts WHERE {cond}", args).fetchone()[0])

    def lineage_graph(self, artifact_id: int, depth: int | None = None) -> tuple[dict[int, Artifact], list[tuple[int, int, str]], dict[int, int]]:  # fmt: skip
        """The ancestry of one artifact in one recursive query: (artifacts by id, edges (child, parent, input
        name), each ancestor's shortest distance from it), at most `depth` edges away (None: all). Each artifact
        appears once however many paths lead to it."""
        # Bounded even without --depth: a cycle cannot be registered, but a corrupt index must not hang the CLI.
        bound = f" WHERE a.d < {int(depth if depth is not None else 100_000)}"
        cols = ", ".join("x." + c.strip() for c in self._COLS.split(","))
        with self._connect() as conn:
            rows = conn.execute(
                f"""WITH RECURSIVE a(id, d) AS (SELECT CAST(? AS BIGINT), 0 UNION SELECT e.parent, a.d + 1 FROM edges e
                    JOIN a ON e.child = a.id{bound}),
                  near(id, d) AS (SELECT id, MIN(d) FROM a GROUP BY id)
                SELECT near.d, {cols} FROM near JOIN artifacts x ON x.id = near.id""",
                (artifact_id,),
            ).fetchall()
            nodes = {r[1]: self._row(r[1:]) for r in rows}
            dist = {r[1]: int(r[0]) for r in rows}
            inner = [i for i, d in dist.items() if depth is None or d < depth]
            edges: list[tuple[int, int, str]] = []
            for i in range(0, len(inner), 500):
                batch = inner[i : i + 500]
                edges += conn.execute(
                    f"SELECT child, parent, input_name FROM edges WHERE child IN ({','.join('?' * len(batch))})"
                    " ORDER BY child, input_name, parent",
                    batch,
                ).fetchall()
        return nodes, edges, dist

    def parents(self, artifact_id: int) -> list[tuple[str, Artifact]]:
        """The artifacts `artifact_id` was made from, each with the input name it was consumed as."""
        rows = self._linked("parent", "child", artifact_id, "e.input_name")
        return [(r[0], self._row(r[1:])) for r in rows]

    def children(self, artifact_id: int) -> list[Artifact]:
        """The artifacts made from `artifact_id`, oldest first."""
        return [self._row(r[1:]) for r in self._linked("child", "parent", artifact_id, "a.id")]

    def _linked(self, found: str, given: str, artifact_id: int, order: str) -> list[tuple[Any, ...]]:
        """(input name, *artifact columns) of the edges whose `given` end is `artifact_id`, for the artifact at
        their `found` end."""
        cols = ", ".join("a." + c.strip() for c in self._COLS.split(","))
        with self._connect() as conn:
            return conn.execute(
                f"SELECT e.input_name, {cols} FROM edges e JOIN artifacts a ON a.id = e.{found}"
                f" WHERE e.{given}=? ORDER BY {order}",
                (artifact_id,),
            ).fetchall()

    def by_job(self, job_id: str) -> list[Artifact]:
        with self._connect() as conn:
            return [
                self._row(r)
                for r in conn.execute(
                    f"SELECT {self._COLS} FROM artifacts WHERE job_id=? ORDER BY id", (job_id,)
                )
            ]

    def ancestors(self, artifact_ids: Sequence[int]) -> set[int]:
        """Every artifact the given ones were made from, transitively (the given ones included)."""
        seen: set[int] = set()
        frontier = list(artifact_ids)
        with self._connect() as conn:
            while frontier:
                a = frontier.pop()
                if a in seen:
                    continue
                seen.add(a)
                frontier += [r[0] for r in conn.execute("SELECT parent FROM edges WHERE child=?", (a,))]
        return seen

    def delete(self, artifact_ids: Sequence[int]) -> None:
        """Drop index rows (and their edges) in one transaction. Files are the caller's business. An artifact an
        alias points at, or a job that has not ended uses, is refused (exit 2, naming the alias or the job): an
        alias never points at a deleted artifact, nor a job's input at a missing one."""
        if not artifact_ids:
            return
        marks = ",".join("?" * len(artifact_ids))
        with self._connect(write=True) as conn:
            self.index.begin_write(conn, exclusive=True)
            with committed(conn):
                for sql, why in _HELD:  # an alias or a job that has not ended holds it
                    held = conn.execute(sql.format(marks=marks), list(artifact_ids)).fetchone()
                    if held:
                        raise UserError(f"cannot delete {held[0]}:v{held[1]}: " + why.format(*held))
                conn.execute(
                    f"DELETE FROM edges WHERE child IN ({marks}) OR parent IN ({marks})",
                    [*artifact_ids, *artifact_ids],
                )
                conn.execute(f"DELETE FROM artifacts WHERE id IN ({marks})", list(artifact_ids))


# What refuses ArtifactStore.delete: (name, version, holder) of a held artifact among {marks}, and the reason
_HELD = (
    ("SELECT al.name, a.version, al.alias FROM aliases al JOIN artifacts a ON a.id = al.artifact_id"
     " WHERE al.artifact_id IN ({marks}) ORDER BY al.name, al.alias",
     "alias {0}@{2} points at it (move it or remove it first: nemotron artifacts unalias {0}@{2})"),
    ("SELECT a.name, a.version, p.job_id FROM pins p JOIN artifacts a ON a.id = p.artifact_id"
     " WHERE p.artifact_id IN ({marks}) ORDER BY a.name, a.version, p.job_id",
     "job {2} uses it as an input"),
)  # fmt: skip


def open_store(root: Path | None = None) -> ArtifactStore:
    """The store every command and step uses: its files under `root` (default: this home's artifacts directory),
    its index on PostgreSQL when $NEMOTRON_STORE_URL names one, else SQLite under `root`. psycopg is imported only
    in the first case."""
    from nemotron.core.paths import artifacts_dir
    from nemotron.core.storeurl import store_url

    root = root or artifacts_dir()
    url = store_url()
    if url is None:
        return ArtifactStore(root)
    from nemotron.artifacts.pg_index import PostgresIndex

    return ArtifactStore(root, PostgresIndex(url))
