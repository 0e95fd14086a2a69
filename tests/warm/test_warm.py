"""Warm starts (nemotron.warm): a process forked from the warm server is the process a cold start would have made,
with torch already imported; it dies with the process that started it; each import environment has its server."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemotron import warm
from nemotron.core import procs

# What a child reports of itself: run through `python -m nemotron.run_step SCRIPT ARGS` as a step is
REPORT = """
import json, os, signal, sys
mask = os.umask(0); os.umask(mask)
print(json.dumps({
    "torch_loaded": "torch" in sys.modules, "cwd": os.getcwd(), "argv": sys.argv[1:], "name": __name__,
    "only_here": os.environ.get("ONLY_HERE"), "umask": mask, "own_group": os.getpgid(0) == os.getpid(),
    "stdin": sys.stdin.read(), "usr2_ignored": signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN,
    "sigint": str(signal.getsignal(signal.SIGINT)), "path0": sys.path[0],
    "blocked": [l.split()[1] for l in open("/proc/self/status") if l.startswith("SigBlk:")][0],
}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("EXIT", "0")))
"""
SLEEP = "import time\nprint('up', flush=True)\ntime.sleep(120)\n"


def _servers(env: dict[str, str]) -> Path:
    return Path(env[warm.DIR_ENV])


def _wait_for_server(env: dict[str, str], cmd: list[str]) -> None:
    """The first start is cold and starts the server; wait until it listens for this command's environment."""
    sock = _servers(env) / f"{warm.server_key(cmd[0], env)}.sock"
    deadline = time.monotonic() + 180
    while not sock.exists():
        assert time.monotonic() < deadline, list(_servers(env).glob("*.log"))
        time.sleep(0.2)


