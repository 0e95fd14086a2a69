"""Warm starts: a local step, and each server it starts beside it, forks from a per-user process that has already
imported torch and transformers, instead of importing them again (about 9 s of CPU per process on a 2-core
machine: most of a tiny step's cost).

`spawn(cmd, ...)` is what `procs.start` tries first for `python -m nemotron.<module> ...`. The first call finds no
warm server: it starts one in the background (`python -m nemotron.warm serve SOCKET`, detached) and returns None, so
that call starts its process cold; later ones connect to it. The server imports PRELOAD once, then for each request
forks a child that becomes the requested command: a session of its own, the caller's working directory, umask,
environment and stdin/stdout/stderr (passed over the socket), and the module run as `__main__` as `python -m` runs
it. The caller gets a `WarmChild`: its pid (its process group), its exit code, and it stops it like a Popen. The
child dies with its caller, as a cold one does through the parent-death signal: the server sends its process group
SIGTERM when the caller's connection closes.

One server per interpreter, installed packages, resource limits and the environment that imports read (KEY_PREFIXES
below: PYTHON*, HF_*, TORCH*, OMP_*, CUDA_*, HOME, ...): a process needing another one gets another server,
so a warm child imports with what a cold one would; and per version of the package's own files, so a child never
runs code older than what is on disk. The server only listens on a Unix socket in a directory that only its user may open
(and checks the peer's uid), never uses a GPU, and exits after NEMOTRON_WARM_IDLE_S seconds (600) without a child
or a request. Only local runs start warm (the local executor sets NEMOTRON_WARM=1 in its steps' environment);
NEMOTRON_WARM=0 in the user's environment starts every process cold.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

ENABLE_ENV = "NEMOTRON_WARM"
IDLE_ENV = "NEMOTRON_WARM_IDLE_S"
DIR_ENV = "NEMOTRON_WARM_DIR"  # where the servers listen, instead of $XDG_RUNTIME_DIR/nemotron-warm-$UID
IDLE_S = 600.0
# What the steps and the reward server import from outside this package (measured with -X importtime: ~95% of a
# tiny step's import time); a module that cannot be imported here is left to the child.
PRELOAD = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "safetensors.torch",
    "numpy",
    "yaml",
    "pydantic",
    "jinja2",
    "h11",
    "httpx",
    "prometheus_client",
    # and what the CLI imports (nemotron.warm.cli)
    "typer",
    "click",
    "rich.console",
    "rich.table",
    "omegaconf",
    # what NeMo-Run imports, for the commands that submit to or ask a Slurm or Lepton scheduler through it: 1.9 CPU-s
    # of `import nemo_run` after the above, 0.5 after these. Not nemo_run itself (it reads NEMORUN_HOME when
    # imported: nemotron.launch.remote sets it per home first), nor leptonai or loguru (they read their settings then)
    "networkx",
    "libcst",
    "fastapi",
    "fiddle",
    "torchx.specs",
    "torchx.runner",
    "cryptography",
    "paramiko",
    "invoke",
    "markdown_it",
    "graphviz",
    # our own modules that every command or step imports (the key holds the package's files, so a server never
    # serves code older than what is on disk); none of them reads the environment or the terminal when imported
    "nemotron.cli.app",
    "nemotron.compile",
    "nemotron.catalog",
    "nemotron.launch.submit",
    "nemotron.runtime.step",
)
# Environment variables that imports read (and freeze) in the server: a caller whose values differ gets a server of
# its own. The rest of the environment is the child's own, read when it is used: the job's variables, PATH,
# torchrun's (TORCHELASTIC_*, one run id each), NCCL's (read when a process group starts), torch's cache dir (torch
# sets it itself when a step first compiles).
KEY_PREFIXES = ("PYTHON", "HF_", "HUGGINGFACE", "TRANSFORMERS", "TOKENIZERS", "TORCH", "PYTORCH", "OMP_", "MKL_",
                "KMP_", "GOMP_", "OPENBLAS", "CUDA", "NVIDIA", "LD_", "LANG", "LC_")  # fmt: skip
KEY_NAMES = ("HOME", "TMPDIR", "VIRTUAL_ENV", "TZ", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")
KEY_IGNORED = ("TORCHELASTIC_", "TORCH_NCCL_", "TORCHINDUCTOR_CACHE_DIR")
LIMITS = tuple(getattr(resource, f"RLIMIT_{n}") for n in ("NOFILE", "FSIZE", "CORE", "AS", "DATA", "CPU"))
_HEADER = struct.Struct("!I")
# What the child gets when its caller's connection closes without an exit code (the caller was killed): a step or
# server, its process group SIGTERM (as its parent-death signal would); a forwarded CLI (nemotron.warm.cli),
# itself SIGKILL, as a killed cold CLI simply ends.
HANGUP_GROUP = (signal.SIGTERM, True)
HANGUP_ALONE = (signal.SIGKILL, False)
CHILD = False  # True in a process the warm server forked (its `python -m nemotron` must not forward again)
# Signals whose disposition a child inherits as a cold one would: ignored if ignored in the caller (exec keeps
# SIG_IGN), else the default (exec resets handlers); Python's start-up then handles SIGINT and ignores SIGPIPE.
INHERITED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGCHLD, signal.SIGALRM)  # fmt: skip


def enabled(env: dict[str, str]) -> bool:
    """Only where the environment asks (NEMOTRON_WARM=1: the local executor sets it for its steps, unless the user's
    environment says 0): never inside a cluster's job, whose node no server may outlive."""
    return sys.platform.startswith("linux") and env.get(ENABLE_ENV) == "1"


