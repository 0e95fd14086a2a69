"""The artifact store's one schema in its two dialects: SQLite (the embedded default) and PostgreSQL (a team's
store). Version N of the schema is the same tables, columns and indexes on both; each version's DDL brings a store
at N-1 up to N in place, inside one transaction."""

from __future__ import annotations

# PRAGMA user_version of a SQLite store with this schema; the `schema_version` row on PostgreSQL
SCHEMA_VERSION = 3
# Each version's DDL, applied in order to bring an older store up to date in place (one transaction).
MIGRATIONS: dict[int, str] = {}
SCHEMA = """
CREATE TABLE IF NOT EXISTS artifacts (
  id INTEGER PRIMARY KEY,
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
  child INTEGER NOT NULL REFERENCES artifacts(id),
  parent INTEGER NOT NULL REFERENCES artifacts(id),
  input_name TEXT NOT NULL,
  PRIMARY KEY (child, parent, input_name)
);
"""
# 2: the indexes listings, lineage and gc page on (newest first by id; filters by type, step, job, creation time).
MIGRATIONS[2] = """
CREATE INDEX IF NOT EXISTS artifacts_type ON artifacts(type, id);
CREATE INDEX IF NOT EXISTS artifacts_step ON artifacts(json_extract(metadata, '$.step'), id);
CREATE INDEX IF NOT EXISTS artifacts_job ON artifacts(job_id);
CREATE INDEX IF NOT EXISTS artifacts_created ON artifacts(created_at);
CREATE INDEX IF NOT EXISTS artifacts_sha ON artifacts(sha256);
CREATE INDEX IF NOT EXISTS edges_parent ON edges(parent);
"""
# 3: aliases (NAME@ALIAS -> one version of NAME) and every move of one, kept after its artifacts are gone (the
# history names versions, not row ids, so it reads the same once gc removed an old target).
MIGRATIONS[3] = """
CREATE TABLE IF NOT EXISTS aliases (
  name TEXT NOT NULL,
  alias TEXT NOT NULL,
  artifact_id INTEGER NOT NULL REFERENCES artifacts(id),
  PRIMARY KEY (name, alias)
);
CREATE INDEX IF NOT EXISTS aliases_artifact ON aliases(artifact_id);
CREATE INDEX IF NOT EXISTS aliases_alias ON aliases(alias);
CREATE TABLE IF NOT EXISTS alias_history (
  id INTEGER PRIMARY KEY,
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


def schema_sql(since: int = 0) -> str:
    """The SQLite DDL that brings a store at version `since` (0: none) to SCHEMA_VERSION."""
    parts = [SCHEMA] if since < 1 else []
    return "".join([*parts, *(MIGRATIONS[v] for v in sorted(MIGRATIONS) if v > since)])


# PostgreSQL: the same versions. IDs are identity columns (registration order, as SQLite's rowids); files and
# metadata stay JSON text, byte for byte what SQLite holds, with an expression index on the step as SQLite has.
PG_MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE IF NOT EXISTS artifacts (
  id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
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
  child BIGINT NOT NULL REFERENCES artifacts(id),
  parent BIGINT NOT NULL REFERENCES artifacts(id),
  input_name TEXT NOT NULL,
  PRIMARY KEY (child, parent, input_name)
);
""",
    2: """
CREATE INDEX IF NOT EXISTS artifacts_type ON artifacts(type, id);
CREATE INDEX IF NOT EXISTS artifacts_step ON artifacts(((metadata::jsonb) ->> 'step'), id);
CREATE INDEX IF NOT EXISTS artifacts_job ON artifacts(job_id);
CREATE INDEX IF NOT EXISTS artifacts_created ON artifacts(created_at);
CREATE INDEX IF NOT EXISTS artifacts_sha ON artifacts(sha256);
CREATE INDEX IF NOT EXISTS edges_parent ON edges(parent);
""",
    3: """
CREATE TABLE IF NOT EXISTS aliases (
  name TEXT NOT NULL,
  alias TEXT NOT NULL,
  artifact_id BIGINT NOT NULL REFERENCES artifacts(id),
  PRIMARY KEY (name, alias)
);
CREATE INDEX IF NOT EXISTS aliases_artifact ON aliases(artifact_id);
CREATE INDEX IF NOT EXISTS aliases_alias ON aliases(alias);
CREATE TABLE IF NOT EXISTS alias_history (
  id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  name TEXT NOT NULL,
  alias TEXT NOT NULL,
  from_version INTEGER,
  to_version INTEGER,
  at TEXT NOT NULL,
  by_user TEXT NOT NULL,
  host TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS alias_history_name ON alias_history(name, alias, id);
""",
}
assert max(PG_MIGRATIONS) == SCHEMA_VERSION, "each schema version has its PostgreSQL DDL"


def pg_schema_sql(since: int = 0) -> list[str]:
    """The PostgreSQL statements that bring a store at version `since` (0: none) to SCHEMA_VERSION."""
    return [
        s.strip()
        for v in sorted(PG_MIGRATIONS)
        if v > since
        for s in PG_MIGRATIONS[v].split(";")
        if s.strip()
    ]
