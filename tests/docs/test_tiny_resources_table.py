"""docs/troubleshooting.md's time and memory table is what scripts/tiny_resources.py measured: rendered from
docs/figures/tiny_resources.json (date, CPU, load and command beside the figures), one row per step that has a
tiny preset."""

from __future__ import annotations

from typing import Any

from nemotron.catalog import Catalog
from nemotron.paths import bundled_root


def test_the_page_shows_the_measured_figures_of_every_tiny_preset(script_figures: Any) -> None:
    _, record = script_figures("tiny_resources", "date", "cpu", "cores", "load", "script")
    measured = {r["command"].split()[3] for r in record["steps"]} | {record["serve"]["command"].split()[3]}
    with_tiny = {s.id for s in Catalog([bundled_root()]).steps.values() if "tiny" in s.presets()}
    assert measured == with_tiny
    assert all(r["exit_code"] == 0 and r["peak_rss_mib"] > 0 for r in [*record["steps"], record["serve"]])
