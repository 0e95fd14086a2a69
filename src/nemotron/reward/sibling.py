"""Start `rm/serve` beside a trainer: a sibling process on a free loopback port, stopped at the end, always.

One per node: under torchrun, local rank 0 starts it and the node's other ranks use it (`NodeShare`).
On Slurm the server is the other group of a heterogeneous job instead, and its address arrives in
$NEMOTRON_REWARD_URL; `external_url` says which applies.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from nemotron.core.procs import child_process
from nemotron.errors import UserError
from nemotron.reward.client import RewardServerError, wait_ready
from nemotron.reward.server import TOKEN_ENV

log = logging.getLogger("nemotron")
URL_ENV = "NEMOTRON_REWARD_URL"
SHARE_DIR = "siblings"  # under the job dir
PEERS_GRACE_S = 60.0  # how long local rank 0 waits for the node's other ranks before stopping the server


@dataclass(frozen=True)
class NodeShare:
    """How the ranks torchrun starts on one node share one sibling server. Local rank 0 starts it and writes
    its URL and token to `path` (mode 0600); the others wait for that file, use the server, and each leaves a
    `.done-<local rank>` mark beside it, so that local rank 0 stops the server only once they have finished."""

    path: Path
    local_rank: int
    local_world_size: int

    @property
    def owner(self) -> bool:
        return self.local_rank == 0

    @classmethod
    def from_env(cls, server: str, environ: Mapping[str, str] | None = None) -> NodeShare | None:
        """From torchrun's variables; None for a single process per node (or no job dir to meet in)."""
        env: Mapping[str, str] = os.environ if environ is None else environ
        job_dir = env.get("NEMOTRON_JOB_DIR")
        if int(env.get("LOCAL_WORLD_SIZE", "1")) <= 1 or not job_dir:
            return None
        # one file per server kind, node, torchrun run and restart: a restarted or requeued run never reads
        # the address of a server that died with the previous attempt
        attempt = "-".join(
            env.get(k, "0")
            for k in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
        )
        name = f"{server}-node{env.get('GROUP_RANK', '0')}-{attempt}.json"
        return cls(
            Path(job_dir) / SHARE_DIR / name, int(env.get("LOCAL_RANK", "0")), int(env["LOCAL_WORLD_SIZE"])
        )

    def publish(self, url: str, token: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"url": url, "token": token, "pid": os.getpid()}, f)
        os.replace(tmp, self.path)

    def read(self, timeout: float) -> tuple[str, str]:
        deadline = time.monotonic() + timeout
        while not self.path.is_file():
            if time.monotonic() > deadline:
                raise RewardServerError(
                    f"local rank 0 did not publish its server's address in {self.path} within {timeout:.0f} s"
                )
            time.sleep(0.05)
        info = json.loads(self.path.read_text())
        return str(info["url"]), str(info["token"])

    def done_mark(self, local_rank: int) -> Path:
        return self.path.with_name(f"{self.path.name}.done-{local_rank}")

    def mark_done(self) -> None:
        self.done_mark(self.local_rank).touch()

    def clear(self) -> None:
        """Remove the address (it holds the token) and the done marks once the server is going away."""
        for path in [self.path, *(self.done_mark(r) for r in range(1, self.local_world_size))]:
            path.unlink(missing_ok=True)

    def wait_for_peers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all(self.done_mark(r).exists() for r in range(1, self.local_world_size)):
            if time.monotonic() > deadline:
                log.warning(
                    "stopping the shared server: not every local rank said it was done within %.0f s", timeout
                )
                return
            time.sleep(0.05)


