"""A user's step that declares its models gets what a shipped step gets, as a user meets it (the CLI in a
subprocess): a resource-plan row for each model group at --dry-run, and the refusal (exit 2, nothing written) when
its reward model's tokenizer is not its policy's. The step is docs/examples/my-steps' rl/rloo_lite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nemotron.core.paths import shipped_root

MY_STEPS = Path(__file__).resolve().parents[2] / "docs" / "examples" / "my-steps"
SHIPPED_TOKENIZER = shipped_root() / "tiny" / "reward_model" / "tokenizer.json"


@pytest.fixture
def my_steps(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("NEMOTRON_STEPS_PATH", str(MY_STEPS))
    return MY_STEPS


def test_a_user_step_shows_the_plan_of_the_models_it_declares(
    my_steps: Path, home: Path, run_cli: Any
) -> None:
    r = run_cli("steps", "run", "rl/rloo_lite", "-c", "tiny", "--dry-run")

    assert r.code == 0, r.err[-2000:]
    plan = r.out.split("## resource plan", 1)[1].split("## launch", 1)[0]
    rows = [line.split("  ")[0] for line in plan.splitlines()[2:] if line and not line.startswith("#")]
    assert rows == ["policy training", "reward model"], plan  # the trainer, and the server beside it
    assert "reference " in plan  # the frozen copy its manifest declares, in the trainer's group


def test_a_user_step_holding_its_reward_model_in_process_plans_it_in_the_trainer(
    my_steps: Path, run_cli: Any
) -> None:
    r = run_cli("steps", "run", "rl/rloo_lite", "-c", "tiny", "reward.source=in_process", "--dry-run")

    assert r.code == 0, r.err[-2000:]
    plan = r.out.split("## resource plan", 1)[1].split("## launch", 1)[0]
    rows = [line.split("  ")[0] for line in plan.splitlines()[2:] if line and not line.startswith("#")]
    assert rows == ["policy training"] and f"reward_model {shipped_root()}" in plan, plan  # in its process


def test_a_user_step_whose_reward_model_reads_other_token_ids_is_refused(
    my_steps: Path, home: Path, tmp_path: Path, run_cli: Any, make_tokenizer_variant: Any, shuffle_vocab: Any
) -> None:
    policy = make_tokenizer_variant(
        shipped_root() / "tiny" / "sft_policy", tmp_path / "permuted", shuffle_vocab
    )
    for extra in (["--dry-run"], []):
        r = run_cli("steps", "run", "rl/rloo_lite", "-c", "tiny", f"inputs.policy={policy}", *extra)

        assert r.code == 2, (r.out[-2000:], r.err[-2000:])
        lines = [ln for ln in r.err.splitlines() if ln.strip()]
        assert len(lines) == 1 and "their tokenizers differ" in lines[0], r.err
        assert f"{policy}/tokenizer.json" in lines[0] and str(SHIPPED_TOKENIZER) in lines[0], lines[0]
        assert not home.exists(), "a refused job writes nothing"
