"""A real `mlflow server` for the tracking tests (tests/conftest.py's `mlflow_server`): SQLite backend and artifacts
under a folder, on 127.0.0.1 and a free port, stopped with its worker when the session ends."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# its first start migrates a new SQLite database: about 20 s on a busy 2-core runner
START_TIMEOUT_S = 180


@contextmanager
def running_server(root: Path) -> Iterator[str]:
    """The tracking URI of a server that keeps its store in `root`, healthy, until the block ends."""
    from nemotron.core.procs import free_port

    port = free_port()
    log_path = root / "server.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
             "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mlflow server exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (OSError, http.client.HTTPException):  # not up yet
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"mlflow server not healthy in {START_TIMEOUT_S} s:\n{log_path.read_text()[-3000:]}"
                )
            time.sleep(0.5)
        yield uri
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and its uvicorn worker
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