@contextmanager
def sibling_server(
    model: str | Path,
    module: str = "nemotron.reward.server",
    threads: int = 1,
    max_length: int | None = None,
    startup_timeout: float = 120.0,
    log_path: Path | None = None,
    share: NodeShare | None = None,
    device: str = "auto",
    precision: str = "fp32",
    own: Callable[[], AbstractContextManager[tuple[str, str]]] | None = None,
    ready_path: str = "/v2/health/ready",
) -> Iterator[tuple[str, str]]:
    """Run `python -m MODULE --model MODEL` on 127.0.0.1 with a fresh bearer token; yield (url, token).
    `own` starts another kind of server instead (`vllm serve`: reward/vllm_serve.py), shared the same way.

    The child is in its own process group and gets SIGTERM (then SIGKILL) on exit, on error and on Ctrl-C,
    so no server outlives the trainer. Under torchrun only local rank 0 starts one; `share` (default: from
    torchrun's environment) says how the node's other ranks find it.
    """
    share = share or NodeShare.from_env(module.rsplit(".", 1)[-1])
    if share is not None and not share.owner:
        url, token = share.read(timeout=2 * startup_timeout)  # local rank 0 loads the model meanwhile
        wait_ready(url, timeout=startup_timeout, token=token, path=ready_path)
        log.info("using the %s that local rank 0 started at %s", module, url)
        try:
            yield url, token
        finally:
            share.mark_done()
        return
    start = own or (
        lambda: _own_server(model, module, threads, max_length, startup_timeout, log_path, device, precision)
    )
    with start() as (url, token):
        if share is None:
            yield url, token
            return
        share.publish(url, token)
        try:
            yield url, token
            share.wait_for_peers(PEERS_GRACE_S)  # not on an error or Ctrl-C: the server stops at once then
        finally:
            share.clear()


@contextmanager
def _own_server(
    model: str | Path,
    module: str,
    threads: int,
    max_length: int | None,
    startup_timeout: float,
    log_path: Path | None,
    device: str,
    precision: str,
) -> Iterator[tuple[str, str]]:
    token = secrets.token_urlsafe(24)
    if max_length is None:  # score whole sequences: the model's own context length
        config = json.loads((Path(model) / "config.json").read_text())
        max_length = int(config.get("n_positions") or config.get("max_position_embeddings") or 512)
    with tempfile.TemporaryDirectory(prefix="nemotron-rm-") as tmp:
        ready = Path(tmp) / "ready.json"
        cmd = [
            sys.executable,
            "-m",
            module,
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--threads",
            str(threads),
            "--max-length",
            str(max_length),
            "--ready-file",
            str(ready),
            "--device",
            device,
            "--precision",
            "bf16" if precision == "bf16" else "fp32",
        ]
        # child_process: the server dies with the trainer, even one killed with -9 (which runs no `finally`).
        with child_process(cmd, {**os.environ, TOKEN_ENV: token}, log_path) as proc:
            deadline = time.monotonic() + startup_timeout
            while not ready.is_file():
                if proc.poll() is not None:
                    reason = _refusal(log_path) if proc.returncode == 2 else None
                    if reason:  # the server's own bad input (a model it cannot load): the step's, exit 2
                        raise UserError(f"the reward model cannot be served: {reason}")
                    raise RewardServerError(
                        f"the reward server (python -m {module}) exited with code {proc.returncode} before it was ready"
                        + (f"; see {log_path}" if log_path else "")
                    )
                if time.monotonic() > deadline:
                    raise RewardServerError(f"the reward server did not start within {startup_timeout:.0f} s")
                time.sleep(0.05)
            url = str(json.loads(ready.read_text())["url"])
            wait_ready(url, timeout=startup_timeout, token=token)
            log.info("reward server (pid %d) ready at %s", proc.pid, url)
            yield url, token


def _refusal(log_path: Path | None) -> str | None:
    """The one-line reason a server that exited 2 (bad input) gave: the last `error: ...` line of its log."""
    try:
        lines = log_path.read_text(errors="replace").splitlines() if log_path else []
    except OSError:
        return None
    found = [line.removeprefix("error: ").strip() for line in lines if line.startswith("error: ")]
    return found[-1] if found else None


def external_url(configured: str | None) -> str | None:
    """The configured server URL, else the one a heterogeneous job exported, else None (start a sibling)."""
    return configured or os.environ.get(URL_ENV) or None
