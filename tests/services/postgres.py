"""A real PostgreSQL server for the tests: initdb into a temporary directory, started with pg_ctl on a free
loopback port, trust auth, stopped at the end of the session. One per pytest worker; each test gets a fresh database.

PostgreSQL refuses to run as root: as root the data directory is handed to the `postgres` user (the Debian package
creates it) and the server runs as that user. The binaries come from $NEMOTRON_PG_BIN, `pg_config --bindir`, the
Debian layout /usr/lib/postgresql/*/bin, or PATH; scripts/test.sh installs the Debian package when none is there.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from nemotron.core.procs import free_port

START_TIMEOUT_S = 60


def pg_bindir() -> Path | None:
    """Where initdb, pg_ctl and postgres live, or None when PostgreSQL is not installed."""
    given = os.environ.get("NEMOTRON_PG_BIN")
    candidates = [Path(given)] if given else []
    pg_config = shutil.which("pg_config")
    if pg_config:
        done = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            candidates.append(Path(done.stdout.strip()))
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    for c in candidates:
        if (c / "initdb").is_file() and (c / "pg_ctl").is_file():
            return c
    return None


@dataclass
class PostgresServer:
    """A running server: `url(db)` names a database on it; `create_database()` makes a fresh, empty one."""

    bindir: Path
    data: Path
    port: int
    run_as: str | None  # the user the server runs as when we are root

    def _cmd(self, *argv: str) -> list[str]:
        return ["runuser", "-u", self.run_as, "--", *argv] if self.run_as else list(argv)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    @classmethod
    def start(cls, bindir: Path) -> PostgresServer:
        base = Path(tempfile.mkdtemp(prefix="nemotron-pg-"))
        data = base / "data"
        run_as = None
        if os.geteuid() == 0:
            run_as = "postgres"
            pw = pwd.getpwnam(run_as)
            os.chown(base, pw.pw_uid, pw.pw_gid)
        server = cls(bindir, data, free_port(), run_as)
        subprocess.run(
            server._cmd(
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ),
            check=True,
            capture_output=True,
            text=True,
        )
        opts = f"-c listen_addresses=127.0.0.1 -p {server.port} -k {base} -c fsync=off -c max_connections=100"
        done = subprocess.run(
            server._cmd(
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(base / "server.log"),
                "-o",
                opts,
                "-w",
                "-t",
                str(START_TIMEOUT_S),
                "start",
            ),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            log = (base / "server.log").read_text() if (base / "server.log").is_file() else ""
            raise RuntimeError(f"PostgreSQL did not start: {done.stdout}{done.stderr}\n{log[-2000:]}")
        return server

    def stop(self) -> None:
        subprocess.run(
            self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"),
            capture_output=True,
            check=False,
        )
        shutil.rmtree(self.data.parent, ignore_errors=True)


def wait_ready(server: PostgresServer, timeout_s: float = 30) -> None:
    import psycopg

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with psycopg.connect(server.url(), connect_timeout=2):
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
