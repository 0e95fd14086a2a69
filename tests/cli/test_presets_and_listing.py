"""A user's preset file extends the step's shipped presets; `jobs ls` lists the newest job first."""

import json
import os
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def test_a_user_preset_extends_a_shipped_one(home: Path, tmp_path: Path, run_cli: Any) -> None:
    (tmp_path / "mine.yaml").write_text("defaults: [tiny]\ntrainer:\n  max_steps: 7\n")
    r = run_cli("steps", "run", "rl/reinforce", "-c", "./mine.yaml", "--dry-run", cwd=tmp_path)
    assert r.code == 0, r.err
    assert "max_steps: 7  # preset:mine" in r.out and "num_prompts_per_step: 16  # preset:tiny" in r.out


def test_a_preset_beside_the_file_wins_over_the_shipped_one(home: Path, tmp_path: Path, run_cli: Any) -> None:
    # the file's own `tiny` extends the shipped one by path (a name would find itself first)
    shipped = REPO / "steps" / "rl" / "reinforce" / "config" / "tiny.yaml"
    (tmp_path / "tiny.yaml").write_text(f"defaults: [{shipped}]\ntrainer:\n  num_prompts_per_step: 3\n")
    (tmp_path / "mine.yaml").write_text("defaults: [tiny]\n")
    r = run_cli("steps", "run", "rl/reinforce", "-c", "./mine.yaml", "--dry-run", cwd=tmp_path)
    assert r.code == 0 and "num_prompts_per_step: 3  # preset:tiny" in r.out


def test_jobs_ls_is_newest_first_across_steps(home: Path, run_cli: Any) -> None:
    ids = [
        "sft-20260101-000003-aaaa",
        "rl-ppo-20260101-000001-bbbb",
        "data-prep-20260101-000002-cccc",
        "rl-reinforce-20251231-235959-dddd",
    ]
    for i, job_id in enumerate(ids):
        d = home / "jobs" / job_id
        d.mkdir(parents=True)
        (d / "job.yaml").write_text(
            f"job_id: {job_id}\nstep: x\npreset: tiny\nmode: batch\nexecutor: local\n"
            f"created_at: '{i}'\nprofile: {{}}\nconfig: {{}}\nconfig_hash: h\nlaunch: ''\n"
        )
        (d / "status.json").write_text(json.dumps({"state": "succeeded"}))
        os.utime(d, (time.time() - i, time.time() - i))
    r = run_cli("jobs", "ls", "--json")
    assert r.code == 0, r.err
    assert [row["job_id"] for row in json.loads(r.out)] == [ids[0], ids[2], ids[1], ids[3]]
    # a record nemotron cannot read is listed as such, and the others still are
    (home / "jobs" / ids[1] / "job.yaml").write_text("job_id: x\n")
    r = run_cli("jobs", "ls", "--json")
    assert r.code == 0 and f"{ids[1]}/job.yaml: not a job record" in r.err
    assert [row["state"] for row in json.loads(r.out)] == [
        "succeeded",
        "succeeded",
        "unreadable",
        "succeeded",
    ]
