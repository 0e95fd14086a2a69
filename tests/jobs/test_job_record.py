"""job.yaml is a typed record: what `steps run` writes reads back as a JobRecord, and a record that does not match
(hand-edited, from a tool that wrote its own) is exit 2 naming the file and every field, never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from nemotron.jobs.record import JobRecord, load_record


def _run_count(home: Path, tmp_path: Path, run_cli: Any, fixture_steps: Path) -> Path:
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text('{"prompt": "1"}\n')
    done = run_cli(
        "steps",
        "run",
        "test/count",
        "-c",
        "tiny",
        f"inputs.numbers={numbers}",
        env={"NEMOTRON_STEPS_PATH": str(fixture_steps)},
    )
    assert done.code == 0, done.err
    (job,) = (home / "jobs").iterdir()
    return job


def test_what_a_run_writes_reads_back_typed(
    home: Path, tmp_path: Path, run_cli: Any, fixture_steps: Path
) -> None:
    record = load_record(_run_count(home, tmp_path, run_cli, fixture_steps))
    assert isinstance(record, JobRecord)
    assert record.step == "test/count" and record.preset == "tiny" and record.executor == "local"
    (numbers,) = record.inputs
    assert numbers.name == "numbers" and numbers.kind == "path" and numbers.expected_type == "prompt_jsonl"
    assert record.outputs["result"].type and record.launch


def test_a_record_that_does_not_match_is_exit_2_naming_every_field(
    home: Path, tmp_path: Path, run_cli: Any, fixture_steps: Path
) -> None:
    job = _run_count(home, tmp_path, run_cli, fixture_steps)
    data = yaml.safe_load((job / "job.yaml").read_text())
    data["stpe"] = data.pop("step")
    data["mode"] = "sometimes"
    (job / "job.yaml").write_text(yaml.safe_dump(data))
    shown = run_cli("jobs", "show", job.name)
    assert shown.code == 2 and "Traceback" not in shown.err
    assert f"{job}/job.yaml: not a job record nemotron can read" in shown.err
    for problem in (
        "step: Field required",
        "mode: Input should be 'attached' or 'batch'",
        "stpe: Extra inputs",
    ):
        assert problem in shown.err, shown.err
