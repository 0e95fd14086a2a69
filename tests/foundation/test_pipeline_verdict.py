"""The pipeline's verdict: its eval reports side by side (`[pipeline] compare`), the cells worked by hand, and a
`compare` list with no eval step to compare refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemotron.pipeline import EvalReport, comparison


def _metric(mean: float, low: float, high: float) -> dict[str, float]:
    return {"mean": mean, "low": low, "high": high, "n": 64}


def test_each_report_is_a_row_of_its_means_and_intervals() -> None:
    reports = [
        EvalReport("sft", "tiny_sft_eval:v1", {"metrics": {"win_rate": _metric(0.5, 0.5, 0.5)}}),
        EvalReport(
            "rl/ppo",
            "tiny_ppo_eval:v1",
            {
                "metrics": {
                    "win_rate": _metric(0.8125, 0.71, 0.904),
                    "reward_model": _metric(5.9, 5.88, 5.916),
                }
            },
        ),
    ]
    header, rows = comparison(reports, ["win_rate", "reward_model"])
    assert header == ["policy", "report", "win_rate", "reward_model"]
    assert rows == [
        ["sft", "tiny_sft_eval:v1", "0.50 [0.50, 0.50]", "-"],  # a metric the report lacks
        ["rl/ppo", "tiny_ppo_eval:v1", "0.81 [0.71, 0.90]", "5.90 [5.88, 5.92]"],
    ]


def test_a_compare_list_without_an_eval_step_is_refused(home: Path, tmp_path: Path, run_cli: Any) -> None:
    pipeline = tmp_path / "no_eval.toml"
    pipeline.write_text(
        '[pipeline]\nname = "no_eval"\ncompare = ["win_rate"]\n\n'
        '[[steps]]\nid = "data"\nstep = "data/prep"\npreset = "tiny"\n'
    )
    r = run_cli("pipeline", "run", str(pipeline))
    assert r.code == 2 and "Traceback" not in r.err, r.err
    assert "[pipeline] compare sets eval_report metrics side by side, but no step is eval/policy" in r.err
    assert not (home / "jobs").exists(), "a refused pipeline runs nothing"
