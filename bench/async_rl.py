"""Asynchronous RL against synchronous (issue 46, docs/benchmarks.md "Asynchronous RL"): the same built-in
`rl/reinforce` run with the generator in the trainer's process (sync) and in its own process, one update behind
(async, `reinforce.async_grpo.max_trajectory_age_steps=1`), alternating, in fresh homes, on this machine in the
same run. Prints each run's median seconds per step (`step_time`, the first two steps left out: they hold the
generator's start), its phases and, for async, the seconds each side waited on the other; then async/sync.

Run: python bench/async_rl.py                      (rl/reinforce -c tiny, 20 steps, 1 run of each)
     python bench/async_rl.py --runs 2 --steps 30 --max-new-tokens 24 --device cuda --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ASYNC = [
    "reinforce.async_grpo.enabled=true",
    "reinforce.async_grpo.max_trajectory_age_steps=1",
    "reinforce.use_importance_sampling_correction=true",
]


def run_once(root: Path, asynchronous: bool, args: argparse.Namespace) -> dict[str, object]:
    home = Path(tempfile.mkdtemp(dir=root))
    step = ["steps", "run", "rl/reinforce", "-c", "tiny", f"trainer.max_steps={args.steps}", "eval.num_prompts=0",
            f"generation.max_new_tokens={args.max_new_tokens}", f"trainer.num_prompts_per_step={args.prompts}",
            f"runtime.device={args.device}"]  # fmt: skip
    env = {**os.environ, "NEMOTRON_HOME": str(home)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "nemotron", *step, *(ASYNC if asynchronous else [])],
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"the run failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    (metrics,) = home.glob("jobs/*/metrics.jsonl")
    rows = [r for r in map(json.loads, metrics.read_text().splitlines()) if "step_time" in r][2:]

    def median(key: str) -> float:
        return round(statistics.median(r[key] for r in rows), 4)

    out: dict[str, object] = {"mode": "async" if asynchronous else "sync", "wall_s": round(wall, 1)}
    out.update({k: median(k) for k in ("step_time", "generate", "reward", "logprobs", "train")})
    if asynchronous:
        out.update({k: median(k) for k in ("generator_idle_s", "trainer_idle_s", "max_trajectory_age")})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1, help="runs of each mode, alternating")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=16, help="trainer.num_prompts_per_step")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="runtime.device")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.runs):
            for asynchronous in (False, True):
                results.append(run_once(Path(tmp), asynchronous, args))
                print(json.dumps(results[-1]), flush=True)
    per = {
        m: statistics.median(float(str(r["step_time"])) for r in results if r["mode"] == m)
        for m in ("sync", "async")
    }
    load = os.getloadavg()[0]
    summary = {
        "sync_s_per_step": round(per["sync"], 4),
        "async_s_per_step": round(per["async"], 4),
        "async_over_sync": round(per["async"] / per["sync"], 3),
        "cores": os.cpu_count(),
        "load_average_at_end": round(load, 2),
    }
    print(json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps({"runs": results, **summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
