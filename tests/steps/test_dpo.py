"""rl/dpo on CPU from the shipped tiny artifacts: the tiny preset raises the held-out pair accuracy well above chance,
moves the policy and registers it with its lineage. (DDP, FSDP and kill -9 resume: tests/steps/test_fsdp.py; the
losses: tests/rl/test_preference_losses.py; bad pairs and a reference with another tokenizer: tests/bad_inputs.)
"""

from __future__ import annotations

import json
import math
import runpy
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from nemotron.core.paths import shipped_root

SFT = shipped_root() / "tiny" / "sft_policy"
STEP_FILE = Path(__file__).resolve().parents[2] / "steps" / "rl" / "dpo" / "step.py"


@pytest.mark.slow
def test_tiny_dpo_raises_held_out_accuracy_well_above_chance(tiny_rl_run: Any, run_cli: Any) -> None:
    r = tiny_rl_run("rl/dpo")  # `steps run rl/dpo -c tiny`, made once: test_metric_names.py reads it too
    assert r.code == 0, r.err[-3000:]
    (job,) = (r.home / "jobs").iterdir()
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    validated = [row for row in rows if "val_accuracy" in row]
    first, last = validated[0], validated[-1]
    # Before the first step the policy is its reference: every reward is 0, so no pair is won and the loss is log 2.
    assert first["step"] == 0 and first["val_accuracy"] == 0.0
    assert first["val_loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert last["step"] == 40 and last["val_accuracy"] >= 0.7 and last["val_loss"] < math.log(2) - 0.1, last
    trained = [row for row in rows if "loss" in row]
    assert sum(row["loss"] for row in trained[-10:]) < sum(row["loss"] for row in trained[:10]) - 1.0
    assert (
        trained[-1]["margin"] > 0
        and trained[-1]["rewards_chosen_mean"] > trained[-1]["rewards_rejected_mean"]
    )

    # The policy moved; the output is registered with edges to the policy it started from and the pairs.
    before, after = (
        load_file(SFT / "model.safetensors"),
        load_file(job / "outputs" / "policy" / "model.safetensors"),
    )
    assert all(not after[k].equal(before[k]) for k in before if after[k].dtype.is_floating_point)
    lineage = run_cli("artifacts", "lineage", "tiny_dpo_policy:v1", "--json", env=r.env_of(r.home))
    graph = json.loads(lineage.out)
    inputs = {e["input"] for e in graph["edges"] if e["child"] == graph["root"]}
    assert inputs == {"policy", "preferences"}, graph["edges"]


def test_the_rpo_losses_read_each_lines_rewards_and_nemo_aligners_defaults(tmp_path: Path) -> None:
    """g = gt_reward_scale * (chosen_reward - rejected_reward) of each line; a line without them takes 1 and 0."""
    from nemotron.models.checkpoint import load_tokenizer

    step = runpy.run_path(str(STEP_FILE), run_name="imported_step")
    dpo = runpy.run_path(str(STEP_FILE.parent / "schema.py"))["DPO"](
        preference_loss="rpo_sq", gt_reward_scale=2
    )
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text(
        '{"prompt": "the tour was", "chosen": "great .", "rejected": "awful .", "chosen_reward": 3, '
        '"rejected_reward": 1.5}\n{"prompt": "my meal was", "chosen": "fine .", "rejected": "cold ."}\n'
    )
    pairs = step["encode_pairs"](str(prefs), load_tokenizer(SFT), 32, dpo)
    assert [p.gt_delta for p in pairs] == [2 * (3 - 1.5), 2 * (1 - 0)]
    assert all(p.tokens.has_responses for p in pairs)


def test_a_pair_that_keeps_no_response_token_is_named_by_its_line(tmp_path: Path) -> None:
    """The line number is the reader's own: a line of only a no-break space is blank to it (and to nothing that
    counts lines by bytes), so the bad pair after it is still line 3."""
    from nemotron.errors import UserError
    from nemotron.models.checkpoint import load_tokenizer

    step = runpy.run_path(str(STEP_FILE), run_name="imported_step")
    dpo = runpy.run_path(str(STEP_FILE.parent / "schema.py"))["DPO"]()
    prefs = tmp_path / "prefs.jsonl"
    long_prompt = "the tour was " * 30
    prefs.write_text(
        '{"prompt": "the tour was", "chosen": "great .", "rejected": "awful ."}\n\u00a0\n'
        f'{{"prompt": "{long_prompt}", "chosen": "great .", "rejected": "awful ."}}\n'
    )
    with pytest.raises(UserError, match=rf"^{prefs}:3: the prompt takes \d+ tokens"):
        step["encode_pairs"](str(prefs), load_tokenizer(SFT), 32, dpo)
