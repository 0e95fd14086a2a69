"""The suite's cost by folder and its slowest tests, as the markdown tables of docs/testing.md.

    NEMOTRON_TEST_TIMES=/tmp/times bash scripts/test.sh          # records wall and CPU per test phase
    python scripts/test_durations.py /tmp/times --label after     # prints the tables
    python scripts/test_durations.py /tmp/times --label after --write   # and puts them in docs/testing.md
    python scripts/test_durations.py /tmp/times --label after --seconds   # tests/test_seconds.json: order, --quick

The source is a directory of the JSON lines tests/services/timing.py writes (wall and CPU seconds per phase), or a
pytest `--junitxml` file (wall only: a run made without the recorder). `--write` replaces the block between
`<!-- test-times:LABEL:begin -->` and `<!-- test-times:LABEL:end -->` in docs/testing.md.
"""

from __future__ import annotations

import argparse
import json
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

PAGE = Path(__file__).resolve().parent.parent / "docs" / "testing.md"
# Each test file's wall seconds (tests/conftest.py starts the longest first) and each test's that took QUICK_S or
# more (`scripts/test.sh --quick` leaves those out)
TEST_SECONDS = Path(__file__).resolve().parent.parent / "tests" / "test_seconds.json"
QUICK_S = 2.0


@dataclass
class TestCost:
    test: str
    wall_s: float = 0.0
    cpu_s: float | None = 0.0
    jobs: int | None = 0  # the jobs (step runs) it made; None: not recorded (a junit file, an older recorder)

    @property
    def folder(self) -> str:
        parts = self.test.split("::")[0].split("/")
        return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def from_times(directory: Path) -> list[TestCost]:
    """Sum the phases of each test from the recorder's JSON lines."""
    costs: dict[str, TestCost] = {}
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            cost = costs.setdefault(row["test"], TestCost(row["test"]))
            cost.wall_s += row["wall_s"]
            assert cost.cpu_s is not None
            cost.cpu_s += row["cpu_s"]
            if "jobs" not in row:
                cost.jobs = None
            elif cost.jobs is not None:
                cost.jobs += row["jobs"]
    return list(costs.values())


def from_junit(path: Path) -> list[TestCost]:
    """Each testcase's time (setup + call + teardown) from a pytest junit XML: no CPU figure."""
    costs = []
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        # pytest writes tests/steps/test_x.py as classname tests.steps.test_x (and a class as one more part)
        parts = module.split("/")
        file_parts = parts[
            : next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1) + 1
        ]
        test = "/".join(file_parts) + ".py::" + "::".join([*parts[len(file_parts) :], case.get("name", "")])
        costs.append(TestCost(test, float(case.get("time", 0.0)), None, None))
    return costs


def recorded_seconds(costs: list[TestCost]) -> dict[str, dict[str, float]]:
    """Wall seconds per test file (whole, at least 1, so every known file sorts before unknown ones), and those
    of each test that took QUICK_S or more."""
    per_file: dict[str, float] = defaultdict(float)
    for cost in costs:
        per_file[cost.test.split("::")[0]] += cost.wall_s
    return {
        "files": {name: max(1, round(seconds)) for name, seconds in per_file.items()},
        "tests": {c.test: round(c.wall_s, 1) for c in costs if c.wall_s >= QUICK_S},
    }


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f}"


