""".ci/run's own logic, on stand-in parts in a scratch copy: each background part's exit status reaches the run's,
a failed part shows its log, and a vLLM venv that fails stops the main suite. The exit statuses come from files, not
`wait PID`: a rehearsal whose every test passed once ended rc 1 when bash had forgotten an ended part's PID."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Each stand-in takes its exit status (and the vLLM venv its duration) from the environment.
STUBS = {
    "bootstrap.sh": f'mkdir -p .venv-ci/bin && ln -sf "{sys.executable}" .venv-ci/bin/python && echo main-venv\n',
    "test-services.sh": "echo services-up; exit ${SERVICES_RC:-0}\n",
    "bootstrap-vllm.sh": "sleep ${VLLM_VENV_S:-0}; echo vllm-venv; exit ${VLLM_VENV_RC:-0}\n",
    "test.sh": 'echo main-start; touch "$NEMOTRON_TEST_TAIL_FILE"; sleep 1; echo main-end; exit ${MAIN_RC:-0}\n',
    "test-vllm.sh": 'echo "vllm-tests in $NEMOTRON_WARM_DIR"; exit ${VLLM_TESTS_RC:-0}\n',
    "test_durations.py": "print('durations')\n",
}


def _run(tmp_path: Path, stubs: dict[str, str] | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / ".ci").mkdir()
    shutil.copy(REPO / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "scripts").mkdir()
    for name, text in {**STUBS, **(stubs or {})}.items():
        (tmp_path / "scripts" / name).write_text(text)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NEMOTRON_")}
    return subprocess.run(["bash", ".ci/run"], cwd=tmp_path, env={**clean, **env}, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_all_parts_green_is_rc_0_with_every_log(tmp_path: Path) -> None:
    done = _run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for line in ("services-up", "main-end", "vllm-venv", "vllm-tests in /tmp/nemotron-test-warm-vllm."):
        assert line in done.stdout
    assert "CI done in" in done.stdout and "(main suite exit 0, vLLM part exit 0)" in done.stdout


@pytest.mark.parametrize(
    ("env", "rc", "says"),
    [
        ({"MAIN_RC": "3"}, 3, "(main suite exit 3, vLLM part exit 0)"),
        ({"VLLM_TESTS_RC": "7"}, 7, "(main suite exit 0, vLLM part exit 7)"),
        ({"SERVICES_RC": "2"}, 1, "services failed (exit 2):\nservices-up"),
        ({"VLLM_VENV_RC": "5"}, 1, "bootstrap-vllm failed (exit 5):\nvllm-venv"),
        # the venv fails after the main suite has ended: its status is still there to read
        ({"VLLM_VENV_RC": "4", "VLLM_VENV_S": "4"}, 1, "bootstrap-vllm failed (exit 4):\nvllm-venv"),
    ],
)
def test_a_failed_part_fails_the_run_with_its_status_and_log(
    tmp_path: Path, env: dict[str, str], rc: int, says: str
) -> None:
    done = _run(tmp_path, **env)
    assert done.returncode == rc, done.stdout + done.stderr
    assert says in done.stdout + done.stderr


def test_a_failed_vllm_venv_stops_the_main_suite(tmp_path: Path) -> None:
    slow = 'echo main-start; touch "$NEMOTRON_TEST_TAIL_FILE"; sleep 5; echo main-end\n'
    done = _run(tmp_path, {"test.sh": slow}, VLLM_VENV_RC="5")
    assert done.returncode == 1
    assert "main-start" in done.stdout and "main-end" not in done.stdout
