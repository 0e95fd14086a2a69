"""How the listings grow with a home's history (issue 22): `artifacts ls`, `artifacts gc`, `artifacts lineage`,
`jobs ls` and `steps list` at growing sizes, against `python -c "import typer"` measured in the same run.

Run: python bench/scale.py                     (100 / 1k / 10k / 100k artifacts, 100 / 1k / 10k jobs, 10 / 100 /
                                                1,000 user steps; 5 runs each; ~5 min on 2 cores)
     python bench/scale.py --artifacts 100 10000 --jobs 100 2000 --steps 10 --runs 3 --json out.json   (CI's size)
The states are built the project's way: artifacts by `ArtifactStore.register` (a sweep: one data artifact, then 50
outputs made from it in one call, over 10 names, plus a 15-round self-rewarding loop), jobs by copying a record
`create_job_dir` wrote (as users rsync them in: the first `jobs ls` indexes them, reported on its own row). Each
state grows from the last. Every command is a fresh `nemotron` process; commands and the peer alternate run by run,
so other load on the machine slows them alike; the table shows medians.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cli_latency import wall_s  # bench/ is sys.path[0] when run as `python bench/scale.py`

ARTIFACT_COMMANDS = {
    "artifacts ls": ["artifacts", "ls"],
    "artifacts ls --json": ["artifacts", "ls", "--json"],
    "artifacts ls --type checkpoint_hf": ["artifacts", "ls", "--type", "checkpoint_hf"],
    "artifacts gc (dry run)": ["artifacts", "gc"],
    "artifacts lineage (15-round self-rewarding loop)": ["artifacts", "lineage", "loop_policy:latest"],
}
JOB_COMMANDS = {
    "jobs ls": ["jobs", "ls"],
    "jobs ls --step sft --json": ["jobs", "ls", "--step", "sft", "--json"],
}
ALL_JOBS = ("jobs ls --all --json", ["jobs", "ls", "--all", "--json"])  # linear in its output by design
STEPS_COMMAND = ("steps list", ["steps", "list"])
PEER = "python -c 'import typer' (the peer)"
FIRST_JOBS_LS = "jobs ls, first after the dirs were copied in (indexes them; one run)"
# Listings whose output is a page: their time must not grow with the history (tests/bench/test_scale.py).
PAGED = [*ARTIFACT_COMMANDS, *JOB_COMMANDS]
NAMES = ["tiny_sft_policy", "tiny_rm", "tiny_rlhf_policy", "tiny_ppo_policy", "tiny_reinforce_policy", "tiny_dpo_policy",
         "sweep_policy", "judge_rm", "eval_scores", "tiny_sft_data"]  # fmt: skip
JOB_STEPS = ["sft", "rl/rlhf", "rm/train", "data/prep", "rl/ppo"]


def grow_artifacts(home: Path, total: int) -> None:
    """Register artifacts until the store holds `total` (the loop's 16 included)."""
    from nemotron.artifacts.store import ArtifactStore

    store = ArtifactStore(home / "artifacts")
    src = home / "outputs" / "weights.json"
    if not src.exists():
        src.parent.mkdir(parents=True)
        src.write_text('{"w": [0.1, 0.2]}\n')
        prev = store.register([("loop_policy", "checkpoint_hf", src, {"step": "sft"})], "sft-loop-0")[0]
        for k in range(1, 16):  # each round consumes the last as policy AND as judge
            prev = store.register([("loop_policy", "checkpoint_hf", src, {"step": "rl/rlhf"})], f"rl-loop-{k}",
                                  parents=[("policy", prev.id), ("judge", prev.id)])[0]  # fmt: skip
    have = store.count()
    while have < total:
        data = store.register([("tiny_sft_data", "sft_jsonl", src, {"step": "data/prep"})], f"data-{have}")[0]
        n = min(50, total - have - 1)
        outs = [(NAMES[i % 9], "checkpoint_hf" if i % 3 else "reward_model_hf", src, {"step": JOB_STEPS[i % 5]})
                for i in range(n)]  # fmt: skip
        if outs:
            store.register(outs, f"sweep-{have}", parents=[("data", data.id)])
        have += 1 + n


def template_job(home: Path) -> Path:
    """A job record as `nemotron steps run data/prep -c tiny` writes it (the step is not run)."""
    from nemotron.catalog import Catalog
    from nemotron.compile import compile_job
    from nemotron.jobs.dirs import update_status
    from nemotron.launch import submit
    from nemotron.launch.job_dir import create_job_dir

    job = compile_job(Catalog(), "data/prep", "tiny", dry_run=True)
    d = create_job_dir(job, submit.rendered_launch(job))
    update_status(d, state="succeeded", exit_code=0, ended_at="2026-01-01T00:00:00+00:00")
    kept = home.parent / "template-job" / d.name  # out of the home: the copies are the jobs
    kept.parent.mkdir()
    return Path(shutil.move(d, kept))


def job_id(i: int) -> str:
    """The i-th job: steps interleaved, one minute apart, so id order is not time order."""
    t = time.gmtime(1_700_000_000 + 60 * i)
    return f"{JOB_STEPS[i % 5].replace('/', '-')}-{time.strftime('%Y%m%d-%H%M%S', t)}-{i:04x}"


def grow_jobs(home: Path, template: Path, total: int) -> str:
    """Copy the template until the home holds `total` job dirs; the newest job's id."""
    root = home / "jobs"
    have = sum(1 for _ in root.iterdir()) if root.is_dir() else 0
    text = (template / "job.yaml").read_text()
    for i in range(have, total):
        jid = job_id(i)
        d = root / jid
        shutil.copytree(template, d)
        created = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(1_700_000_000 + 60 * i))
        record = text.replace(template.name, jid).replace("step: data/prep", f"step: {JOB_STEPS[i % 5]}", 1)
        (d / "job.yaml").write_text(
            re.sub(r"(?m)^created_at: .*$", f"created_at: '{created}'", record, count=1)
        )
    return job_id(total - 1)


