"""Measure the wall time, CPU time and peak memory of every tiny preset, as a user runs it, and record them:
docs/figures/tiny_resources.json (with the date, the CPU, the load and the command) and the table of
docs/troubleshooting.md between its markers, rendered from that file (a test checks the page shows it).

    python scripts/tiny_resources.py          # about 4 minutes on 2 cores

Each step runs on its own (`nemotron steps run STEP -c tiny`) in one fresh $NEMOTRON_HOME, in pipeline
order; the figures come from wait4(), as GNU time's do: CPU seconds of the process tree, the peak RSS of its
largest process. rm/serve is timed from start to its first answer, then serves 200 /score requests and
stops on SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from nemotron.docs.generate import measured_on, splice, write_figures

REPO = Path(__file__).resolve().parents[1]
FIGURES = REPO / "docs" / "figures" / "tiny_resources.json"
PAGE = REPO / "docs" / "troubleshooting.md"
STEPS = ("data/prep", "sft", "rm/train", "rl/reinforce", "rl/ppo", "rl/rlhf", "rl/dpo", "eval/policy")
BEGIN, END = "<!-- tiny-resources:begin -->", "<!-- tiny-resources:end -->"
SERVE_REQUESTS = 200


def _wait(process: subprocess.Popen[bytes], started: float) -> dict[str, Any]:
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return {
        "exit_code": process.returncode,
        "wall_s": round(time.monotonic() - started, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_mib": round(usage.ru_maxrss / 1024),
    }


def measure_step(step: str, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "nemotron", "steps", "run", step, "-c", "tiny"],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    figures = _wait(process, started)
    if figures["exit_code"] != 0:
        raise SystemExit(f"{step} failed (exit {figures['exit_code']}); run it by hand to see why")
    return {"command": f"nemotron steps run {step} -c tiny", **figures}


def measure_serve(env: dict[str, str], cwd: Path, home: Path) -> dict[str, Any]:
    started = time.monotonic()
    argv = [sys.executable, "-m", "nemotron", "steps", "run", "rm/serve", "-c", "tiny", "server.port=0"]
    process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not list(home.glob("jobs/rm-serve-*/server.json")):
        if process.poll() is not None or time.monotonic() - started > 300:
            raise SystemExit("rm/serve did not start")
        time.sleep(0.1)
    announced = next(home.glob("jobs/rm-serve-*/server.json"))
    url = json.loads(announced.read_text())["url"]
    ready = time.monotonic() - started
    body = json.dumps(
        {"sentences": ["the movie was great", "the movie was awful", "the stay was fine"]}
    ).encode()
    for _ in range(SERVE_REQUESTS):
        request = urllib.request.Request(url + "/score", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
    step_pid = json.loads((announced.parent / "status.json").read_text())["pid"]
    os.kill(int(step_pid), signal.SIGTERM)  # as `nemotron jobs cancel` does; the attached runner then ends
    figures = _wait(process, started)
    return {
        "command": "nemotron steps run rm/serve -c tiny server.port=0",
        "ready_s": round(ready, 1),
        **figures,
    }


def render(record: dict[str, Any]) -> str:
    lines = [
        f"Measured {record['date']} on {record['cpu']} ({record['cores']} cores; load average "
        f"{record['load']:.1f} at the start) by `{record['script']}`: each command on its own, in one fresh "
        "`$NEMOTRON_HOME`, in this order. CPU s: user + system time of the process tree; peak RSS: its "
        "largest process (an RL step's sibling reward server is a process of its own). On a machine busy "
        "with other work the wall times grow, the CPU seconds much less.",
        "",
        "| command | wall | CPU s | peak RSS |",
        "|---|---|---|---|",
    ]
    for r in record["steps"]:
        lines.append(
            f"| `{r['command']}` | {r['wall_s']:.1f} s | {r['cpu_s']:.1f} | {r['peak_rss_mib']} MiB |"
        )
    s = record["serve"]
    lines.append(
        f"| `{s['command']}` | answers after {s['ready_s']:.1f} s; {s['wall_s']:.1f} s with "
        f"{record['serve_requests']} requests and the stop | {s['cpu_s']:.1f} | {s['peak_rss_mib']} MiB |"
    )
    return "\n".join(lines)


def update_page(page: str, record: dict[str, Any]) -> str:
    return splice(page, BEGIN, END, render(record) + "\n", str(PAGE))


def main() -> int:
    machine = measured_on()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        env = {**os.environ, "NEMOTRON_HOME": str(home)}
        env.pop("NEMOTRON_ENV_FILE", None)
        steps = [measure_step(step, env, Path(tmp)) for step in STEPS]
        serve = measure_serve(env, Path(tmp), home)
    record = {
        **machine,
        "script": "python scripts/tiny_resources.py",
        "serve_requests": SERVE_REQUESTS,
        "steps": steps,
        "serve": serve,
    }
    write_figures(FIGURES, record, PAGE, update_page(PAGE.read_text(), record))
    print(render(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
