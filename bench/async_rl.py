"""Asynchronous RL against synchronous (issue 46, docs/benchmarks.md "Asynchronous RL"): the same built-in
`rl/reinforce` run with the generator in the trainer's process (sync) and in its own process, one update behind
(async, `reinforce.async_grpo.max_trajectory_age_steps=1`), alternating, in fresh homes, every run cold
(NEMOTRON_WARM=0), on this machine in the same run. Prints each run's median seconds per step (`step_time`, the first
two steps left out: they hold the generator's start, and vLLM's engine start) with its phases, the start cost apart
(`start_s`: those two steps' seconds over two median steps) and, for async, the seconds each side waited on the
other; then async/sync.

`--generator` picks the sampler, the same in both modes: `torch` (our sampler, the shipped tiny GPT-2 policy) or
`vllm` (`generation.backend=vllm`: vLLM in the trainer's process when sync, in the generator process when async).
vLLM runs the step with vLLM's venv's python (NEMOTRON_VLLM_VENV, else .venv-vllm; `bash scripts/bootstrap-vllm.sh`
builds it) on this checkout's src, and samples a random tiny Llama (2 layers x 64, head_dim 32: vLLM's CPU attention
refuses the GPT-2 policy's 16), which `--llama` gives the torch sampler too.

Run: python bench/async_rl.py                      (rl/reinforce -c tiny, 20 steps, 1 run of each)
     python bench/async_rl.py --runs 2 --steps 30 --max-new-tokens 24 --device cuda --json out.json
     python bench/async_rl.py --generator vllm --runs 4 --steps 30 --json out.json   (docs/benchmarks.md's figures)
     python bench/async_rl.py --generator vllm --device cuda --runs 2 --json out.json   (on a GPU)
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

ROOT = Path(__file__).resolve().parents[1]
ASYNC = [
    "reinforce.async_grpo.enabled=true",
    "reinforce.async_grpo.max_trajectory_age_steps=1",
    "reinforce.use_importance_sampling_correction=true",
]
LEFT_OUT = 2  # first steps: the generator's start (async), the vLLM engine's (first rollout)


def vllm_python() -> Path:
    """vLLM's venv's interpreter; exit 2 in one line when it is missing."""
    venv = ROOT / os.environ.get("NEMOTRON_VLLM_VENV", ".venv-vllm")
    python = venv / "bin" / "python"
    if not python.is_file():
        print(f"async_rl.py: --generator vllm runs the step with vLLM's venv, and {python} is missing: build it with "
              "`bash scripts/bootstrap-vllm.sh` or set NEMOTRON_VLLM_VENV to one", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    return python


def tiny_llama(python: Path, root: Path, env: dict[str, str]) -> Path:
    """A random tiny Llama (the shipped tokenizer), written once for every run."""
    out = root / "llama"
    done = subprocess.run([str(python), "-m", "nemotron.models.tiny", "--family", "llama", str(out)],
                          env=env, capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"writing the tiny Llama failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return out


def run_once(
    root: Path, asynchronous: bool, args: argparse.Namespace, python: Path, policy: Path | None
) -> dict[str, object]:
    home = Path(tempfile.mkdtemp(dir=root))
    step = ["steps", "run", "rl/reinforce", "-c", "tiny", f"trainer.max_steps={args.steps}", "eval.num_prompts=0",
            f"generation.max_new_tokens={args.max_new_tokens}", f"trainer.num_prompts_per_step={args.prompts}",
            f"runtime.device={args.device}", f"generation.backend={args.generator}"]  # fmt: skip
    if policy is not None:
        step.append(f"inputs.policy={policy}")
    if args.threads:  # the trainer's torch threads; the generator process takes the same count
        step.append(f"runtime.num_threads={args.threads}")
    env = environment(home)
    started = time.monotonic()
    done = subprocess.run(
        [str(python), "-m", "nemotron", *step, *(ASYNC if asynchronous else [])],
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"the run failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    (metrics,) = home.glob("jobs/*/metrics.jsonl")
    every = [r for r in map(json.loads, metrics.read_text().splitlines()) if "step_time" in r]
    rows = every[LEFT_OUT:]

    def median(key: str) -> float:
        return round(float(statistics.median(r[key] for r in rows)), 4)

    out: dict[str, object] = {"mode": "async" if asynchronous else "sync", "wall_s": round(wall, 1)}
    out.update({k: median(k) for k in ("step_time", "generate", "reward", "logprobs", "train")})
    first = sum(float(r["step_time"]) for r in every[:LEFT_OUT])
    out["start_s"] = round(first - LEFT_OUT * median("step_time"), 2)
    if asynchronous:
        out.update({k: median(k) for k in ("generator_idle_s", "trainer_idle_s", "max_trajectory_age")})
    return out


def environment(home: Path) -> dict[str, str]:
    """Each run in its own home, cold (no warm server: both modes pay the same start), on this checkout's src."""
    path = os.environ.get("PYTHONPATH")
    src = str(ROOT / "src") + (os.pathsep + path if path else "")
    return {**os.environ, "NEMOTRON_HOME": str(home), "NEMOTRON_WARM": "0", "PYTHONPATH": src}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--generator", choices=("torch", "vllm"), default="torch", help="generation.backend")
    parser.add_argument("--llama", action="store_true", help="sample a random tiny Llama (always with vllm)")
    parser.add_argument("--runs", type=int, default=1, help="runs of each mode, alternating")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=16, help="trainer.num_prompts_per_step")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="runtime.device")
    parser.add_argument("--threads", type=int, help="runtime.num_threads (default: the tiny preset's 1)")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    if args.steps <= LEFT_OUT:
        parser.error(f"--steps must exceed the {LEFT_OUT} start steps left out")
    python = vllm_python() if args.generator == "vllm" else Path(sys.executable)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        policy = None
        if args.generator == "vllm" or args.llama:
            policy = tiny_llama(python, Path(tmp), environment(Path(tmp)))
        for _ in range(args.runs):
            for asynchronous in (False, True):
                results.append(run_once(Path(tmp), asynchronous, args, python, policy))
                print(json.dumps(results[-1]), flush=True)

    def per(mode: str, key: str) -> float:
        return statistics.median(float(str(r[key])) for r in results if r["mode"] == mode)

    summary = {
        "generator": args.generator,
        "policy": "tiny llama" if policy else "shipped tiny",
        "sync_s_per_step": round(per("sync", "step_time"), 4),
        "async_s_per_step": round(per("async", "step_time"), 4),
        "async_over_sync": round(per("async", "step_time") / per("sync", "step_time"), 3),
        # each alternating pair's own ratio: how far the machine's load moved it
        "async_over_sync_by_pair": [
            round(float(str(a["step_time"])) / float(str(b["step_time"])), 3)
            for b, a in zip(results[::2], results[1::2], strict=True)
        ],
        "sync_start_s": round(per("sync", "start_s"), 2),
        "async_start_s": round(per("async", "start_s"), 2),
        "cores": os.cpu_count(),
        "load_average_at_end": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps({"runs": results, **summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
