"""docs/troubleshooting.md's time and memory table is what scripts/tiny_resources.py measured: rendered from
docs/figures/tiny_resources.json (date, CPU, load and command beside the figures), one row per step that has a
tiny preset."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

from nemotron.catalog import Catalog
from nemotron.paths import bundled_root

REPO = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tiny_resources", REPO / "scripts" / "tiny_resources.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_shows_the_measured_figures_of_every_tiny_preset() -> None:
    script = _script()
    record = json.loads(script.FIGURES.read_text())
    page = script.PAGE.read_text()
    assert script.update_page(page, record) == page, "run `python scripts/tiny_resources.py`"
    for key in ("date", "cpu", "cores", "load", "script"):
        assert record[key] not in (None, ""), key
    measured = {r["command"].split()[3] for r in record["steps"]} | {record["serve"]["command"].split()[3]}
    with_tiny = {s.id for s in Catalog([bundled_root()]).steps.values() if "tiny" in s.presets()}
    assert measured == with_tiny
    assert all(r["exit_code"] == 0 and r["peak_rss_mib"] > 0 for r in [*record["steps"], record["serve"]])
