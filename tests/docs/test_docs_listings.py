"""Every `nemotron artifacts ...` and `nemotron jobs ls ...` line in docs/concepts.md runs as written (exit 0) on a
home with a small lineage and a job."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def documented() -> list[list[str]]:
    lines, fenced = [], False
    for line in (ROOT / "docs" / "concepts.md").read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced:
            lines.append(line.split("  #")[0].strip())
    return [shlex.split(line)[1:] for line in lines if re.match(r"nemotron (artifacts|jobs ls)\b", line)]


def test_the_documented_listing_commands_run(home: Path, tmp_path: Path, run_cli: Any) -> None:
    from nemotron.artifacts.store import ArtifactStore

    store = ArtifactStore(home / "artifacts")
    src = tmp_path / "w.json"
    src.write_text("{}")
    data = store.register([("tiny_sft_data", "sft_jsonl", src, {"step": "data/prep"})], "data-prep-1")[0]
    sft = store.register(
        [("tiny_sft_policy", "checkpoint_hf", src, {"step": "sft"})], "sft-1", [("data", data.id)]
    )[0]
    store.register([("tiny_rlhf_policy", "checkpoint_hf", src, {"step": "rl/rlhf"})], "rl-rlhf-1",
                   [("policy", sft.id), ("judge", sft.id)])  # fmt: skip
    job = home / "jobs" / "rl-rlhf-20260101-000000-abcd"
    job.mkdir(parents=True)
    (job / "job.yaml").write_text("job_id: rl-rlhf-20260101-000000-abcd\nstep: rl/rlhf\npreset: tiny\nmode: batch\n"
                                  "executor: local\ncreated_at: '2026-01-01T00:00:00+00:00'\nprofile: {}\nconfig: {}\n"
                                  "config_hash: h\nlaunch: ''\n")  # fmt: skip
    (job / "status.json").write_text(json.dumps({"state": "failed", "exit_code": 1}))
    commands = documented()
    assert len(commands) >= 8, commands
    for args in commands:
        r = run_cli(*args)
        assert r.code == 0, (args, r.err)
