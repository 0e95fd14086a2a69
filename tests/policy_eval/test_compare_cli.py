"""`nemotron artifacts compare` as a user runs it: the CLI in a subprocess on a real store.

The fast tests register hand-made reports (written by eval/policy's own report writer) in a fresh home; the slow
one is the issue's "done when": two tiny RL runs that differ in one key, each evaluated by eval/policy, compared."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.assertions import refused

from nemotron.artifacts.store import Artifact, ArtifactStore
from nemotron.policy_eval.report import summarise, write_report

ML_STACK = ("torch", "transformers", "safetensors", "nemo_run")


def _register_report(
    home: Path,
    name: str,
    scores: list[float],
    prompts_file: str = "prompts.jsonl",
    texts: list[str] | None = None,
) -> Artifact:
    """An eval_report of `scores` (reward_model per prompt), with a prompts artifact as its `prompts` input."""
    store = ArtifactStore(home / "artifacts")
    work = home.parent / "made" / name
    texts = texts or [f"prompt {i}" for i in range(len(scores))]
    prompts = work / prompts_file
    prompts.parent.mkdir(parents=True, exist_ok=True)
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    (parent,) = store.register(
        [(f"external.{prompts_file}", "prompt_jsonl", prompts, {"external": True})], None
    )
    rows = [
        {"index": i, "prompt": t, "reward_model": s}
        for i, (t, s) in enumerate(zip(texts, scores, strict=True))
    ]
    interval = {"resamples": 1000, "level": 0.95, "seed": 0}
    summary = {
        "metrics": summarise(rows, ["reward_model"], **interval),
        "interval": interval,
        "num_prompts": len(rows),
    }
    write_report(work / "report", rows, summary)
    return store.register(
        [(name, "eval_report", work / "report", {})], None, parents=[("prompts", parent.id)]
    )[0]


@pytest.fixture
def two_reports(home: Path) -> tuple[str, str]:
    a = [float(i % 10) for i in range(20)]
    first = _register_report(home, "report_a", a)
    second = _register_report(home, "report_b", [x + 0.5 for x in a])
    return first.ref, second.ref


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_the_table_and_the_difference_print(two_reports: tuple[str, str], run_cli_imports: Any) -> None:
    r, imported = run_cli_imports("artifacts", "compare", *two_reports)
    assert r.code == 0, r.err
    assert "report_a:v1" in r.out and "report_b:v1" in r.out
    assert "Δ +0.500 [+0.500, +0.500] higher" in r.out
    assert "training config: fewer than two of the jobs that made the policies have a record" in r.out
    assert "nemotron.policy_eval.compare" in imported  # the check below is real: imports are recorded
    assert not [m for m in imported if m.split(".")[0] in (*ML_STACK, "matplotlib")]


def test_one_report_is_refused(two_reports: tuple[str, str], home: Path, run_cli: Any) -> None:
    before = _files(home)
    refused(run_cli("artifacts", "compare", two_reports[0]), "compare needs at least two eval reports, got 1")
    assert _files(home) == before


def test_a_report_compared_with_itself_is_refused(
    two_reports: tuple[str, str], home: Path, run_cli: Any
) -> None:
    before = _files(home)
    refused(
        run_cli("artifacts", "compare", two_reports[0], two_reports[0]), f"{two_reports[0]} is given twice"
    )
    # the same version under two references: `report_b:latest` is report_b:v1
    refused(
        run_cli("artifacts", "compare", two_reports[0], "report_b:latest", two_reports[1]),
        f"{two_reports[1]} and report_b:latest are the same report, report_b:v1",
    )
    assert _files(home) == before


def test_an_artifact_of_another_type_is_refused_and_no_plot_written(
    two_reports: tuple[str, str], home: Path, tmp_path: Path, run_cli: Any
) -> None:
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "config.json").write_text("{}")
    ArtifactStore(home / "artifacts").register([("some_policy", "checkpoint_hf", policy, {})], None)
    before = _files(home)
    r = run_cli("artifacts", "compare", two_reports[0], "some_policy:v1", "--plot", str(tmp_path / "p.png"))
    refused(r, "some_policy:v1 is a checkpoint_hf artifact, expected eval_report")
    assert _files(home) == before and not (tmp_path / "p.png").exists()


def test_reports_on_different_prompt_sets_are_refused_unless_allowed(
    two_reports: tuple[str, str], home: Path, run_cli: Any
) -> None:
    other = _register_report(home, "report_c", [1.0, 2.0], "other.jsonl", ["another prompt", "and one more"])
    r = run_cli("artifacts", "compare", two_reports[0], other.ref)
    refused(r, "report_a:v1 and report_c:v1 were made on different prompt sets (20 prompts of")
    assert "external.prompts.jsonl:v1" in r.err and "2 prompts of external.other.jsonl:v1" in r.err
    assert "--allow-different-prompts" in r.err
    allowed = run_cli(
        "artifacts", "compare", two_reports[0], other.ref, "--allow-different-prompts", "--json"
    )
    assert allowed.code == 0, allowed.err
    assert json.loads(allowed.out)["rule"]["test"] == "unpaired"


def test_json_is_the_whole_comparison(two_reports: tuple[str, str], run_cli: Any) -> None:
    r = run_cli("artifacts", "compare", *two_reports, "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["format"] == 1 and [c["ref"] for c in data["reports"]] == list(two_reports)
    (metric,) = data["metrics"]
    assert metric["differences"] == [
        None,
        {"mean": 0.5, "low": 0.5, "high": 0.5, "n": 20, "verdict": "higher"},
    ]
    assert data["training"]["jobs"][0]["note"] == "was registered from a path: no job made it"


def test_plot_writes_an_image_of_both_reports(
    two_reports: tuple[str, str], tmp_path: Path, run_cli: Any
) -> None:
    from PIL import Image

    path = tmp_path / "rewards.png"
    r = run_cli("artifacts", "compare", *two_reports, "--plot", str(path))
    assert r.code == 0, r.err
    assert f"wrote {path}" in r.out
    with Image.open(path) as image:
        image.verify()
        assert image.format == "PNG"


def test_plot_metric_without_plot_is_refused(two_reports: tuple[str, str], run_cli: Any) -> None:
    refused(
        run_cli("artifacts", "compare", *two_reports, "--plot-metric", "reward_model"),
        "acts only with --plot",
    )


def test_a_report_of_a_newer_format_or_without_its_files_is_refused(home: Path) -> None:
    from nemotron.errors import UserError
    from nemotron.policy_eval.compare import load_report

    store = ArtifactStore(home / "artifacts")
    newer = _register_report(home, "newer", [1.0])
    summary = Path(newer.path) / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "format": 99}))
    with pytest.raises(
        UserError,
        match=r"newer:v1: summary\.json has format 99; this nemotron reads eval reports of format 1",
    ):
        load_report(store, newer)
    gone = _register_report(home, "gone", [1.0])
    (Path(gone.path) / "responses.jsonl").unlink()
    with pytest.raises(UserError, match="gone:v1: cannot read its report"):
        load_report(store, gone)


# -------------------------------------------------------------------------------------- the "done when"

# The tiny RL step cut to two steps (seconds, not a minute): the comparison needs two trained policies, not good ones.
SHORT_RL = ("steps", "run", "rl/reinforce", "-c", "tiny", "trainer.max_steps=2", "eval.num_prompts=8")
# eval/policy's tiny preset without its judge (the win-rate against the SFT policy is not what is compared here)
NO_JUDGE = ("scorers.win_rate=false", "inputs.baseline=null", "inputs.judge=null")


def _both(nemotron_cmd: Any, runs: list[tuple[str, ...]], timeout: float = 240) -> None:
    """Run the commands at once (each on one thread: the tiny presets set runtime.num_threads=1)."""
    procs = [subprocess.Popen(nemotron_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for args in runs]  # fmt: skip
    for p, args in zip(procs, runs, strict=True):
        out, _ = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"{' '.join(args)}:\n{out[-3000:]}"


@pytest.mark.slow
def test_two_rl_runs_differing_in_the_learning_rate_compare_with_that_key_alone(
    home: Path, run_cli: Any, nemotron_cmd: Any
) -> None:
    _both(nemotron_cmd, [(*SHORT_RL, "optim.lr=0.001", "outputs.policy=lr_small"),
                         (*SHORT_RL, "optim.lr=0.002", "outputs.policy=lr_large")])  # fmt: skip
    _both(nemotron_cmd, [("steps", "run", "eval/policy", "-c", "tiny", *NO_JUDGE, f"inputs.policy={p}:v1",
                          f"outputs.report=eval_{p}") for p in ("lr_small", "lr_large")])  # fmt: skip

    table = run_cli("artifacts", "compare", "eval_lr_small:v1", "eval_lr_large:latest")
    assert table.code == 0, table.err
    for shown in ("eval_lr_small:v1", "eval_lr_large:v1", "lr_small:v1", "lr_large:v1", "reward_model", "Δ "):
        assert shown in table.out, table.out
    training = table.out.split(
        "training config: the keys that differ between the jobs that made the policies"
    )[1]
    rows = [ln for ln in training.split("\n\n")[0].splitlines() if ln.startswith("│")]
    assert len(rows) == 1 and rows[0].split("│")[1].strip() == "optim.lr", training
    assert "0.001" in rows[0] and "0.002" in rows[0]
    assert "eval config: no key differs between the eval jobs" in table.out

    data = json.loads(run_cli("artifacts", "compare", "eval_lr_small:v1", "eval_lr_large:v1", "--json").out)
    assert data["training"]["keys"] == [{"key": "optim.lr", "values": [0.001, 0.002], "set": [True, True]}]
    assert data["training"]["left_out"] == ["outputs.policy"]
    assert data["evaluation"]["keys"] == [] and data["evaluation"]["left_out"] == [
        "inputs.policy",
        "outputs.report",
    ]
    assert data["rule"]["test"] == "paired"
    assert [c["policy_step"] for c in data["reports"]] == ["rl/reinforce", "rl/reinforce"]
    assert all(m["differences"][1] is not None for m in data["metrics"])
