"""docs/adding-an-engine.md and docs/adding-an-executor.md stay true: every file they name exists, every registry and
table they tell a reader to extend is where they say, and each lists the members of the interface it documents."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nemotron.engines import base as engines_base
from nemotron.launch import executor as executors
from nemotron.plan import groups as plan_groups

REPO = Path(__file__).resolve().parents[2]
PAGES = ["docs/adding-an-engine.md", "docs/adding-an-executor.md"]
# a repository path in backticks: src/..., tests/..., scripts/..., profiles/...
PATH = re.compile(r"`((?:src|tests|scripts|profiles)/[^`<>*]+?)`")


@pytest.mark.parametrize("page", PAGES)
def test_every_file_the_page_names_exists(page: str) -> None:
    text = (REPO / page).read_text()
    named = sorted(set(PATH.findall(text)))
    assert len(named) >= 8, named  # the checklists name their files
    missing = [p for p in named if not (REPO / p).exists()]
    assert not missing, f"{page} names files that do not exist: {missing}"


def test_the_engine_page_names_the_registries_and_traits_that_exist() -> None:
    text = (REPO / "docs/adding-an-engine.md").read_text()
    import nemotron.config.backends as traits

    for name in ("RUNS_AS_STEP_PROCESS", "KEEPS_TENSORBOARD_METRICS", "PREFLIGHT_RULES", "PLAN_GROUPS"):
        assert name in text and hasattr(traits, name), name
    assert "`ENGINES`" in text and isinstance(traits.ENGINES, dict) and engines_base.ENGINES is traits.ENGINES
    assert "`PlanContext`" in text and hasattr(plan_groups, "PlanContext")
    for helper in ("recipe_for", "pinned_or_profile"):
        assert helper in text and hasattr(engines_base, helper), helper
    from nemotron.engines.nemo_rl.engine import NemoRLEngine

    assert "adopt_outputs" in text and hasattr(
        NemoRLEngine, "adopt_outputs"
    )  # the optional method, as documented
    for shape in ("StepProcess", "RayDriver", "HetJob"):
        assert f"`{shape}`" in text and hasattr(engines_base, shape), shape


def test_the_executor_page_lists_every_member_of_the_interface() -> None:
    text = (REPO / "docs/adding-an-executor.md").read_text()
    members = [m for m in vars(executors.Executor) if not m.startswith("_")]
    members += list(executors.Executor.__annotations__)
    assert {"kind", "cheap_refresh", "placement", "render", "submit", "refresh"} <= set(members)
    for member in set(members):
        assert f"`{member}" in text, f"docs/adding-an-executor.md does not describe Executor.{member}"
    assert "`EXECUTORS`" in text and set(executors.EXECUTORS) == {"local", "slurm", "lepton"}