def user_steps(root: Path, n: int) -> Path:
    """A $NEMOTRON_STEPS_PATH root of `n` steps (copies of a shipped manifest under other ids)."""
    from nemotron.core.paths import bundled_root

    text = (bundled_root() / "manifests" / "data" / "prep.toml").read_text()
    for i in range(n):
        m = root / "manifests" / "user" / f"s{i}.toml"
        if not m.exists():
            m.parent.mkdir(parents=True, exist_ok=True)
            m.write_text(text.replace('id = "data/prep"', f'id = "user/s{i}"'))
    return root


def wall_times(
    cases: dict[str, list[str]], env: dict[str, str], cwd: Path, runs: int
) -> dict[str, list[float]]:
    """Wall seconds of each run of each command and of the peer, alternating run by run; one unmeasured warm-up."""
    all_cases = {**{k: ["-m", "nemotron", *v] for k, v in cases.items()}, PEER: ["-c", "import typer"]}
    for args in all_cases.values():
        wall_s(args, env, cwd)
    times: dict[str, list[float]] = {k: [] for k in all_cases}
    for _ in range(runs):
        for name, args in all_cases.items():
            times[name].append(wall_s(args, env, cwd))
    return times


def measure(
    artifact_sizes: list[int], job_sizes: list[int], step_sizes: list[int], runs: int
) -> dict[str, object]:
    runs_s: dict[str, dict[str, list[float]]] = {}
    checks: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="nemotron-scale-") as tmp:
        home = Path(tmp) / "home"
        env = {
            **os.environ,
            "NEMOTRON_HOME": str(home),
            "COLUMNS": "200",
            "NEMOTRON_CACHE_DIR": str(Path(tmp) / "cache"),
        }
        os.environ.update(NEMOTRON_HOME=str(home), NEMOTRON_CACHE_DIR=str(Path(tmp) / "cache"))
        for n in artifact_sizes:
            grow_artifacts(home, n)
            for k, v in wall_times(ARTIFACT_COMMANDS, env, Path(tmp), runs).items():
                runs_s.setdefault(k, {})[f"{n} artifacts"] = v
        template = template_job(home)
        for n in job_sizes:
            newest = grow_jobs(home, template, n)
            (home / "jobs.sqlite").unlink(missing_ok=True)
            runs_s.setdefault(FIRST_JOBS_LS, {})[f"{n} jobs"] = [
                wall_s(["-m", "nemotron", "jobs", "ls"], env, Path(tmp))
            ]
            cases = {**JOB_COMMANDS, ALL_JOBS[0]: ALL_JOBS[1]}
            for k, v in wall_times(cases, env, Path(tmp), runs).items():
                runs_s.setdefault(k, {})[f"{n} jobs"] = v
            listed = subprocess.run([sys.executable, "-m", "nemotron", "jobs", "ls", "--json", "--limit", "5"], env=env,
                                    capture_output=True, text=True, check=True, cwd=tmp).stdout  # fmt: skip
            checks[f"newest job first at {n} jobs"] = json.loads(listed)[0]["job_id"] == newest
        for n in step_sizes:
            root = user_steps(Path(tmp) / "steps", n)
            senv = {**env, "NEMOTRON_STEPS_PATH": str(root)}
            for k, v in wall_times({STEPS_COMMAND[0]: STEPS_COMMAND[1]}, senv, Path(tmp), runs).items():
                runs_s.setdefault(k, {})[f"{n} user steps"] = v
    return {"runs": runs, "cpus": os.cpu_count(), "checks": checks, "paged": PAGED,
            "median": {k: {n: statistics.median(v) for n, v in by.items()} for k, by in runs_s.items()},
            "best": {k: {n: min(v) for n, v in by.items()} for k, by in runs_s.items()}}  # fmt: skip


