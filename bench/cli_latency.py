"""Wall time of the CLI commands a user runs most, against `python -c "import typer"` measured in the same run.

Run: python bench/cli_latency.py              (9 runs of each, alternating, median wall)
     python bench/cli_latency.py --runs 21
Each command is a fresh `nemotron` process with an empty NEMOTRON_HOME, as a user's first call. The commands and
the peer alternate run by run, so other load on the machine slows them alike. Target (issue 17): every command
under 0.3 s median on an idle 2-core machine; the ratio to the peer is what carries across machines.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS: dict[str, list[str]] = {
    "nemotron steps list": ["-m", "nemotron", "steps", "list"],
    "nemotron steps show rl/rlhf": ["-m", "nemotron", "steps", "show", "rl/rlhf"],
    "nemotron steps run rl/rlhf -c tiny --dry-run": [
        "-m",
        "nemotron",
        "steps",
        "run",
        "rl/rlhf",
        "-c",
        "tiny",
        "--dry-run",
    ],
}
PEER = ("python -c 'import typer' (the peer)", ["-c", "import typer"])


def wall_s(args: list[str], env: dict[str, str], cwd: Path) -> float:
    """Wall seconds of `python ARGS`; SystemExit with the end of its stderr when it fails."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], capture_output=True, env=env, cwd=cwd, check=False)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{args} failed with exit {done.returncode}: {done.stderr.decode()[-800:]}")
    return took


def measure(runs: int) -> dict[str, float]:
    """Median wall seconds per command, the peer included."""
    cases = [*COMMANDS.items(), PEER]
    times: dict[str, list[float]] = {name: [] for name, _ in cases}
    with tempfile.TemporaryDirectory(prefix="nemotron-cli-bench-") as tmp:
        env = {**os.environ, "NEMOTRON_HOME": str(Path(tmp) / "home"), "COLUMNS": "200"}
        for _name, args in cases:  # warm the OS file cache once; not counted
            wall_s(args, env, Path(tmp))
        for _ in range(runs):
            for name, args in cases:
                times[name].append(wall_s(args, env, Path(tmp)))
            shutil.rmtree(Path(tmp) / "home", ignore_errors=True)
    return {name: statistics.median(values) for name, values in times.items()}


def table(medians: dict[str, float], runs: int) -> str:
    peer = medians[PEER[0]]
    lines = [f"median of {runs} runs, {os.cpu_count()} CPUs, {sys.executable}", "",
             "| command | median wall | vs `import typer` |", "|---|---|---|"]  # fmt: skip
    lines += [f"| `{name}` | {s * 1000:.0f} ms | {s / peer:.1f}x |" for name, s in medians.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    print(table(measure(args.runs), args.runs))


if __name__ == "__main__":
    main()
