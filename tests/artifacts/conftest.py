"""The store's tests run against both back ends: `store_backend` sets $NEMOTRON_STORE_URL to a fresh PostgreSQL
database for the "postgresql" run (tests/services/postgres.py), and clears it for the SQLite default. Every store
the test opens (open_store, the CLI, worker processes) then uses that back end."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["sqlite", "postgresql"])
def store_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "postgresql":
        monkeypatch.setenv("NEMOTRON_STORE_URL", request.getfixturevalue("postgres_url"))
    else:
        monkeypatch.delenv("NEMOTRON_STORE_URL", raising=False)
    return str(request.param)
