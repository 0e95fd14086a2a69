"""The pipeline's verdict: its eval reports side by side (`[pipeline] compare`), the cells worked by hand, and a
`compare` list with no eval step to compare refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemotron.launch.pipeline import verdict_cells


def _metric(mean: float, low: float, high: float, delta: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"mean": mean, "low": low, "high": high, "n": 64, **({"delta": delta} if delta else {})}


def test_each_report_is_a_row_of_its_means_intervals_and_differences_from_the_first() -> None:
    record = {
        "compare": ["win_rate", "reward_model"],
        "rule": {"test": "paired", "resamples": 1000, "level": 0.95, "seed": 0},
        "reports": [
            {"policy": "sft", "report": "tiny_sft_eval:v1", "metrics": {"win_rate": _metric(0.5, 0.5, 0.5)}},
            {
                "policy": "rl/ppo",
                "report": "tiny_ppo_eval:v1",
                "metrics": {
                    "win_rate": _metric(
                        0.8125, 0.71, 0.904, {"mean": 0.3125, "low": 0.21, "high": 0.404, "verdict": "higher"}
                    ),
                    "reward_model": _metric(5.9, 5.88, 5.916),  # no difference: the first report lacks it
                },
            },
            {
                "policy": "rl/rlhf",
                "report": "tiny_rlhf_eval:v1",
                "metrics": {
                    "win_rate": _metric(
                        0.52, 0.4, 0.64, {"mean": 0.02, "low": -0.1, "high": 0.14, "verdict": "inconclusive"}
                    )
                },
            },
        ],
    }
    header, rows = verdict_cells(record)
    assert header == ["policy", "report", "win_rate", "reward_model"]
    assert rows == [
        ["sft", "tiny_sft_eval:v1", "0.50 [0.50, 0.50]", "-"],  # a metric the report lacks
        ["rl/ppo", "tiny_ppo_eval:v1", "0.81 [0.71, 0.90], Δ +0.31 higher", "5.90 [5.88, 5.92]"],
        ["rl/rlhf", "tiny_rlhf_eval:v1", "0.52 [0.40, 0.64], Δ +0.02", "-"],  # the interval holds 0: no word
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
