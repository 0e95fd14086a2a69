"""The README's tiny pipeline tables are what scripts/tiny_figures.py recorded in docs/figures/tiny_pipeline.json
(no hand edits), the verdict among them, for the metrics the pipeline compares today."""

from __future__ import annotations

from typing import Any

from nemotron.catalog import Catalog
from nemotron.launch.pipeline import load_pipeline


def test_the_readme_shows_the_recorded_pipeline_and_its_verdict(script_figures: Any) -> None:
    _, record = script_figures("tiny_figures", "date", "cpu", "cores", "load", "command", "eval_seconds")
    pipe = load_pipeline("tiny", Catalog())
    assert record["verdict"]["compare"] == pipe.pipeline.compare, "run `python scripts/tiny_figures.py`"
    evaluated = [s.inputs["policy"].partition(".")[0] for s in pipe.steps if s.step == "eval/policy"]
    step_of = {s.id: s.step for s in pipe.steps}
    assert [r["policy"] for r in record["verdict"]["reports"]] == [step_of[e] for e in evaluated]