def render(costs: list[TestCost], label: str, top: int = 20) -> str:
    """The by-folder table and the `top` slowest tests, as markdown."""
    has_cpu = all(c.cpu_s is not None for c in costs)
    has_jobs = all(c.jobs is not None for c in costs)
    folders: dict[str, list[TestCost]] = defaultdict(list)
    for cost in costs:
        folders[cost.folder].append(cost)
    total_wall = sum(c.wall_s for c in costs)
    lines = [
        f"Run `{label}`: {len(costs)} tests, {_minutes(total_wall)} test-minutes of wall time"
        + (f", {_minutes(sum(c.cpu_s or 0.0 for c in costs))} CPU-minutes" if has_cpu else " (no CPU figure)")
        + (f", {sum(c.jobs or 0 for c in costs)} jobs run in the tests' own homes" if has_jobs else "")
        + ". Wall time is summed over the tests, so it exceeds the run's own when workers overlap.",
        "",
        "| folder | tests | wall min | "
        + ("CPU min | " if has_cpu else "")
        + ("jobs | " if has_jobs else "")
        + "share of wall |",
        "|---|---:|---:|" + ("---:|" if has_cpu else "") + ("---:|" if has_jobs else "") + "---:|",
    ]
    for folder, group in sorted(folders.items(), key=lambda kv: -sum(c.wall_s for c in kv[1])):
        wall = sum(c.wall_s for c in group)
        cpu = f"{_minutes(sum(c.cpu_s or 0.0 for c in group))} | " if has_cpu else ""
        jobs = f"{sum(c.jobs or 0 for c in group)} | " if has_jobs else ""
        lines.append(
            f"| {folder} | {len(group)} | {_minutes(wall)} | {cpu}{jobs}{100 * wall / total_wall:.0f}% |"
        )
    lines += [
        "",
        f"The {top} slowest tests (a session or module fixture's cost sits with the first test that used it):",
        "",
        "| test | wall s |" + (" CPU s |" if has_cpu else "") + (" jobs |" if has_jobs else ""),
        "|---|---:|" + ("---:|" if has_cpu else "") + ("---:|" if has_jobs else ""),
    ]
    for cost in sorted(costs, key=lambda c: -c.wall_s)[:top]:
        cpu = f" {cost.cpu_s:.0f} |" if has_cpu and cost.cpu_s is not None else ""
        jobs = f" {cost.jobs} |" if has_jobs else ""
        lines.append(f"| `{cost.test}` | {cost.wall_s:.0f} |{cpu}{jobs}")
    return "\n".join(lines) + "\n"


def warm_children(folder: Path) -> str:
    """A line on the processes the warm servers forked (nemotron.warm: their CPU is in no test's, as no test waits
    for them), from the servers' logs."""
    cpu = [
        float(x) for log in folder.glob("*.log") for x in re.findall(r" cpu ([0-9.]+) s:", log.read_text())
    ]
    return (
        f"\nThe warm servers forked {len(cpu)} processes (steps and their reward servers), "
        f"{_minutes(sum(cpu))} CPU-minutes in all, counted in no test's CPU above.\n"
    )


def update_page(page: str, label: str, block: str) -> str:
    begin, end = f"<!-- test-times:{label}:begin -->", f"<!-- test-times:{label}:end -->"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(page):
        raise SystemExit(f"{PAGE} has no {begin} ... {end} block")
    return pattern.sub(lambda _: f"{begin}\n{block}{end}", page)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", type=Path, help="the recorder's directory, or a pytest --junitxml file")
    parser.add_argument("--label", required=True, help="which block of docs/testing.md (before, after)")
    parser.add_argument("--write", action="store_true", help="write the tables into docs/testing.md")
    parser.add_argument(
        "--seconds", action="store_true", help=f"write the seconds the suite orders by to {TEST_SECONDS}"
    )
    parser.add_argument("--top", type=int, default=20, help="how many of the slowest tests to list")
    parser.add_argument(
        "--warm", type=Path, help="the run's $NEMOTRON_WARM_DIR: the CPU of the warm servers' children"
    )
    args = parser.parse_args()
    costs = from_times(args.source) if args.source.is_dir() else from_junit(args.source)
    if not costs:
        raise SystemExit(f"no test times in {args.source}")
    block = render(costs, args.label, args.top)
    if args.warm and args.warm.is_dir():
        block += warm_children(args.warm)
    if args.write:
        PAGE.write_text(update_page(PAGE.read_text(), args.label, block))
    if args.seconds:
        TEST_SECONDS.write_text(json.dumps(recorded_seconds(costs), indent=0, sort_keys=True) + "\n")
    print(block, end="")


if __name__ == "__main__":
    main()
