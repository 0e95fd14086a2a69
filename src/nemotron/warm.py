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
below: PYTHON*, HF_*, TORCH*, OMP_*, CUDA_*, PATH, HOME, ...): a process needing another one gets another server,
so a warm child imports with what a cold one would. The nemotron package itself is not preloaded: a child imports
the code as it is on disk. The server only listens on a Unix socket in a directory that only its user may open
(and checks the peer's uid), never uses a GPU, and exits after NEMOTRON_WARM_IDLE_S seconds (600) without a child
or a request. Only local runs start warm (the local executor sets NEMOTRON_WARM=1 in its steps' environment);
NEMOTRON_WARM=0 in the user's environment starts every process cold.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import importlib
import io
import json
import os
import resource
import runpy
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ENABLE_ENV = "NEMOTRON_WARM"
IDLE_ENV = "NEMOTRON_WARM_IDLE_S"
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
)
# Environment variables that imports read (and freeze) in the server: a caller whose values differ gets a server of
# its own. The rest of the environment is the child's own.
KEY_PREFIXES = ("PYTHON", "HF_", "HUGGINGFACE", "TRANSFORMERS", "TOKENIZERS", "TORCH", "PYTORCH", "OMP_", "MKL_",
                "KMP_", "GOMP_", "OPENBLAS", "CUDA", "NVIDIA", "NCCL", "LD_", "XDG_", "LANG", "LC_")  # fmt: skip
KEY_NAMES = ("PATH", "HOME", "TMPDIR", "VIRTUAL_ENV", "TZ")
KEY_IGNORED = (
    "TORCHINDUCTOR_CACHE_DIR",
)  # torch sets it itself when a step first compiles; read at call time
LIMITS = tuple(getattr(resource, f"RLIMIT_{n}") for n in ("NOFILE", "FSIZE", "CORE", "AS", "DATA", "CPU"))
_HEADER = struct.Struct("!I")
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
        if (k.startswith(KEY_PREFIXES) or k in KEY_NAMES) and k not in KEY_IGNORED
    }


