"""A reward server the step starts that refuses its model (exit 2: bad input) makes the step exit 2 with the
server's own reason, not 3 with "exited before it was ready ... resume" (issue 42)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from nemotron.core.paths import shipped_root


def test_a_reward_model_the_server_refuses_is_exit_2_with_its_reason(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    """The checkpoint's headers and shapes pass the dry run's checks (tests/bad_inputs/test_preflight.py); its
    config does not build (64 dimensions over 3 heads), which only loading it finds."""
    rm = tmp_path / "three_heads"
    shutil.copytree(shipped_root() / "tiny" / "reward_model", rm)
    config = json.loads((rm / "config.json").read_text())
    config.update(n_head=3)
    (rm / "config.json").write_text(json.dumps(config))
    r = run_cli("steps", "run", "rl/rlhf", "-c", "tiny", "grpo.max_num_steps=1",
                f"env.nemo_gym.genrm_model.responses_api_models.vllm_model.model={rm}", timeout=300)  # fmt: skip
    assert r.code == 2, r.err[-2000:]
    assert f"error: the reward model cannot be served: {rm}: cannot load" in r.err, r.err[-2000:]
    assert "Traceback" not in r.err and "resume" not in r.err  # no checkpoint to resume: nothing ran
    assert json.loads(run_cli("artifacts", "ls", "--json").out) == []  # nothing registered
