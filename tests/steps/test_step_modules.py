"""Every shipped step is a `main()` of named stages: importing its module (under any name but __main__)
defines functions and does nothing else: no argument parsing, no job directory, no process group, no
training."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STEP_FILES = sorted((REPO / "steps").rglob("step.py"))


def test_every_shipped_step_is_found() -> None:
    found = {str(p.parent.relative_to(REPO / "steps")) for p in STEP_FILES}
    assert {"data/prep", "sft", "rm/train", "rm/serve", "rl/reinforce", "rl/ppo", "rl/rlhf"} <= found


@pytest.mark.parametrize("step_file", STEP_FILES, ids=lambda p: str(p.parent.relative_to(REPO / "steps")))
def test_importing_a_step_module_does_nothing(
    step_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # No --job-dir: a step that parsed its arguments at import would exit 2 here.
    monkeypatch.setattr(sys, "argv", ["step.py"])
    monkeypatch.chdir(tmp_path)
    namespace = runpy.run_path(str(step_file), run_name="imported_step")
    assert callable(namespace.get("main")), f"{step_file} defines no main()"
    assert list(tmp_path.iterdir()) == [], "importing the step wrote files"
    assert "run" not in namespace and "cfg" not in namespace, "the step made its StepRun at import"
    assert capsys.readouterr() == ("", ""), "importing the step printed (a summary line, a usage error)"
    import torch.distributed as dist

    assert not dist.is_initialized()
