"""runtime.sharding=fsdp against ddp, each on the same 2 local ranks (gloo on CPU), through the CLI, for sft, rm/train,
rl/reinforce and rl/dpo: the same metrics at every step (within 1e-4), final checkpoints that transformers loads and that
match, and a run killed with -9 that, run again, resumes from its sharded state and ends on the uninterrupted fsdp
run's bytes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors import safe_open


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    metrics: tuple[str, ...]  # compared step by step
    output: str
    auto_class: str  # the transformers class the output loads with


REINFORCE = (
    "steps run rl/reinforce -c tiny trainer.max_steps=4 checkpoint.save_interval=2 reward.source=in_process "
    "trainer.num_prompts_per_step=8 eval.num_prompts=0"
)
# rl/dpo in micro-batches of 8 pairs, 4 per rank and step: the accumulated gradient is what is compared
DPO = (
    "steps run rl/dpo -c tiny dpo.max_num_steps=3 dpo.val_period=1 trainer.log_interval=1 "
    "checkpoint.save_interval=2 trainer.micro_batch_size=8"
)
CASES = {
    "sft": Case(
        tuple(
            "steps run sft -c tiny trainer.max_steps=4 trainer.log_interval=1 checkpoint.save_interval=2".split()
        ),
        ("loss", "val_loss", "grad_norm"),
        "policy",
        "AutoModelForCausalLM",
    ),
    "rm/train": Case(
        tuple(
            "steps run rm/train -c tiny trainer.max_steps=3 trainer.log_interval=1 checkpoint.save_interval=2".split()
        ),
        ("loss", "accuracy", "reward_margin", "grad_norm", "val_accuracy"),
        "reward_model",
        "AutoModelForSequenceClassification",
    ),
    "rl/reinforce": Case(
        tuple(REINFORCE.split()),
        ("rewards", "init_policy_kl", "actor_loss", "advantages_mean", "grad_norm", "response_lengths"),
        "policy",
        "AutoModelForCausalLM",
    ),
    "rl/dpo": Case(
        tuple(DPO.split()),
        ("loss", "accuracy", "margin", "rewards_chosen_mean", "grad_norm", "val_accuracy", "val_loss"),
        "policy",
        "AutoModelForCausalLM",
    ),
}
FSDP = ("-r", "local_ddp", "runtime.sharding=fsdp")
DDP = ("-r", "local_ddp")


def _run(home: Path, *args: str, env: dict[str, str] | None = None) -> Path:
    """Run the CLI in `home`; the new job's dir."""
    before = set((home / "jobs").iterdir()) if (home / "jobs").is_dir() else set()
    r = subprocess.run(
        [sys.executable, "-m", "nemotron", *args],
        env={**os.environ, "NEMOTRON_HOME": str(home), "COLUMNS": "200", **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )
    (job,) = set((home / "jobs").iterdir()) - before
    if env is None:
        assert r.returncode == 0, r.stderr[-3000:]
    return job


def _metrics(job: Path, keys: tuple[str, ...]) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: r[k] for k in keys if r.get(k) is not None} for r in rows if r["step"] > 0}


def _hash(job: Path, output: str) -> str:
    return hashlib.sha256((job / "outputs" / output / "model.safetensors").read_bytes()).hexdigest()


class Runs:
    """Each step's ddp and fsdp jobs, run once for the module (each in a home of its own)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[str, tuple[Path, Path]] = {}

    def __call__(self, name: str) -> tuple[Path, Path]:
        if name not in self.done:
            case, root = CASES[name], self.root / name.replace("/", "_")
            self.done[name] = (_run(root / "ddp", *case.args, *DDP), _run(root / "fsdp", *case.args, *FSDP))
        return self.done[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("fsdp"))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_fsdp_trains_as_ddp_does(name: str, runs: Runs) -> None:
    import transformers

    case, (ddp, fsdp) = CASES[name], runs(name)
    log = (fsdp / "logs" / "step.log").read_text()
    assert "FSDP2 over 2 rank(s)" in log, log[-2000:]  # the sharded path ran, on both ranks
    assert "FSDP2" not in (ddp / "logs" / "step.log").read_text()
    want, got = _metrics(ddp, case.metrics), _metrics(fsdp, case.metrics)
    assert sorted(want) == sorted(got) and len(want) >= 3
    for step, values in want.items():
        assert values.keys() == got[step].keys() and values, step
        for key, value in values.items():
            assert abs(got[step][key] - value) <= 1e-4, (
                f"step {step} {key}: fsdp {got[step][key]}, ddp {value}"
            )
    # the gathered checkpoint is an ordinary Hugging Face one (not FSDP's class name), equal to ddp's
    auto = getattr(transformers, case.auto_class)
    models = [
        auto.from_pretrained(job / "outputs" / case.output, use_safetensors=True) for job in (ddp, fsdp)
    ]
    config = [json.loads((job / "outputs" / case.output / "config.json").read_text()) for job in (ddp, fsdp)]
    assert config[1]["architectures"] == config[0]["architectures"]
    files = [
        set(safe_open(j / "outputs" / case.output / "model.safetensors", "pt").keys()) for j in (ddp, fsdp)
    ]
    assert files[1] == files[0]  # a tied weight once, as ddp writes it
    a, b = (m.state_dict() for m in models)
    assert a.keys() == b.keys()
    # Within 1e-5 but for a few entries: the attention's key bias has a gradient of zero in exact arithmetic (softmax
    # ignores a constant shift), and AdamW turns float noise there into steps of about lr, differently per run.
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-3, msg=k)
    off = sum(int(((a[k] - b[k]).abs() > 1e-5).sum()) for k in a)
    assert off <= 0.001 * sum(v.numel() for v in a.values()), off


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_killed_under_fsdp_resumes_from_its_sharded_state(name: str, runs: Runs, tmp_path: Path) -> None:
    """kill -9 in step 3, after the step-2 checkpoint (each rank's shard in sharded/): the same command again
    resumes from it (checkpoint.resume=auto) and ends on the uninterrupted fsdp run's bytes; ddp cannot take it."""
    case, (_, fsdp) = CASES[name], runs(name)
    home = tmp_path / "home"
    killed = _run(home, *case.args, *FSDP, env={"NEMOTRON_FAULT": "optimizer@3"})
    status = json.loads((killed / "status.json").read_text())
    assert status["state"] == "failed" and status["exit_code"] != 0  # a rank got SIGKILL; torchrun says 1
    assert not (killed / "outputs" / case.output / "model.safetensors").exists()
    saved = killed / "checkpoints" / "step_000002"
    assert sorted(p.name for p in (saved / "sharded").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    assert not (saved / case.output).exists()  # the weights are in the shards only
    again = _run(home, *case.args, *FSDP)
    assert f"resumed from {saved}" in (again / "logs" / "step.log").read_text()
    steps = [json.loads(x)["step"] for x in (again / "metrics.jsonl").read_text().splitlines()]
    assert steps[0] == 3 and steps[-1] == max(_metrics(fsdp, ()))
    assert _hash(again, case.output) == _hash(fsdp, case.output)

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "nemotron",
            *case.args,
            *DDP,
            f"checkpoint.resume_from={killed.name}",
            "--dry-run",
        ],
        env={**os.environ, "NEMOTRON_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "refusing to resume" in r.stderr, r.stderr[-2000:]
