"""Start-up of the CLI commands a user runs most, as ratios to `python -c "import typer"` measured in the same run.

Run: python bench/cli_latency.py                         (9 runs of each, interleaved, median wall)
     python bench/cli_latency.py --runs 21 --write-docs  (and put the table in docs/benchmarks.md between its markers)
     python bench/cli_latency.py --before /tmp/main      (also the code of another checkout, in the same run:
                                                          `git archive main | tar -x -C /tmp/main` makes one)
     python bench/cli_latency.py --check                 (exit 1 when a command misses its target)
Each command is a fresh `python -m nemotron` process with an empty NEMOTRON_HOME, as a user's call; the manifest
cache and the cache of record files that validated are warm, as after a user's first call (one row measures a first
call, with no cache). Every process, the peer's included, reads its modules' bytecode from a cache that the uncounted
first run wrote (PYTHONPYCACHEPREFIX, in a temporary directory), as an installed package does: with
PYTHONDONTWRITEBYTECODE set (as in some CI shells), nemotron's own modules would be compiled from source on every call
while typer's come from its installed .pyc files, and that compile, about a third of a dry run, is no part of what a
user waits for. Within each run the commands, the peer and the `--before` code run one after the other, so other
load on the machine slows them alike; the ratio to the peer is what carries across machines. Targets (issue 33):
the listing (its --tree too), a step and the help at most 2x the peer, a dry run at most 3x (it compiles the step's
config, which the others never load); and (issue 41) a dry run at most 1.5x the dry-run floor below, in its own
column. Two rows measure floors: what typer itself adds once it runs a command (FLOOR), no typer CLI starting faster;
and that app with one pydantic model validated and YAML read and written (DRY_FLOOR), no dry run starting faster.
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
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- cli-latency:begin -->", "<!-- cli-latency:end -->"


@dataclass(frozen=True)
class Command:
    name: str
    args: list[str]  # after `python -m nemotron`
    target: float | None  # the most times the peer it may take; None: shown, not held to one
    cold: bool = False  # with an empty manifest cache, as a user's very first call
    floor_target: float | None = None  # the most times the dry-run floor (DRY_FLOOR) it may take; None: none


COMMANDS = [
    Command("nemotron --help", ["--help"], 2.0),
    Command("nemotron steps list", ["steps", "list"], 2.0),
    Command("nemotron steps list --tree", ["steps", "list", "--tree"], 2.0),
    Command("nemotron steps show rl/rlhf", ["steps", "show", "rl/rlhf"], 2.0),
    Command("nemotron steps run rl/rlhf -c tiny --dry-run", ["steps", "run", "rl/rlhf", "-c", "tiny", "--dry-run"], 3.0,
            floor_target=1.5),
    Command("nemotron steps run rl/ppo -c default -b slurm_rlhf --dry-run",
            ["steps", "run", "rl/ppo", "-c", "default", "-b", "slurm_rlhf", "--dry-run"], 3.0, floor_target=1.5),
    Command("nemotron steps list, first call (no manifest cache)", ["steps", "list"], None, cold=True),
]  # fmt: skip
PEER = "python -c 'import typer' (the peer)"
# What typer itself costs once it runs a command. typer 0.29 checks every parameter's value with a pydantic
# TypeAdapter, so any typer CLI imports pydantic before its command starts (2.5x the peer here); pyproject keeps
# typer < 0.29 for that reason, and this row shows whether the installed typer still runs a command for free.
FLOOR = "a one-command typer app, run (the floor of any typer CLI)"
FLOOR_CODE = """import typer
app = typer.Typer()
@app.command()
def hello(name: str = "x") -> None:
    print(name)
app(["--name", "y"])
"""
# What a dry run cannot do without, and nothing of nemotron: the typer app above, plus one pydantic model built and
# validated (a dry run validates the step's config and the profile strictly) and a YAML file read and written (the
# presets are YAML, and so is the config it prints). No dry run starts faster than this.
DRY_FLOOR = "the same app validating one pydantic model and reading/writing YAML (the floor of a dry run)"
DRY_FLOOR_CODE = """import typer, yaml
from pydantic import BaseModel
class Config(BaseModel):
    steps: int = 1
app = typer.Typer()
@app.command()
def run(name: str = "x") -> None:
    print(yaml.safe_dump(Config.model_validate(yaml.safe_load("steps: 2")).model_dump()))
app(["--name", "y"])
"""


def wall_s(args: list[str], env: dict[str, str], cwd: Path) -> float:
    """Wall seconds of `python ARGS`; SystemExit with the end of its stderr when it fails."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], capture_output=True, env=env, cwd=cwd, check=False)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{args} failed with exit {done.returncode}: {done.stderr.decode()[-800:]}")
    return took


