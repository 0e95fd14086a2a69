"""docs/cluster.md's plan tables (which engine and sharding fit which model size) are what scripts/plan_tables.py
computes from the resource plan now: no figure there that the plan did not produce."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def test_the_page_shows_the_plans_figures(
    script_module: Any, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = script_module("plan_tables")
    (tmp_path / "env.toml").write_text(script.PROFILES)
    monkeypatch.setenv("NEMOTRON_ENV_FILE", str(tmp_path / "env.toml"))
    page = script.PAGE.read_text()
    assert script.update_page(page) == page, "run `python scripts/plan_tables.py`"
    # the figures the issue asks of the plan, as the tables show them
    builtin = script.builtin_table()
    assert "| Llama-3.1-8B | refused (137.4 GiB) | fits (20.5 GiB) |" in builtin
    assert "| Llama-3.3-70B | refused (1186.8 GiB) | refused (142.6 GiB) |" in builtin
    megatron = [row for row in script.nemo_rl_table().splitlines() if "Megatron TP 4 x PP 2" in row]
    assert len(megatron) == 1 and megatron[0].endswith("| 8 x 8 | 76.0 GiB | yes |")
