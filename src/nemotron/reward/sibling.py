"""Start `rm/serve` beside a trainer: a sibling process on a free loopback port, stopped at the end, always.

On Slurm the server is the other group of a heterogeneous job instead, and its address arrives in
$NEMOTRON_REWARD_URL; `reward_server_url` picks whichever applies.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nemotron.procs import die_with_parent
from nemotron.reward.client import RewardServerError, wait_ready
from nemotron.reward.server import TOKEN_ENV

log = logging.getLogger("nemotron")
URL_ENV = "NEMOTRON_REWARD_URL"


@contextmanager
def sibling_server(
    model: str | Path,
    module: str = "nemotron.reward.server",
    threads: int = 1,
    max_length: int | None = None,
    startup_timeout: float = 120.0,
    log_path: Path | None = None,
    device: str = "auto",
    precision: str = "fp32",
) -> Iterator[tuple[str, str]]:
    """Run `python -m MODULE --model MODEL` on 127.0.0.1 with a fresh bearer token; yield (url, token).

    The child is in its own process group and gets SIGTERM (then SIGKILL) on exit, on error and on Ctrl-C,
    so no server outlives the trainer.
    """
    token = secrets.token_urlsafe(24)
    if max_length is None:  # score whole sequences: the model's own context length
        config = json.loads((Path(model) / "config.json").read_text())
        max_length = int(config.get("n_positions") or config.get("max_position_embeddings") or 512)
    with tempfile.TemporaryDirectory(prefix="nemotron-rm-") as tmp:
        ready = Path(tmp) / "ready.json"
        cmd = [sys.executable, "-m", module, "--model", str(model), "--host", "127.0.0.1", "--port", "0",
               "--threads", str(threads), "--max-length", str(max_length), "--ready-file", str(ready),
               "--device", device, "--precision", "bf16" if precision == "bf16" else "fp32"]
        out = log_path.open("ab") if log_path else subprocess.DEVNULL
        # die_with_parent: a trainer killed with -9 cannot run its `finally`; the server must not outlive it.
        proc = subprocess.Popen(cmd, env={**os.environ, TOKEN_ENV: token}, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent())
        try:
            deadline = time.monotonic() + startup_timeout
            while not ready.is_file():
                if proc.poll() is not None:
                    raise RewardServerError(f"the reward server (python -m {module}) exited with code {proc.returncode} before it was ready" + (f"; see {log_path}" if log_path else ""))
                if time.monotonic() > deadline:
                    raise RewardServerError(f"the reward server did not start within {startup_timeout:.0f} s")
                time.sleep(0.05)
            url = str(json.loads(ready.read_text())["url"])
            wait_ready(url, timeout=startup_timeout, token=token)
            log.info("reward server (pid %d) ready at %s", proc.pid, url)
            yield url, token
        finally:
            _stop(proc)
            if log_path and not isinstance(out, int):
                out.close()


def _stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def external_url(configured: str | None) -> str | None:
    """The configured server URL, else the one a heterogeneous job exported, else None (start a sibling)."""
    return configured or os.environ.get(URL_ENV) or None