def key_env(env: dict[str, str]) -> dict[str, str]:
    return {
        k: v
        for k, v in env.items()
        if (k.startswith(KEY_PREFIXES) or k in KEY_NAMES) and not k.startswith(KEY_IGNORED)
    }


def server_key(python: str, env: dict[str, str]) -> str:
    """Which server may fork for a process of `python` with `env`: interpreter, installed packages (their folders'
    modification times change with every install), resource limits, the environment imports read, our own files."""
    sites = [p for p in sys.path if p.endswith("-packages") and os.path.isdir(p)]
    parts = {
        "python": python,
        "sites": [(p, os.stat(p).st_mtime_ns) for p in sites],
        "limits": [resource.getrlimit(r) for r in LIMITS],
        "env": sorted(key_env(env).items()),
        "code": _code_stamp(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def _code_stamp() -> list[tuple[str, int]]:
    """Every module of the package, with its modification time: a server preloads some of them."""
    root = Path(__file__).resolve().parents[1]
    stamps = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                stamps.append((path, os.stat(path).st_mtime_ns))
    return stamps


def runtime_dir(env: dict[str, str]) -> Path | None:
    """Where the servers listen: a directory only this user can open (made so if missing) under $XDG_RUNTIME_DIR
    or /tmp; None if it is anything else (someone else's, a link, open to others): then every start is cold."""
    given = env.get(DIR_ENV)
    path = (
        Path(given) if given else Path(env.get("XDG_RUNTIME_DIR") or "/tmp") / f"nemotron-warm-{os.getuid()}"
    )
    try:
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        st = path.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return path


class WarmChild:
    """A process the warm server forked for us: Popen's pid, args, stdout, returncode, poll, wait, send_signal,
    terminate and kill."""

    def __init__(
        self, conn: socket.socket, pid: int, args: list[str], stdout: IO[bytes] | None, buffer: bytes = b""
    ) -> None:
        self._conn = conn
        self._buffer = buffer
        self._orphaned = False
        self._pidfd: int | None = None  # this very process (no recycled pid), readable once it has ended
        with contextlib.suppress(OSError, AttributeError):
            self._pidfd = os.pidfd_open(pid)
        self.pid = pid
        self.args = args
        self.stdout = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._read(left)
        return self.returncode

    def _read(self, timeout: float | None) -> None:
        if self._orphaned:  # the server went away without a word (killed): the child ends on its own time
            if not self._ended(min(0.1, timeout if timeout is not None else 0.1)):
                return
            self.returncode = 1  # its exit code went with the server
            self._close_pidfd()
            return
        if b"\n" in self._buffer:
            self.returncode = int(json.loads(self._buffer.split(b"\n", 1)[0])["exit"])
            self._conn.close()
            self._close_pidfd()
            return
        self._conn.settimeout(timeout)
        try:
            chunk = self._conn.recv(4096)
        except (TimeoutError, BlockingIOError):
            return
        except OSError:
            chunk = b""
        if chunk:
            self._buffer += chunk
            if b"\n" in self._buffer:
                self._read(0.0)
            return
        self._orphaned = True
        self._conn.close()
        self._read(0.0)

    def send_signal(self, sig: int) -> None:
        """`sig` to this very child (through its pidfd: never a recycled pid), if it is still there."""
        with contextlib.suppress(ProcessLookupError, OSError):
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            elif self.returncode is None:
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _ended(self, timeout: float) -> bool:
        """Whether the child has ended, waiting up to `timeout` seconds for it."""
        if self._pidfd is not None:
            return bool(select.select([self._pidfd], [], [], timeout)[0])
        try:  # no pidfd (kernel before 5.3): the pid, as the kernel sees it
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return True  # the pid is another user's now: ours has ended
        time.sleep(timeout)
        return False

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def spawn(cmd: list[str], env: dict[str, str], stdin: Any, stdout: Any, pipe: bool) -> WarmChild | None:
    """Fork `cmd` (`python -m nemotron.X ...`) from the warm server; None when it must start cold (no server yet:
    one is started for the next process; another interpreter or module; warm starts disabled or refused).
    `stdin`/`stdout` are file descriptors (stderr goes with stdout); `pipe`: stdout is a new pipe, read from
    the returned child's `stdout`."""
    if not enabled(env):
        return None
    return fork_from_server(cmd, env, (stdin, stdout, stdout), pipe, HANGUP_GROUP)


def fork_from_server(
    cmd: list[str], env: dict[str, str], fds: tuple[int, int, int], pipe: bool, hangup: tuple[int, bool]
) -> WarmChild | None:
    """`spawn` without the NEMOTRON_WARM check: `fds` are stdin, stdout, stderr (`pipe`: stdout and stderr go to a
    new pipe instead); `hangup` is the signal the child gets when its caller's connection closes, and whether it
    goes to the child's process group or to the child alone."""
    if len(cmd) < 3 or cmd[0] != sys.executable or cmd[1] != "-m":
        return None
    if cmd[2] != "nemotron" and not cmd[2].startswith("nemotron."):
        return None
    stdin, stdout, stderr = fds
    folder = runtime_dir(env)
    if folder is None:
        return None
    key = server_key(cmd[0], env)
    path = folder / f"{key}.sock"
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(5.0)
        conn.connect(str(path))
    except OSError:
        conn.close()
        _start_server(cmd[0], env, folder, key)
        return None
    reader = None
    if pipe:
        reader, stdout = os.pipe()
        stderr = stdout
    try:
        ignored = [int(s) for s in INHERITED if signal.getsignal(s) == signal.SIG_IGN]
        request = {"argv": cmd[2:], "env": env, "cwd": os.getcwd(), "umask": _umask(), "ignored": ignored,
                   "hangup": [int(hangup[0]), hangup[1]]}  # fmt: skip
        body = json.dumps(request).encode()
        socket.send_fds(conn, [_HEADER.pack(len(body))], [stdin, stdout, stderr])
        conn.sendall(body)
        line = b""
        while b"\n" not in line:
            chunk = conn.recv(4096)
            if not chunk:
                raise OSError("the warm server closed the connection")
            line += chunk
        first, rest = line.split(b"\n", 1)
        pid = int(json.loads(first)["pid"])
    except (OSError, ValueError, KeyError):
        conn.close()
        if reader is not None:
            os.close(reader)
            os.close(stdout)
        return None
    if reader is not None:
        os.close(stdout)
    return WarmChild(conn, pid, cmd, os.fdopen(reader, "rb") if reader is not None else None, rest)


def _umask() -> int:
    """This process's umask, read without setting it (which would race the other threads' new files)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _start_server(python: str, env: dict[str, str], folder: Path, key: str) -> None:
    """The server, detached: no pipe of ours held open, no parent-death signal, only the environment imports read."""
    with contextlib.suppress(OSError), (folder / f"{key}.log").open("ab") as log:
        subprocess.Popen(
            [python, "-m", "nemotron.warm", "serve", str(folder / f"{key}.sock")],  # nemotron/warm/server.py
            env={**key_env(env), **{k: env[k] for k in ("PATH", IDLE_ENV) if k in env}},
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )


def stop(folder: Path) -> int:
    """SIGTERM every server listening in `folder` (each exits once its children have); how many there were."""
    stopped = 0
    for lock in folder.glob("*.lock"):
        with contextlib.suppress(OSError, ValueError, IndexError):  # a lock without a pid: its server is gone
            pid = int(lock.read_text().split()[0])
            if b"nemotron.warm" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGTERM)
                stopped += 1
    return stopped
