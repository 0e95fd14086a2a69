"""Rendering is a pure function of the Job: the dry-run text is pinned by a golden file.

Regenerate after an intended change with: NEMOTRON_UPDATE_GOLDENS=1 pytest tests/launch/test_render.py
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tests.assertions import matches_golden

from nemotron.artifacts.store import ArtifactStore
from nemotron.catalog import Catalog
from nemotron.compile import compile_job
from nemotron.launch import render

GOLDEN = Path(__file__).resolve().parent / "golden"


def test_local_dry_run_matches_golden(fixture_steps: Path, tmp_path: Path, monkeypatch: object) -> None:
    nums = tmp_path / "nums.jsonl"
    nums.write_text('{"prompt": "1"}\n')
    job = compile_job(
        Catalog(),
        "test/count",
        "chained",
        [f"inputs.numbers={nums}", "trainer.max_steps=4", "server.token=abcdef-secret"],
        passthrough=["--verbose"],
        store=ArtifactStore(tmp_path / "a"),
    )
    job = dataclasses.replace(job, job_id="test-count-20260101-000000-abcd")
    job_dir = "/home/user/.nemotron/jobs/test-count-20260101-000000-abcd"
    text = render.dry_run_text(
        job, render.local_launch(job, job_dir, python="python"), job_dir, {"abcdef-secret"}
    )
    text = text.replace(str(nums), "/data/nums.jsonl").replace(str(fixture_steps), "$STEPS")
    assert "abcdef-secret" not in text
    matches_golden(text, GOLDEN / "dry_run_local.txt")


def test_render_is_pure(fixture_steps: Path, tmp_path: Path) -> None:
    job = compile_job(Catalog(), "test/count", "tiny", [], store=ArtifactStore(tmp_path / "a"))
    a = render.dry_run_text(job, render.local_launch(job, "/j", "python"), "/j")
    b = render.dry_run_text(job, render.local_launch(job, "/j", "python"), "/j")
    assert a == b
    assert not (tmp_path / "a").exists()


def test_scalars_are_written_as_yaml_writes_them() -> None:
    """The dry run writes common scalars itself; each must be what yaml.safe_dump gives, quoting included."""
    import yaml

    values = [None, True, False, 0, -3, 2**70, 0.0, -0.0, 1.0, 0.1, 1e-05, 3e10, 1e16, 2.5e-300, float("inf"),
              float("-inf"), float("nan"), "abc", "rl-ppo", "/tmp/x", "pkg://tiny/prompts.jsonl", "a_b.c/d-e", "_x",
              "x.", "Y", "n", "yes", "Yes", "YES", "no", "on", "On", "OFF", "off", "true", "True", "FALSE", "null",
              "Null", "NULL", "~", "", "1.0", "12", "1e3", "0x1f", "2026-11-26", ".inf", "-x", "- x", "x y", "x: y",
              "a:b", "x#y", "x #y", "'q'", '"q"', "é", "tab\there", "line\nbreak", "[a]", "{a}", "a,b", "*a", "&a",
              "!a", "%a", "@a", "`a", "|a", ">a", "?a", "=", "<<", [], {}, [1, "a"], ["yes"], {"a": 1}]  # fmt: skip
    for value in values:
        expected = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
        expected = expected.removesuffix("\n...").removesuffix("...").strip()
        assert render._scalar(value) == expected, value