def measure(runs: int, trees: dict[str, Path], commands: list[Command]) -> dict[str, dict[str, float]]:
    """Median wall seconds per tree (label -> source checkout) and command, the peer under the label "peer"."""
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="nemotron-cli-bench-") as tmp:
        # the CLI's own start-up is measured: never forked from a warm server (docs/executors.md)
        base = {k: v for k, v in os.environ.items() if k not in ("NEMOTRON_WARM_CLI", "NEMOTRON_WARM")}
        base |= {"NEMOTRON_HOME": str(Path(tmp) / "home"), "COLUMNS": "200", "NEMOTRON_WARM": "0"}
        base.pop("NEMOTRON_STEPS_PATH", None)
        base.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached as an install has it (see the docstring)
        base["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        # (label, command name), argv after `python`, environment, the manifest cache to empty first (or None)
        cases: list[tuple[tuple[str, str], list[str], dict[str, str], Path | None]] = [
            (("peer", PEER), ["-c", "import typer"], base, None),
            (("peer", FLOOR), ["-c", FLOOR_CODE], base, None),
            (("peer", DRY_FLOOR), ["-c", DRY_FLOOR_CODE], base, None),
        ]
        for label, tree in trees.items():
            for c in commands:
                # the first-call row empties a cache of its own: emptying the shared one would leave every other
                # command of the next round without its validated-records cache, which a user's second call has
                cache = Path(tmp) / f"cache-{label}{'-cold' if c.cold else ''}"
                env = {**base, "PYTHONPATH": str(tree / "src"), "NEMOTRON_CACHE_DIR": str(cache)}
                cases.append(((label, c.name), ["-m", "nemotron", *c.args], env, cache if c.cold else None))
        for (
            _key,
            args,
            env,
            _cold,
        ) in cases:  # warm the OS file cache, the bytecode and the manifest cache once; not counted
            wall_s(args, env, Path(tmp))
        for _ in range(runs):
            for key, args, env, cold in cases:
                if cold is not None:
                    shutil.rmtree(cold, ignore_errors=True)
                times.setdefault(key, []).append(wall_s(args, env, Path(tmp)))
            shutil.rmtree(Path(tmp) / "home", ignore_errors=True)
    medians: dict[str, dict[str, float]] = {}
    for (label, name), values in times.items():
        medians.setdefault(label, {})[name] = statistics.median(values)
    return medians


def missed(medians: dict[str, dict[str, float]], commands: list[Command]) -> list[str]:
    """The commands of this checkout over their target: times the peer, or times the dry-run floor (issue 41)."""
    peer, floor = medians["peer"][PEER], medians["peer"][DRY_FLOOR]
    return [
        c.name
        for c in commands
        if (c.target is not None and medians["this"][c.name] / peer > c.target)
        or (c.floor_target is not None and medians["this"][c.name] / floor > c.floor_target)
    ]


def table(medians: dict[str, dict[str, float]], runs: int, commands: list[Command]) -> str:
    peer, dry = medians["peer"][PEER], medians["peer"][DRY_FLOOR]
    before = "before" in medians
    head = "| command | target | median wall | vs `import typer` | vs the dry-run floor |" + (
        " before | before vs `import typer` | before vs the dry-run floor |" if before else ""
    )
    lines = [f"median of {runs} interleaved runs, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} "
             f"at the end, {sys.executable}", "", head, "|---" * head.count(" | ") + "|---|"]  # fmt: skip

    def vs_floor(took: float, c: Command) -> str:
        return f" {took / dry:.2f}x (≤ {c.floor_target}x) |" if c.floor_target is not None else " |"

    for c in commands:
        s = medians["this"][c.name]
        target = f"≤ {c.target:.0f}x" if c.target is not None else "—"
        row = f"| `{c.name}` | {target} | {s * 1000:.0f} ms | {s / peer:.1f}x |" + vs_floor(s, c)
        if before:
            b = medians["before"][c.name]
            row += f" {b * 1000:.0f} ms | {b / peer:.1f}x |" + vs_floor(b, c)
        lines.append(row)
    for name in (FLOOR, DRY_FLOOR):
        floor = medians["peer"][name]
        lines.append(
            f"| {name} | | {floor * 1000:.0f} ms | {floor / peer:.1f}x | |" + (" | | |" if before else "")
        )
    lines.append(f"| `{PEER}` | | {peer * 1000:.0f} ms | 1.0x | |" + (" | | |" if before else ""))
    return "\n".join(lines)


def write_docs(text: str) -> None:
    page = DOC.read_text()
    head, _, rest = page.partition(BEGIN)
    _, found, tail = rest.partition(END)
    if not found:
        raise SystemExit(f"{DOC} has no {BEGIN} ... {END} markers")
    DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--before", type=Path, help="another checkout (its src/) to measure in the same runs")
    parser.add_argument("--write-docs", action="store_true", help=f"put the table in {DOC.relative_to(REPO)}")
    parser.add_argument("--only", default="", help="only the commands whose name contains this")
    parser.add_argument("--check", action="store_true", help="exit 1 when a command misses its target")
    args = parser.parse_args()
    trees = {"this": REPO, **({"before": args.before.resolve()} if args.before else {})}
    commands = [c for c in COMMANDS if args.only in c.name]
    medians = measure(args.runs, trees, commands)
    text = table(medians, args.runs, commands)
    print(text)
    if args.write_docs:
        write_docs(text)
    over = missed(medians, commands)
    if over:
        print(f"over target: {', '.join(over)}", file=sys.stderr)
        if args.check:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
