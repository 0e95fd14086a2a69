"""The warm server (`python -m nemotron.warm serve SOCKET`): imports PRELOAD once, then forks a child per request
that becomes the requested `python -m` command (the package's docstring says what a child gets). Single-threaded: a
selector over the socket, the callers' connections and a wake-up pipe for SIGCHLD and SIGTERM."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import gc
import importlib
import io
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import nemotron.warm
from nemotron.warm import _HEADER, HANGUP_GROUP, IDLE_ENV, IDLE_S, INHERITED, PRELOAD, runtime_dir, stop


@dataclass
class Request:
    """One command to become, in the forked child."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    umask: int
    ignored: list[int]
    fds: list[int]  # stdin, stdout, stderr
    hangup: tuple[int, bool] = HANGUP_GROUP  # nemotron.warm.HANGUP_*
    mask: list[int] = field(default_factory=list)  # the signals to keep blocked once the child is set up

    def run(self) -> NoReturn:
        """Become `python -m argv...`, and end as that would (`_end`)."""
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
        stdin, stdout, stderr = self.fds
        os.dup2(stdin, 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        for fd in {stdin, stdout, stderr} - {0, 1, 2}:
            os.close(fd)
        nemotron.warm.CHILD = True
        _reopen_stdio(bool(self.env.get("PYTHONUNBUFFERED")))
        sys.path[0] = self.cwd  # what `python -m` puts first
        sys.argv = [self.argv[0], *self.argv[1:]]
        # a module a preload imported runs afresh as __main__, as in a cold process (where nothing imported it yet)
        sys.modules.pop(self.argv[0], None)
        try:
            ran = runpy.run_module(self.argv[0], run_name="__main__", alter_sys=True)
        except SystemExit as done:
            _end(_exit_code(done.code), _main_globals(done))
        except KeyboardInterrupt as stopped:  # as the interpreter does: the traceback, then the end by SIGINT
            sys.excepthook(*sys.exc_info())
            _end(-int(signal.SIGINT), _main_globals(stopped))
        except BaseException as failed:
            sys.excepthook(*sys.exc_info())
            _end(1, _main_globals(failed))
        _end(0, [ran])


def _main_globals(ended: BaseException) -> list[dict[str, Any]]:
    """The globals of the `__main__` modules the exception left through (the command's, and a script it ran as
    __main__, as run_step does): what the interpreter's teardown clears last."""
    found: list[dict[str, Any]] = []
    tb = ended.__traceback__
    while tb is not None:
        names = tb.tb_frame.f_globals
        if names.get("__name__") == "__main__" and all(names is not f for f in found):
            found.append(names)
        tb = tb.tb_next
    return found


def _exit_code(code: object) -> int:
    """What the interpreter makes of SystemExit(code): None is 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _end(code: int, main_globals: list[dict[str, Any]]) -> NoReturn:
    """End the child as the interpreter's own exit would, but without tearing down the modules it shares with the
    server (about 0.5 s of CPU per child, measured: touching every preloaded object copies its page): threading's
    exit callbacks run and non-daemon threads joined, atexit callbacks run (logging's flush among them), the
    `__main__` modules' globals cleared and unreachable objects collected (a file left open is flushed and closed),
    stdout and stderr flushed. A negative code: ended by that signal."""
    # the interpreter's own first two steps at exit, which have no public names: threading's exit callbacks
    # (a ThreadPoolExecutor's workers are told to stop there: joining them before would wait forever), then the
    # non-daemon threads joined; then the atexit callbacks
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    # then the modules go: what only they held is freed (a file, flushed)
    for names in reversed(main_globals):
        names.clear()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


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
    lock = path.with_suffix(".lock").open("a")  # not "w": a server that loses the race must not erase the pid
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return None
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    # no signal blocked, whatever the process that started us had blocked (a forwarding CLI blocks them while it
    # connects): a child's mask is this one, and what it execs inherits it
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
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
    bound = path.stat().st_ino  # removed at the end only if no newer server has replaced it
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
    commands: dict[int, str] = {}  # for the log
    hangups: dict[int, tuple[int, bool]] = {}
    owners: dict[socket.socket, int] = {}
    last = time.monotonic()
    stop = False

    def close_listener() -> None:
        """No new child: the socket goes (a caller now starts cold), the children still running finish."""
        if listener.fileno() < 0:
            return
        selector.unregister(listener)
        with contextlib.suppress(OSError):
            if path.stat().st_ino == bound:
                path.unlink()
        listener.close()

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
                    try:
                        pid = os.fork()
                    except OSError:  # no memory or processes left: the caller starts its process cold
                        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                        for fd in set(request.fds):
                            os.close(fd)
                        conn.close()
                        continue
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
                    commands[pid] = " ".join(request.argv)[:200]
                    hangups[pid] = request.hangup
                    owners[conn] = pid
                    selector.register(conn, selectors.EVENT_READ)
                elif source is wake_r:
                    with contextlib.suppress(OSError):
                        stop = stop or signal.SIGTERM in os.read(wake_r, 512)
                else:  # the caller's connection: it only closes (the caller is gone): its child goes too
                    assert isinstance(source, socket.socket)
                    with contextlib.suppress(OSError):
                        if source.recv(1):
                            continue
                    selector.unregister(source)
                    pid = owners.pop(source)
                    sig, group = hangups.pop(pid, HANGUP_GROUP)
                    try:
                        if not group:
                            raise ProcessLookupError
                        os.killpg(pid, sig)
                    except ProcessLookupError:  # not yet its own group (it has just forked)
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, sig)
            _reap(children, owners, selector, commands)
            for gone in set(hangups) - set(children):
                del hangups[gone]
            stop = stop or (not children and time.monotonic() - last > idle_s)
            if stop:
                close_listener()
    finally:
        if os.getpid() == me:
            close_listener()
    return None


def _accept(listener: socket.socket) -> tuple[Request | None, socket.socket | None]:
    conn, _ = listener.accept()
    fds: list[int] = []
    try:
        conn.settimeout(5.0)
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        if uid != os.getuid():
            raise OSError(f"uid {uid} is not this server's")
        header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
        (size,) = _HEADER.unpack(header)
        body = b""
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise OSError("short request")
            body += chunk
        fields = json.loads(body)
        if len(fds) != 3:
            raise OSError("a request passes stdin, stdout and stderr")
        sig, group = fields.get("hangup", HANGUP_GROUP)
        request = Request(fields["argv"], fields["env"], fields["cwd"], int(fields["umask"]),
                          [int(s) for s in fields["ignored"]], fds, (int(sig), bool(group)))  # fmt: skip
        return request, conn
    except (OSError, ValueError, KeyError, struct.error):
        for fd in fds:
            os.close(fd)
        conn.close()
        return None, None


def _reap(
    children: dict[int, socket.socket],
    owners: dict[socket.socket, int],
    selector: Any,
    commands: dict[int, str],
) -> None:
    """Collect the children that ended; tell each one's caller its exit code; log it with its CPU time."""
    while children:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        cpu = usage.ru_utime + usage.ru_stime
        stamp = time.strftime("%H:%M:%S")
        with contextlib.suppress(OSError):  # a full disk: the log is the least of it
            print(
                f"{stamp} pid {pid} exit {code} cpu {cpu:.1f} s: python -m {commands.pop(pid, '?')}",
                flush=True,
            )
        if conn in owners:
            owners.pop(conn)
            selector.unregister(conn)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"exit": code}).encode() + b"\n")
        conn.close()


USAGE = """usage: python -m nemotron.warm serve SOCKET   (started by the first local run)
       python -m nemotron.warm stop               (stops this user's servers: $NEMOTRON_WARM_DIR or the default)"""


def main(argv: list[str]) -> int:
    if argv == ["stop"]:
        folder = runtime_dir(dict(os.environ))
        print(f"stopped {stop(folder) if folder else 0} warm server(s)")
        return 0
    if len(argv) != 2 or argv[0] != "serve":
        print(USAGE, file=sys.stderr)
        return 2
    idle = float(os.environ.get(IDLE_ENV, IDLE_S))
    request = serve(Path(argv[1]), idle)
    if request is None:
        return 0
    request.run()  # in the forked child: runs the module and ends as it does


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
