"""The artifact store's one schema in its two dialects: SQLite (the embedded default) and PostgreSQL (a team's
store). Version N of the schema is the same tables, columns and indexes on both; each version's DDL brings a store
at N-1 up to N in place, inside one transaction."""

from __future__ import annotations

# PRAGMA user_version of a SQLite store with this schema; the `schema_version` row on PostgreSQL
SCHEMA_VERSION = 4
# Each version's DDL, written once: {id} is a row id column, {ref} a column that refers to one, {step} the
# expression the step filter indexes (metadata stays JSON text on both, byte for byte the same).
_DDL: dict[int, str] = {}
_DDL[1] = """
CREATE TABLE IF NOT EXISTS artifacts (
  id {id},
  name TEXT NOT NULL,
  version INTEGER NOT NULL,
  type TEXT NOT NULL,
  path TEXT NOT NULL,
  sha256 TEXT NOT NULL,
  files TEXT NOT NULL,
  metadata TEXT NOT NULL,
  job_id TEXT,
  created_at TEXT NOT NULL,
  UNIQUE(name, version)
);
CREATE TABLE IF NOT EXISTS edges (
  child {ref} NOT NULL REFERENCES artifacts(id),
  parent {ref} NOT NULL REFERENCES artifacts(id),
  input_name TEXT NOT NULL,
  PRIMARY KEY (child, parent, input_name)
);
"""
# 2: the indexes listings, lineage and gc page on (newest first by id; filters by type, step, job, creation time).
_DDL[2] = """
CREATE INDEX IF NOT EXISTS artifacts_type ON artifacts(type, id);
CREATE INDEX IF NOT EXISTS artifacts_step ON artifacts({step}, id);
CREATE INDEX IF NOT EXISTS artifacts_job ON artifacts(job_id);
CREATE INDEX IF NOT EXISTS artifacts_created ON artifacts(created_at);
CREATE INDEX IF NOT EXISTS artifacts_sha ON artifacts(sha256);
CREATE INDEX IF NOT EXISTS edges_parent ON edges(parent);
"""
# 3: aliases (NAME@ALIAS -> one version of NAME) and every move of one, kept after its artifacts are gone (the
# history names versions, not row ids, so it reads the same once gc removed an old target).
_DDL[3] = """
CREATE TABLE IF NOT EXISTS aliases (
  name TEXT NOT NULL,
  alias TEXT NOT NULL,
  artifact_id {ref} NOT NULL REFERENCES artifacts(id),
  PRIMARY KEY (name, alias)
);
CREATE INDEX IF NOT EXISTS aliases_artifact ON aliases(artifact_id);
CREATE INDEX IF NOT EXISTS aliases_alias ON aliases(alias);
CREATE TABLE IF NOT EXISTS alias_history (
  id {id},
  name TEXT NOT NULL,
  alias TEXT NOT NULL,
  from_version INTEGER,
  to_version INTEGER,
  at TEXT NOT NULL,
  by_user TEXT NOT NULL,
  host TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS alias_history_name ON alias_history(name, alias, id);
"""
# 4: pins: the artifacts a submitted job resolved as its inputs, held from its submit until it registers its
# outputs (the same transaction drops them) or is found ended; gc keeps a pinned artifact and its ancestors.
_DDL[4] = """
CREATE TABLE IF NOT EXISTS pins (
  artifact_id {ref} NOT NULL REFERENCES artifacts(id),
  job_id TEXT NOT NULL,
  pinned_at TEXT NOT NULL,
  PRIMARY KEY (artifact_id, job_id)
);
CREATE INDEX IF NOT EXISTS pins_job ON pins(job_id);
"""
assert max(_DDL) == SCHEMA_VERSION, "each schema version has its DDL"
_SQLITE = {"id": "INTEGER PRIMARY KEY", "ref": "INTEGER", "step": "json_extract(metadata, '$.step')"}
# PostgreSQL: IDs are identity columns (registration order, as SQLite's rowids), with an expression index on the
# step as SQLite has.
_POSTGRES = {
    "id": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    "ref": "BIGINT",
    "step": "((metadata::jsonb) ->> 'step')",
}

# SQLite: the first version's tables, then each later version's DDL, applied in order to bring an older store up
# to date in place (one transaction).
SCHEMA = _DDL[1].format(**_SQLITE)
MIGRATIONS: dict[int, str] = {v: ddl.format(**_SQLITE) for v, ddl in _DDL.items() if v > 1}
PG_MIGRATIONS: dict[int, str] = {v: ddl.format(**_POSTGRES) for v, ddl in _DDL.items()}


def schema_sql(since: int = 0) -> str:
    """The SQLite DDL that brings a store at version `since` (0: none) to SCHEMA_VERSION."""
    parts = [SCHEMA] if since < 1 else []
    return "".join([*parts, *(MIGRATIONS[v] for v in sorted(MIGRATIONS) if v > since)])


def pg_schema_sql(since: int = 0) -> list[str]:
    """The PostgreSQL statements that bring a store at version `since` (0: none) to SCHEMA_VERSION."""
    return [
        s.strip()
        for v in sorted(PG_MIGRATIONS)
        if v > since
        for s in PG_MIGRATIONS[v].split(";")
        if s.strip()
    ]