def table(data: dict[str, object]) -> str:
    """One markdown table per axis (artifacts, jobs, user steps): median wall seconds at each size, the growth from
    the smallest to the largest, and the peer measured between them."""
    medians: dict[str, dict[str, float]] = data["median"]  # type: ignore[assignment]
    lines = [f"median of {data['runs']} runs, {data['cpus']} CPUs, {sys.executable}"]
    axes: dict[str, list[str]] = {}
    for by_size in medians.values():
        for size in by_size:
            unit = size.split(" ", 1)[1]
            if size not in axes.setdefault(unit, []):
                axes[unit].append(size)
    for unit, sizes in axes.items():
        lines += ["", f"| {unit} | {' | '.join(f'{int(s.split()[0]):,}' for s in sizes)} | growth |",
                  f"|---|{'---|' * len(sizes)}---|"]  # fmt: skip
        for name, by_size in sorted(medians.items(), key=lambda kv: kv[0] == PEER):
            if not all(s in by_size for s in sizes):
                continue
            walls = " | ".join(f"{by_size[s]:.2f} s" for s in sizes)
            label = f"`{name}`" if name == PEER else f"`nemotron {name}`"
            lines.append(f"| {label} | {walls} | {by_size[sizes[-1]] / by_size[sizes[0]]:.1f}x |")
    checks = data["checks"]
    assert isinstance(checks, dict)
    lines += ["", *(f"{k}: {'yes' if v else 'NO'}" for k, v in checks.items())]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", type=int, nargs="+", default=[100, 1_000, 10_000, 100_000])
    parser.add_argument("--jobs", type=int, nargs="+", default=[100, 1_000, 10_000])
    parser.add_argument("--steps", type=int, nargs="*", default=[10, 100, 1_000])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the medians here")
    parser.add_argument(
        "--table-from", type=Path, help="print the table of an earlier --json, measure nothing"
    )
    args = parser.parse_args()
    if args.table_from:
        print(table(json.loads(args.table_from.read_text())))
        return
    data = measure(sorted(args.artifacts), sorted(args.jobs), sorted(args.steps), args.runs)
    if args.json:
        args.json.write_text(json.dumps(data, indent=2))
    print(table(data))


if __name__ == "__main__":
    main()
