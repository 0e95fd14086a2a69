"""What the tracking tests' tiny rl/ppo runs share: one NEMOTRON_HOME per test module (tiny_ppo.py has the run's
arguments and how its job dir is read back)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tracked_home(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One NEMOTRON_HOME for the module: a later run consumes the first run's registered policy, and `jobs sync`
    replays its jobs. The trackers sample system metrics every second, so the short run holds a few samples."""
    root = tmp_path_factory.mktemp("tracked")
    return {
        "NEMOTRON_HOME": str(root / "home"),
        "NEMOTRON_CACHE_DIR": str(root / "cache"),
        "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "1",
        "WANDB_X_STATS_SAMPLING_INTERVAL": "1",
    }
