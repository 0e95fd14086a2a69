"""`python -m nemotron` forked from the warm server: with NEMOTRON_WARM_CLI=1 in the environment and no terminal on
stdin, stdout or stderr (scripts, CI, the test suite, which runs the CLI some thousand times), the command runs in
a child of the warm server (the package's docstring says what a child gets), with this process's stdin, stdout and
stderr, and this process waits for it and exits as it did. Signals sent to this process (Ctrl-C's SIGINT, SIGTERM,
SIGHUP, ...) go on to the child; if this process is killed (SIGKILL), the child is killed as well, as a killed cold
CLI simply ends. Interpreter options (`-X importtime`) keep the command in this process. Without a server yet, the
first command starts one and runs cold; on a terminal the CLI always runs cold, in the terminal's foreground
process group, where job control (Ctrl-Z, prompts) needs it."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from nemotron import warm
from nemotron.warm import ENABLE_ENV, HANGUP_ALONE, INHERITED, fork_from_server

CLI_ENV = "NEMOTRON_WARM_CLI"


def forward(args: list[str]) -> int | None:
    """Run `python -m nemotron ARGS` in a warm child and return its exit code; None: run it here, cold."""
    env = dict(os.environ)
    if warm.CHILD or env.get(CLI_ENV) != "1" or env.get(ENABLE_ENV) == "0":
        return None
    if sys._xoptions:  # `python -X importtime -m nemotron ...` measures this process: it runs here
        return None
    with contextlib.suppress(OSError):
        if any(os.isatty(fd) for fd in (0, 1, 2)):
            return None
    # a signal that arrives before the child exists is held, then forwarded
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, INHERITED)
    try:
        child = fork_from_server(
            [sys.executable, "-m", "nemotron", *args], env, (0, 1, 2), False, HANGUP_ALONE
        )
        if child is None:
            return None
        for sig in INHERITED:
            if sig != signal.SIGCHLD and signal.getsignal(sig) != signal.SIG_IGN:
                signal.signal(sig, lambda s, _frame: child.send_signal(s))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    code = child.wait()
    if code < 0:  # killed by a signal: end the same way, so our parent sees what it would have seen
        signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
    return code