def server_key(python: str, env: dict[str, str]) -> str:
    """Which server may fork for a process of `python` with `env`: interpreter, installed packages (their folders'
    modification times change with every install), resource limits, the environment imports read, this file."""
    sites = [p for p in sys.path if p.endswith("-packages") and os.path.isdir(p)]
    parts = {
        "python": python,
        "sites": [(p, os.stat(p).st_mtime_ns) for p in sites],
        "limits": [resource.getrlimit(r) for r in LIMITS],
        "env": sorted(key_env(env).items()),
        "code": os.stat(__file__).st_mtime_ns,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def runtime_dir(env: dict[str, str]) -> Path | None:
    """Where the servers listen: a directory only this user can open (made so if missing) under $XDG_RUNTIME_DIR
    or /tmp; None if it is anything else (someone else's, a link, open to others): then every start is cold."""
    base = env.get("XDG_RUNTIME_DIR") or "/tmp"
    path = Path(base) / f"nemotron-warm-{os.getuid()}"
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
    """A process the warm server forked for us: Popen's pid, stdout, returncode, poll and wait."""

    def __init__(
        self, conn: socket.socket, pid: int, args: list[str], stdout: IO[bytes] | None, buffer: bytes = b""
    ) -> None:
        self._conn = conn
        self._buffer = buffer
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
        if b"\n" in self._buffer:
            self.returncode = int(json.loads(self._buffer.split(b"\n", 1)[0])["exit"])
            self._conn.close()
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
        # the server went away without a word (killed): the child is no longer ours to wait for
        while _running(self.pid):
            time.sleep(0.1)
        self.returncode = 1
        self._conn.close()


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def spawn(cmd: list[str], env: dict[str, str], stdin: Any, stdout: Any, pipe: bool) -> WarmChild | None:
    """Fork `cmd` (`python -m nemotron.X ...`) from the warm server; None when it must start cold (no server yet:
    one is started for the next process; another interpreter or module; warm starts disabled or refused).
    `stdin`/`stdout` are file descriptors (stderr goes with stdout); `pipe`: stdout is a new pipe, read from
    the returned child's `stdout`."""
    if len(cmd) < 3 or cmd[0] != sys.executable or cmd[1] != "-m" or not cmd[2].startswith("nemotron."):
        return None
    if not enabled(env):
        return None
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
    try:
        ignored = [int(s) for s in INHERITED if signal.getsignal(s) == signal.SIG_IGN]
        request = {"argv": cmd[2:], "env": env, "cwd": os.getcwd(), "umask": _umask(), "ignored": ignored}
        body = json.dumps(request).encode()
        socket.send_fds(conn, [_HEADER.pack(len(body))], [stdin, stdout])
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
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _start_server(python: str, env: dict[str, str], folder: Path, key: str) -> None:
    """The server, detached: no pipe of ours held open, no parent-death signal, only the environment imports read."""
    with contextlib.suppress(OSError), (folder / f"{key}.log").open("ab") as log:
        subprocess.Popen(
            [python, "-m", "nemotron.warm", "serve", str(folder / f"{key}.sock")],
            env={**key_env(env), **{k: env[k] for k in (IDLE_ENV,) if k in env}},
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )


@dataclass
class Request:
    """One command to become, in the forked child."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    umask: int
    ignored: list[int]
    fds: list[int]
    mask: list[int] = field(default_factory=list)  # the signals to keep blocked once the child is set up

    def run(self) -> None:
        """Become `python -m argv...`; exits (SystemExit) as that would."""
        os.setsid()
        for sig in INHERITED:
            signal.signal(sig, signal.SIG_IGN if int(sig) in self.ignored else signal.SIG_DFL)
        if int(signal.SIGINT) not in self.ignored:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)  # what arrived meanwhile is delivered now
        os.umask(self.umask)
        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.env)
        stdin, stdout = self.fds
        os.dup2(stdin, 0)
        os.dup2(stdout, 1)
        os.dup2(stdout, 2)
        for fd in {stdin, stdout} - {0, 1, 2}:
            os.close(fd)
        _reopen_stdio(bool(self.env.get("PYTHONUNBUFFERED")))
        sys.path[0] = self.cwd  # what `python -m` puts first
        sys.argv = [self.argv[0], *self.argv[1:]]
        runpy.run_module(self.argv[0], run_name="__main__", alter_sys=True)


def _reopen_stdio(unbuffered: bool) -> None:
    encoding = sys.stdout.encoding if sys.stdout else "utf-8"

    def text(fd: int, write: bool, errors: str, line: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w" if write else "r", closefd=False)
        binary: Any = (
            raw if (write and unbuffered) else (io.BufferedWriter(raw) if write else io.BufferedReader(raw))
        )
        return io.TextIOWrapper(
            binary, encoding, errors, line_buffering=line, write_through=write and unbuffered
        )

    # sys.__stdout__ and the others keep the server's objects: on the same descriptors, now the child's
    sys.stdin = text(0, False, "strict", False)
    sys.stdout = text(1, True, "strict", os.isatty(1))
    sys.stderr = text(2, True, "backslashreplace", True)


def serve(path: Path, idle_s: float) -> Request | None:
    """The server's loop; returns None when it exits (idle, or another server holds the lock), or the Request in a
    forked child."""
    lock = (path.with_suffix(".lock")).open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return None
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    gc.collect()
    gc.freeze()  # the children do not copy pages only to scan them
    me = os.getpid()
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: None)  # the loop exits on its own terms (wake-up below)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    owners: dict[socket.socket, int] = {}
    last = time.monotonic()
    stop = False
    try:
        while not stop or children:
            for event, _ in selector.select(timeout=1.0):
                source = event.fileobj
                if source is listener:
                    last = time.monotonic()
                    request, conn = _accept(listener)
                    if request is None or conn is None:
                        continue
                    # the child keeps signals blocked until it has its own dispositions: a SIGTERM sent to it at once
                    # (its caller died) must not reach the server's handler
                    mask = signal.pthread_sigmask(signal.SIG_BLOCK, INHERITED)
                    pid = os.fork()
                    if pid == 0:
                        request.mask = sorted(int(s) for s in mask)
                        signal.set_wakeup_fd(-1)
                        selector.close()
                        for s in {listener, *owners, *children.values()}:
                            s.close()
                        conn.close()
                        os.close(wake_r)
                        os.close(wake_w)
                        lock.close()
                        return request
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                    for fd in set(request.fds):
                        os.close(fd)
                    with contextlib.suppress(OSError):
                        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                    children[pid] = conn
                    owners[conn] = pid
                    selector.register(conn, selectors.EVENT_READ)
                elif source is wake_r:
                    with contextlib.suppress(OSError):
                        signals = os.read(wake_r, 512)
                        stop = stop or signal.SIGTERM in signals
                else:  # the caller's connection: it only closes (the caller is gone): its child goes too
                    assert isinstance(source, socket.socket)
                    with contextlib.suppress(OSError):
                        if source.recv(1):
                            continue
                    selector.unregister(source)
                    pid = owners.pop(source)
                    try:
                        os.killpg(pid, signal.SIGTERM)
                    except ProcessLookupError:  # not yet its own group (it has just forked)
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGTERM)
            _reap(children, owners, selector)
            if not children and time.monotonic() - last > idle_s:
                stop = True
    finally:
        if os.getpid() == me:
            with contextlib.suppress(OSError):
                if path.stat().st_ino == os.fstat(listener.fileno()).st_ino:
                    path.unlink()
    return None


def _accept(listener: socket.socket) -> tuple[Request | None, socket.socket | None]:
    conn, _ = listener.accept()
    fds: list[int] = []
    try:
        conn.settimeout(5.0)
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        if uid != os.getuid():
            raise OSError(f"uid {uid} is not this server's")
        header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 2)
        (size,) = _HEADER.unpack(header)
        body = b""
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise OSError("short request")
            body += chunk
        fields = json.loads(body)
        if len(fds) != 2:
            raise OSError("a request passes stdin and stdout")
        request = Request(fields["argv"], fields["env"], fields["cwd"], int(fields["umask"]),
                          [int(s) for s in fields["ignored"]], fds)  # fmt: skip
        return request, conn
    except (OSError, ValueError, KeyError, struct.error):
        for fd in fds:
            os.close(fd)
        conn.close()
        return None, None


def _reap(children: dict[int, socket.socket], owners: dict[socket.socket, int], selector: Any) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        if conn in owners:
            owners.pop(conn)
            selector.unregister(conn)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"exit": code}).encode() + b"\n")
        conn.close()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "serve":
        print("usage: python -m nemotron.warm serve SOCKET", file=sys.stderr)
        return 2
    idle = float(os.environ.get(IDLE_ENV, IDLE_S))
    request = serve(Path(argv[1]), idle)
    if request is None:
        return 0
    request.run()  # in the forked child: runs the module; its exit is the process's
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