def _stop_servers(env: dict[str, str]) -> None:
    for lock in _servers(env).glob("*.lock"):
        text = lock.read_text().strip()
        if text:
            try:
                os.kill(int(text), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """An environment whose warm server (in a runtime folder of its own) is up: the first start was cold."""
    runtime = tmp_path_factory.mktemp("runtime")
    runtime.chmod(0o700)
    env = {
        **os.environ,
        warm.DIR_ENV: str(runtime),
        "NEMOTRON_WARM_IDLE_S": "120",
        "PYTHONUNBUFFERED": "1",
        warm.ENABLE_ENV: "1",
    }
    script = runtime / "first.py"
    script.write_text("print('first')\n")
    try:
        # started the way the test suite starts its own: by a forwarding CLI, which blocks signals meanwhile
        first = subprocess.run([sys.executable, "-m", "nemotron", "steps", "list"], env={**env, "NEMOTRON_WARM_CLI": "1"},
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=120)  # fmt: skip
        assert first.returncode == 0, first.stderr
        _wait_for_server(env, _cmd(script))
        yield env
        # `python -m nemotron.warm stop` (what scripts/test.sh runs at its end) stops them (the steps an attached CLI
        # ran had one of their own: the local executor sets HF_HUB_OFFLINE): their sockets go
        listening = len(list(_servers(env).glob("*.sock")))
        stopped = subprocess.run([sys.executable, "-m", "nemotron.warm", "stop"], env=env, capture_output=True,
                                 text=True, timeout=60)  # fmt: skip
        assert listening and stopped.stdout.strip() == f"stopped {listening} warm server(s)", stopped
        deadline = time.monotonic() + 30
        while list(_servers(env).glob("*.sock")):
            assert time.monotonic() < deadline, "a stopped server kept its socket"
            time.sleep(0.1)
    finally:
        _stop_servers(env)


def _cmd(script: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "nemotron.run_step", str(script), *args]


def _run(cmd: list[str], env: dict[str, str], cwd: Path, stdin: Path) -> tuple[procs.Child, str]:
    before = os.getcwd()
    mask = os.umask(0o027)
    os.chdir(cwd)
    try:
        with stdin.open("rb") as source:
            child = procs.start(cmd, env, subprocess.PIPE, stdin=source)
    finally:
        os.chdir(before)
        os.umask(mask)
    assert child.stdout is not None
    out = child.stdout.read().decode()
    child.wait(60)
    return child, out


def test_a_warm_child_is_what_a_cold_start_makes_with_torch_already_imported(
    env: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    stdin = tmp_path / "stdin.txt"
    stdin.write_text("from stdin")
    cmd = _cmd(script, "a", "b c")
    run_env = {**env, "ONLY_HERE": "yes", "EXIT": "7"}
    cold, cold_out = _run(cmd, {**run_env, warm.ENABLE_ENV: "0"}, tmp_path, stdin)
    assert isinstance(cold, subprocess.Popen)
    hot, hot_out = _run(cmd, run_env, tmp_path, stdin)
    assert isinstance(hot, warm.WarmChild)
    assert cold.returncode == hot.returncode == 7
    assert cold_out.endswith("to stderr\n") and hot_out.endswith("to stderr\n")  # stderr goes with stdout
    got = {name: json.loads(out.splitlines()[0]) for name, out in (("cold", cold_out), ("warm", hot_out))}
    assert got["cold"].pop("torch_loaded") is False and got["warm"].pop("torch_loaded") is True
    assert got["warm"] == got["cold"]
    assert got["warm"]["argv"] == ["a", "b c"] and got["warm"]["cwd"] == str(tmp_path)
    assert got["warm"]["path0"] == str(tmp_path) and got["warm"]["name"] == "__main__"
    assert got["warm"]["umask"] == 0o027 and got["warm"]["only_here"] == "yes" and got["warm"]["own_group"]
    assert got["warm"]["stdin"] == "from stdin" and not got["warm"]["usr2_ignored"]
    log = (_servers(env) / f"{warm.server_key(cmd[0], run_env)}.log").read_text()
    assert f"pid {hot.pid} exit 7 cpu " in log and f"nemotron.run_step {script} a b c" in log


# A child that leaves work behind at its end, as a tracker's client does: a thread pool's worker (joined only
# after threading's exit callbacks told it to stop), a thread of its own, an atexit callback, a file never closed.
ENDING = """
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
pool = ThreadPoolExecutor(1)
pool.submit(time.sleep, 0.2)
threading.Thread(target=lambda: (time.sleep(0.5), print("thread done", flush=True))).start()
atexit.register(lambda: print("atexit ran", flush=True))
left_open = open(sys.argv[1], "w")
left_open.write("flushed at the end")
sys.exit(3)
"""


def test_a_child_ends_as_the_interpreter_would(env: dict[str, str], tmp_path: Path) -> None:
    """Without tearing down the preloaded modules, a warm child still waits for its threads and its thread pool,
    runs its atexit callbacks and flushes what it left open, and ends with its own code, as a cold one."""
    script = tmp_path / "ending.py"
    script.write_text(ENDING)
    ends = {}
    for flag in ("0", "1"):
        out_file = tmp_path / f"left-{flag}.txt"
        child, out = _run(
            _cmd(script, str(out_file)), {**env, warm.ENABLE_ENV: flag}, tmp_path, Path(os.devnull)
        )
        assert isinstance(child, warm.WarmChild if flag == "1" else subprocess.Popen)
        ends[flag] = (child.returncode, out, out_file.read_text())
    assert ends["1"] == ends["0"] == (3, "thread done\natexit ran\n", "flushed at the end")


def test_signals_the_caller_ignores_stay_ignored_as_across_exec(env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    cmd = _cmd(script)
    previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        results = [
            _run(cmd, {**env, warm.ENABLE_ENV: flag}, tmp_path, Path(os.devnull)) for flag in ("0", "1")
        ]
    finally:
        signal.signal(signal.SIGUSR2, previous)
    reports = [json.loads(out.splitlines()[0]) for _, out in results]
    assert [r["usr2_ignored"] for r in reports] == [True, True]
    assert reports[0]["sigint"] == reports[1]["sigint"]


def test_a_warm_child_dies_with_its_caller_and_stops_like_a_popen(
    env: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / "sleep.py"
    script.write_text(SLEEP)
    cmd = _cmd(script)
    caller_code = (
        "import subprocess, sys, time\n"
        "from nemotron.core.procs import start\n"
        f"child = start({cmd!r}, dict(__import__('os').environ), subprocess.DEVNULL)\n"
        "print(child.pid, type(child).__name__, flush=True)\n"
        "time.sleep(120)\n"
    )
    caller = subprocess.Popen([sys.executable, "-c", caller_code], env=env, stdout=subprocess.PIPE, text=True)
    assert caller.stdout is not None
    pid, kind = caller.stdout.readline().split()
    assert kind == "WarmChild"
    caller.kill()  # kill -9: no `finally` of the caller runs
    caller.wait()
    deadline = time.monotonic() + 15
    while procs.is_alive(int(pid)):
        assert time.monotonic() < deadline, "the warm child outlived its caller"
        time.sleep(0.1)

    child = procs.start(cmd, env, subprocess.PIPE)
    assert isinstance(child, warm.WarmChild) and child.stdout is not None
    assert child.stdout.readline() == b"up\n"
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.2)
    procs.stop_process(child, grace=10)
    cold = subprocess.Popen(
        cmd, env={**env, warm.ENABLE_ENV: "0"}, stdout=subprocess.PIPE, start_new_session=True
    )
    assert cold.stdout is not None and cold.stdout.readline() == b"up\n"
    procs.stop_process(cold, grace=10)
    assert child.returncode == cold.returncode  # the same end for SIGTERM, warm or cold
    assert not procs.is_alive(child.pid)


def test_each_import_environment_has_its_own_server() -> None:
    base = {"PATH": "/usr/bin", "HOME": "/home/me", "NEMOTRON_HOME": "/a"}
    key = warm.server_key(sys.executable, base)
    # what no import reads does not matter: the job's own variables, torch's cache dir (set by torch at run time),
    # torchrun's run id (one per run: each multi-process run would start a server of its own), PATH
    assert warm.server_key(sys.executable, {**base, "NEMOTRON_HOME": "/b", "WANDB_API_KEY": "k"}) == key
    for name, value in [("TORCHINDUCTOR_CACHE_DIR", "/tmp/x"), ("TORCHELASTIC_RUN_ID", "r1"), ("PATH", "/other/bin"),
                        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")]:  # fmt: skip
        assert warm.server_key(sys.executable, {**base, name: value}) == key, name
    # what imports read and keep does
    for name, value in [("HF_HUB_OFFLINE", "1"), ("OMP_NUM_THREADS", "1"), ("PYTHONHASHSEED", "0"),
                        ("CUDA_VISIBLE_DEVICES", "1"), ("HOME", "/elsewhere")]:  # fmt: skip
        assert warm.server_key(sys.executable, {**base, name: value}) != key, name
    assert warm.server_key("/other/python", base) != key
    # and so do the resource limits a child inherits (the server's are those of the process that started it)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft - 1, hard))
    try:
        assert warm.server_key(sys.executable, base) != key
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert warm.server_key(sys.executable, base) == key


def test_cold_unless_asked_for_another_program_or_a_folder_others_can_open(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, warm.DIR_ENV: str(runtime), warm.ENABLE_ENV: "1"}
    module = [sys.executable, "-m", "nemotron.run_step", "x.py"]
    assert warm.spawn(module, {**env, warm.ENABLE_ENV: "0"}, 0, 1, False) is None
    assert warm.spawn(module, {k: v for k, v in env.items() if k != warm.ENABLE_ENV}, 0, 1, False) is None
    assert warm.spawn([sys.executable, "-m", "json.tool"], env, 0, 1, False) is None
    assert warm.spawn(["/usr/bin/python3", *module[1:]], env, 0, 1, False) is None
    assert not list(runtime.iterdir())  # none of them started a server
    # the default folder: $XDG_RUNTIME_DIR/nemotron-warm-$UID (else under /tmp), made only this user's
    assert warm.runtime_dir({"XDG_RUNTIME_DIR": str(tmp_path)}) == tmp_path / f"nemotron-warm-{os.getuid()}"
    assert (tmp_path / f"nemotron-warm-{os.getuid()}").stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    assert warm.runtime_dir({warm.DIR_ENV: str(shared)}) is None  # others may open it: never used
    assert warm.spawn(module, {**env, warm.DIR_ENV: str(shared)}, 0, 1, False) is None
    assert not list(shared.iterdir())
    assert warm.runtime_dir({warm.DIR_ENV: str(tmp_path / "missing" / "deeper")}) is None


def test_an_idle_server_exits_and_removes_its_socket(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, warm.DIR_ENV: str(runtime), "NEMOTRON_WARM_IDLE_S": "1", warm.ENABLE_ENV: "1"}
    script = tmp_path / "ok.py"
    script.write_text("print('ok')\n")
    cmd = _cmd(script)
    try:
        procs.start(cmd, env, subprocess.DEVNULL).wait(60)
        folder = _servers(env)
        (lock,) = folder.glob("*.lock")
        deadline = time.monotonic() + 180
        while not lock.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        pid = int(lock.read_text())
        while procs.is_alive(pid, "nemotron.warm"):
            assert time.monotonic() < deadline, "the idle server did not exit"
            time.sleep(0.2)
        assert not list(folder.glob("*.sock"))
        (folder / "lost.lock").write_text("")  # a server that lost the race to another wrote no pid
        assert warm.stop(folder) == 0  # nothing left to stop
    finally:
        _stop_servers(env)


def test_a_child_whose_server_is_killed_is_waited_for_until_it_ends(tmp_path: Path) -> None:
    """No exit code can come from a killed server: the caller waits for the child's pid to go, then says 1."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, warm.DIR_ENV: str(runtime), warm.ENABLE_ENV: "1"}
    script = tmp_path / "sleep.py"
    script.write_text(SLEEP)
    cmd = _cmd(script)
    try:
        first = procs.start(_cmd(tmp_path / "missing.py"), env, subprocess.DEVNULL)
        first.wait(120)
        _wait_for_server(env, cmd)
        child = procs.start(cmd, env, subprocess.PIPE)
        assert isinstance(child, warm.WarmChild) and child.stdout is not None
        assert child.stdout.readline() == b"up\n"
        _stop_servers(env)  # SIGKILL: it tells no one
        time.sleep(1)
        started = time.monotonic()
        assert (
            child.poll() is None and time.monotonic() - started < 1
        )  # the child runs on; poll does not block
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(0.5)
        os.killpg(child.pid, signal.SIGKILL)
        assert child.wait(30) == 1
        assert not procs.is_alive(child.pid, "nemotron.warm")
    finally:
        _stop_servers(env)


def _cli(env: dict[str, str], *args: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *flags, "-m", "nemotron", *args], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _forwarded(env: dict[str, str], args: str) -> int:
    """How many `python -m nemotron ARGS` the warm server ran for `env`, from its log."""
    log = _servers(env) / f"{warm.server_key(sys.executable, env)}.log"
    return sum(
        line.split(": python -m ", 1)[-1].startswith(f"nemotron {args}")
        for line in log.read_text().splitlines()
    )


def test_the_cli_forked_warm_prints_and_exits_as_it_does_cold(
    env: dict[str, str], tmp_path: Path, fixture_steps: Path
) -> None:
    """NEMOTRON_WARM_CLI=1 with no terminal: `python -m nemotron` runs in a warm child, with its own stdout and
    stderr, its exit code and nothing else changed; `-X` options keep it in the caller."""
    cli_env = {**env, "NEMOTRON_HOME": str(tmp_path / "home"), "NEMOTRON_STEPS_PATH": str(fixture_steps),
               "COLUMNS": "200", "NEMOTRON_WARM_CLI": "1"}  # fmt: skip
    cold_env = {**cli_env, "NEMOTRON_WARM_CLI": "0"}
    for args in (
        ("steps", "list"),
        ("steps", "run", "nosuch", "-c", "tiny"),
        ("steps", "show", "test/count"),
    ):
        before = _forwarded(cli_env, " ".join(args))
        hot, cold = _cli(cli_env, *args), _cli(cold_env, *args)
        assert (hot.returncode, hot.stdout, hot.stderr) == (cold.returncode, cold.stdout, cold.stderr), args
        assert _forwarded(cli_env, " ".join(args)) == before + 1, (
            args
        )  # the first ran in the warm server, not the other
    assert cold.returncode == 0 and "test/count" in cold.stdout
    bad = _cli(cli_env, "steps", "run", "nosuch", "-c", "tiny")
    assert bad.returncode == 2 and bad.stdout == "" and "unknown step 'nosuch'" in bad.stderr
    before = _forwarded(cli_env, "steps list")
    measured = _cli(cli_env, "steps", "list", flags=("-X", "importtime"))
    assert measured.returncode == 0 and "import time:" in measured.stderr and "| typer" in measured.stderr
    assert _forwarded(cli_env, "steps list") == before


def _attached_run_ended(env: dict[str, str], home: Path, ending: signal.Signals) -> tuple[int, str]:
    """An attached local run of a long step, its caller sent `ending` once the step runs: the caller's exit code
    and the job's state a few seconds later, once the step is gone."""
    long_count = (
        "steps",
        "run",
        "test/count",
        "-c",
        "tiny",
        "trainer.max_steps=1000",
        "trainer.sleep_s=0.05",
    )
    caller = subprocess.Popen([sys.executable, "-m", "nemotron", *long_count], env={**env, "NEMOTRON_HOME": str(home)},
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not list(home.glob("jobs/*/metrics.jsonl")):
        assert time.monotonic() < deadline and caller.poll() is None, caller.communicate()
        time.sleep(0.1)
    (job_dir,) = (home / "jobs").iterdir()
    step_pid = json.loads((job_dir / "status.json").read_text())["pid"]
    caller.send_signal(ending)
    _, err = caller.communicate(timeout=60)
    assert "Traceback" not in err, err
    deadline = time.monotonic() + 30
    while procs.is_alive(step_pid):  # the step goes with its CLI
        assert time.monotonic() < deadline, f"{ending.name}: the step outlived its CLI"
        time.sleep(0.1)
    time.sleep(1)
    return caller.returncode, json.loads((job_dir / "status.json").read_text())["state"]


def test_a_forwarded_cli_gets_ctrl_c_and_dies_with_its_caller(
    env: dict[str, str], tmp_path: Path, fixture_steps: Path
) -> None:
    """SIGINT to the caller reaches the warm CLI, which cancels its attached run and exits 130; SIGKILL of the
    caller kills the warm CLI at once, without a cancel: each as a cold CLI ends."""
    cli_env = {**env, "NEMOTRON_STEPS_PATH": str(fixture_steps), "NEMOTRON_WARM_CLI": "1"}
    for ending in (signal.SIGINT, signal.SIGKILL):
        before = _forwarded(cli_env, "steps run test/count")
        hot = _attached_run_ended(cli_env, tmp_path / f"hot-{ending.name}", ending)
        assert _forwarded(cli_env, "steps run test/count") == before + 1  # the CLI was a warm child
        cold = _attached_run_ended(
            {**cli_env, "NEMOTRON_WARM_CLI": "0"}, tmp_path / f"cold-{ending.name}", ending
        )
        assert hot == cold, ending.name
    assert cold == (
        -signal.SIGKILL,
        "running",
    )  # killed: nothing ran to say otherwise (jobs status reconciles)
