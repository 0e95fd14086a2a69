"""The store's tests run against both back ends: `store_backend` sets $NEMOTRON_STORE_URL to a fresh PostgreSQL
database for the "postgresql" run (tests/services/postgres.py), and clears it for the SQLite default. Every store
the test opens (open_store, the CLI, worker processes) then uses that back end."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemotron.artifacts.store import ArtifactStore, open_store


@pytest.fixture(params=["sqlite", "postgresql"])
def store_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "postgresql":
        monkeypatch.setenv("NEMOTRON_STORE_URL", request.getfixturevalue("postgres_url"))
    else:
        monkeypatch.delenv("NEMOTRON_STORE_URL", raising=False)
    return str(request.param)


@pytest.fixture
def job_outputs(home: Path, store_backend: str) -> tuple[ArtifactStore, Path]:
    """The home's store, on each back end, and a job's outputs folder in the home: gc deletes the files of the
    artifacts registered from there, as it does a job's outputs."""
    owned = home / "jobs" / "j" / "outputs"
    owned.mkdir(parents=True)
    return open_store(home / "artifacts"), owned
