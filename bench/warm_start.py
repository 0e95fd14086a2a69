"""Warm starts against cold ones (docs/executors.md, "Local runs start warm"): the same tiny local step run cold
(NEMOTRON_WARM=0: the step and its reward server each import torch and transformers) and warm (both fork from the
warm server), alternating, in fresh homes, on this machine in the same run. Prints each run's wall seconds and the
CPU seconds of the whole process tree (the CLI, the step, its reward server; a warm child's CPU is read from the warm
server's log), then the warm/cold ratios of the medians, and checks that every run wrote the same policy.

Run: python bench/warm_start.py                    (rl/reinforce -c tiny, 2 steps; 3 cold and 3 warm runs)
     python bench/warm_start.py --runs 1 --json out.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEP = ["steps", "run", "rl/reinforce", "-c", "tiny", "trainer.max_steps=2", "eval.num_prompts=0"]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _warm_cpu(folder: Path, offset: dict[Path, int]) -> float:
    """CPU seconds of the children the warm servers logged since the last call."""
    total = 0.0
    for log in folder.glob("*.log"):
        text = log.read_text()
        total += sum(float(x) for x in re.findall(r" cpu ([0-9.]+) s:", text[offset.get(log, 0) :]))
        offset[log] = len(text)
    return total


def run_once(root: Path, warm: bool, folder: Path, offset: dict[Path, int]) -> dict[str, object]:
    home = Path(tempfile.mkdtemp(dir=root))
    env = {**os.environ, "NEMOTRON_HOME": str(home), "NEMOTRON_WARM": "1" if warm else "0",
           "NEMOTRON_WARM_DIR": str(folder)}  # fmt: skip
    cpu, started = _children_cpu(), time.monotonic()
    done = subprocess.run([sys.executable, "-m", "nemotron", *STEP], env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"the run failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    time.sleep(0.5)  # the warm server logs its children as it reaps them
    used = _children_cpu() - cpu + _warm_cpu(folder, offset)
    (policy,) = home.glob("jobs/*/outputs/policy/model.safetensors")
    digest = hashlib.sha256(policy.read_bytes()).hexdigest()[:16]
    return {
        "mode": "warm" if warm else "cold",
        "wall_s": round(wall, 2),
        "cpu_s": round(used, 2),
        "policy": digest,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of each mode (default 3)")
    parser.add_argument("--json", type=Path, help="write the runs and the ratios here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nemotron-warm-bench-") as tmp:
        root = Path(tmp)
        folder = root / "servers"
        folder.mkdir(mode=0o700)
        offset: dict[Path, int] = {}
        first = run_once(
            root, True, folder, offset
        )  # not counted: it starts the warm server (one start is cold)
        deadline = time.monotonic() + 120
        while not list(folder.glob("*.sock")):
            if time.monotonic() > deadline:
                raise SystemExit("the warm server did not start within 120 s")
            time.sleep(0.2)
        _warm_cpu(folder, offset)
        runs: list[dict[str, object]] = []
        for _ in range(args.runs):
            runs += [run_once(root, False, folder, offset), run_once(root, True, folder, offset)]
        runs.append({**first, "mode": "first"})
        subprocess.run([sys.executable, "-m", "nemotron.warm", "stop"], env={**os.environ, "NEMOTRON_WARM_DIR":
                       str(folder)}, capture_output=True)  # fmt: skip
    print(f"{'mode':<6} {'wall s':>8} {'CPU s':>8}  policy")
    for r in runs:
        print(f"{r['mode']:<6} {r['wall_s']:>8} {r['cpu_s']:>8}  {r['policy']}")
    median = {
        (mode, key): statistics.median(float(r[key]) for r in runs if r["mode"] == mode)  # type: ignore[arg-type]
        for mode in ("cold", "warm")
        for key in ("wall_s", "cpu_s")
    }
    ratios = {key: round(median["warm", key] / median["cold", key], 3) for key in ("wall_s", "cpu_s")}
    same = len({r["policy"] for r in runs}) == 1  # the first run's too
    print(f"warm/cold (medians): wall {ratios['wall_s']}, CPU {ratios['cpu_s']}; same policy bytes: {same}")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "ratios": ratios, "same_policy": same}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
