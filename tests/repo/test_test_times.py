"""The suite's own cost recorder (tests/services/timing.py) and its tables (scripts/test_durations.py): a pytest run
in a subprocess, with the recorder on, of two tests whose jobs are known, read back as docs/testing.md's tables."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFTEST = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("timing", {str(REPO / "tests" / "services" / "timing.py")!r})
timing = importlib.util.module_from_spec(spec)
spec.loader.exec_module(timing)

def pytest_configure(config):
    timing.register(config)
"""

TESTS = """
def _job(root, name):
    (root / "jobs" / name).mkdir(parents=True)
    (root / "jobs" / name / "job.yaml").write_text("step: x\\n")

def test_two_jobs(tmp_path):
    _job(tmp_path / "home", "a")
    _job(tmp_path / "ref" / "home", "b")
    (tmp_path / "home" / "jobs" / "not-a-job").mkdir()  # no job.yaml: refused before anything was written

def test_no_tmp_path():
    pass
"""


def test_the_recorder_counts_each_tests_jobs_and_the_tables_show_them(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_sample.py").write_text(TESTS)
    times = tmp_path / "times"
    env = {"NEMOTRON_TEST_TIMES": str(times), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "test_sample.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in (times / "main.jsonl").read_text().splitlines()]
    calls = {row["test"].split("::")[1]: row["jobs"] for row in rows if row["phase"] == "call"}
    assert calls == {"test_two_jobs": 2, "test_no_tmp_path": 0}
    assert {row["phase"] for row in rows} == {"setup", "call", "teardown"}

    table = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "test_durations.py"), str(times), "--label", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "2 tests" in table and "2 jobs run in the tests' own homes" in table
    assert "| folder | tests | wall min | CPU min | jobs | share of wall |" in table
    (row,) = [line for line in table.splitlines() if line.startswith("| `test_sample.py::test_two_jobs`")]
    assert row.endswith(" 2 |")
