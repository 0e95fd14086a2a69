"""Child processes that cannot outlive their parent: a killed trainer takes its reward server with it, and a
killed launcher takes its step, so nothing is left running with parent 1 and a job record that says running."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any, Protocol

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def free_port() -> int:
    """A loopback TCP port nothing listens on now, for a server a child process starts (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen: the child gets `sig` when the process that started it dies (Linux's
    parent-death signal; None elsewhere). A parent that died between fork and prctl is caught by the ppid check."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def arm() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return arm


def is_alive(pid: object, marker: str = "nemotron") -> bool:
    """True if `pid` is a live (not zombie) process whose command line holds `marker`, so a recycled pid of
    some other program does not count."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    proc = Path(f"/proc/{pid}")
    try:
        stat = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        if not proc.parent.joinpath("self").exists():  # no /proc: ask the kernel
            try:
                os.kill(pid, 0)
            except (ProcessLookupError, PermissionError):
                return False
            return True
        return False
    state = stat[stat.rfind(")") + 2 :][:1]
    return state not in ("Z", "X") and marker in cmdline


class Child(Protocol):
    """A started process: a subprocess.Popen, or a warm.WarmChild forked from the warm server."""

    pid: int
    stdout: IO[bytes] | None
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def start(cmd: Sequence[str], env: Mapping[str, str], stdout: Any, stdin: Any = subprocess.DEVNULL) -> Child:
    """Start `cmd` in a session of its own, stderr with stdout (subprocess.PIPE, DEVNULL, None for ours, or a
    file), dying with this process. `python -m nemotron.X` forks from the warm server when one is up (nemotron.warm:
    torch and transformers already imported); anything else, or with no server yet, is a subprocess.Popen."""
    from nemotron import warm

    with ExitStack() as stack:

        def fd(target: Any, write: bool) -> int:
            if target is None:
                return 1 if write else 0
            if target == subprocess.DEVNULL:
                return stack.enter_context(open(os.devnull, "wb" if write else "rb")).fileno()
            return int(target.fileno())

        pipe = stdout == subprocess.PIPE
        child = warm.spawn(list(cmd), dict(env), fd(stdin, False), -1 if pipe else fd(stdout, True), pipe)
    if child is not None:
        return child
    return subprocess.Popen(list(cmd), env=dict(env), stdout=stdout, stderr=subprocess.STDOUT, stdin=stdin,
                            start_new_session=True, preexec_fn=die_with_parent())  # fmt: skip


@contextmanager
def child_process(
    cmd: Sequence[str], env: Mapping[str, str], log_path: Path | None = None, inherit_output: bool = False
) -> Iterator[Child]:
    """Run `cmd` in its own session (output appended to `log_path`, else this process's own with `inherit_output`,
    else dropped) for the duration of the block; it dies with this process and is stopped (SIGTERM to its group,
    SIGKILL after a grace) on exit, error or Ctrl-C."""
    out = log_path.open("ab") if log_path else None
    sink: Any = out or (None if inherit_output else subprocess.DEVNULL)
    try:
        proc = start(cmd, env, sink)
        try:
            yield proc
        finally:
            stop_process(proc)
    finally:
        if out is not None:
            out.close()


def stop_process(proc: Child, grace: float = 10.0) -> None:
    """SIGTERM to the process group, then SIGKILL if it is still there after `grace` seconds."""
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
