"""Where the team's indexes live: $NEMOTRON_STORE_URL names a PostgreSQL database for the artifact index, the
lineage edges, the aliases and the jobs index (docs/artifacts.md, "Which store"). Unset: SQLite files under
$NEMOTRON_HOME, the default. The artifacts' files stay on the filesystem under $NEMOTRON_HOME either way.

The password never belongs in the URL: libpq reads it from $PGPASSWORD or ~/.pgpass (mode 0600). A URL that
carries one anyway is accepted and redacted wherever it is shown."""

from __future__ import annotations

import os
from typing import NamedTuple
from urllib.parse import urlsplit

from nemotron.core.redact import redact_url_passwords
from nemotron.errors import UserError

ENV = "NEMOTRON_STORE_URL"
POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")


class StoreUrl(NamedTuple):
    """A parsed $NEMOTRON_STORE_URL: `url` is what psycopg connects with (scheme postgresql://)."""

    url: str

    @property
    def shown(self) -> str:
        """The URL with any password replaced by ***, for logs, errors and records."""
        return redact_url(self.url)


def redact_url(url: str) -> str:
    return redact_url_passwords(url)


def parse_store_url(raw: str, given_as: str = f"{ENV}=") -> StoreUrl:
    """`raw` as a store URL, or exit 2 naming what is wrong with it (where the user wrote it: `given_as`)."""
    parts = urlsplit(raw)
    if parts.scheme not in POSTGRES_SCHEMES:
        raise UserError(
            f"{given_as}{redact_url(raw)!r}: unsupported store; expected postgresql://[user@]host[:port]/database",
            hint=f"unset {ENV} for the default SQLite store under $NEMOTRON_HOME",
        )
    if not parts.hostname and "host=" not in parts.query:
        raise UserError(f"{given_as}{redact_url(raw)!r}: no host (postgresql://[user@]host[:port]/database)")
    if not parts.path.strip("/"):
        raise UserError(
            f"{given_as}{redact_url(raw)!r}: no database name (postgresql://[user@]host[:port]/database)"
        )
    return StoreUrl("postgresql://" + raw.split("://", 1)[1])


def store_url() -> StoreUrl | None:
    """The team store this process uses, or None for the SQLite default."""
    raw = os.environ.get(ENV, "").strip()
    return parse_store_url(raw) if raw else None
