"""docs/troubleshooting.md's time and memory table is what scripts/tiny_resources.py measured: rendered from
docs/figures/tiny_resources.json (date, CPU, load and command beside the figures), one row per step that has a
tiny preset."""

from __future__ import annotations

from typing import Any

from nemotron.catalog import Catalog
from nemotron.core.paths import bundled_root

# Steps whose tiny preset cannot run on a CPU machine: NeMo's converters need the NeMo container on Slurm, and the
# tiny policy is GPT-2, a family they do not convert. Their tiny preset is refused here (checked below).
NOT_ON_THIS_MACHINE = {"convert/hf_to_nemo", "convert/nemo_to_hf"}


def test_the_page_shows_the_measured_figures_of_every_tiny_preset(script_figures: Any, run_cli: Any) -> None:
    _, record = script_figures("tiny_resources", "date", "cpu", "cores", "load", "script")
    measured = {r["command"].split()[3] for r in record["steps"]} | {record["serve"]["command"].split()[3]}
    with_tiny = {s.id for s in Catalog([bundled_root()]).steps.values() if "tiny" in s.presets()}
    assert measured == with_tiny - NOT_ON_THIS_MACHINE
    for step in NOT_ON_THIS_MACHINE:
        refused = run_cli("steps", "run", step, "-c", "tiny", "--dry-run")
        assert refused.code == 2 and "Traceback" not in refused.err, (step, refused.err)
    assert all(r["exit_code"] == 0 and r["peak_rss_mib"] > 0 for r in [*record["steps"], record["serve"]])
