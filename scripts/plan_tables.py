"""docs/cluster.md's tables of which engine and sharding fit which model, computed by the resource plan itself (each
row one `nemotron steps run sft ... --dry-run --json`, compiled in this process) and written between the page's
markers. tests/docs/test_plan_tables.py checks that the page shows what this computes.

    python scripts/plan_tables.py            # a few seconds: dry runs only, nothing is written but the page
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from nemotron.docs.generate import splice

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "cluster.md"
BEGIN, END = "<!-- plan-tables:{}:begin -->", "<!-- plan-tables:{}:end -->"
# the shipped slurm_rlhf profile (H100-80GB) on one node and on eight
PROFILES = """
[one_node]
extends = "slurm_rlhf"
nodes = 1
[eight_nodes]
extends = "slurm_rlhf"
nodes = 8
"""
# sft on the built-in engine, 1 node x 8 x 80 GB: a fine-tune (sft -c default) of 8 sequences of 1024 tokens a step
BUILTIN = (
    "trainer.global_batch_size=8",
    "runtime.gradient_checkpointing=true",
    "runtime.precision=bf16-mixed",
)
BUILTIN_MODELS = {
    "Llama-3.2-1B": "meta-llama/Llama-3.2-1B-Instruct",
    "Llama-3.2-3B": "meta-llama/Llama-3.2-3B-Instruct",
    "Llama-3.1-8B": "meta-llama/Llama-3.1-8B-Instruct",
    "Llama-3.3-70B": "meta-llama/Llama-3.3-70B-Instruct",
}
# sft on NeMo-RL v0.7.0 (sft -c nemo_rl), at the sizes of its own SFT recipes (tests/plan/test_nemo_rl_supervised_pins.py
# cites each file and line)
LONG = ("trainer.global_batch_size=512", "trainer.max_length=4096")
LLAMA_70B = (
    "inputs.init_from=meta-llama/Llama-3.1-70B",
    "plan.models={policy: meta-llama/Llama-3.3-70B-Instruct}",
)
NEMO_RL_ROWS = (
    ("Llama 3.1 8B, 512 x 4096 tokens", "one_node", ("inputs.init_from=meta-llama/Llama-3.1-8B-Instruct", *LONG)),
    ("Llama 3.1 70B, 512 x 4096 tokens", "eight_nodes", (*LLAMA_70B, *LONG, "nemo_rl.policy_backend=megatron",
                                                         "nemo_rl.tensor_parallel_size=4",
                                                         "nemo_rl.pipeline_parallel_size=2")),
    ("Llama 3.1 70B, 4096 tokens", "one_node", (*LLAMA_70B, "trainer.max_length=4096")),
)  # fmt: skip


def training_group(preset: str, profile: str, overrides: tuple[str, ...]) -> dict[str, Any]:
    """The plan's training group of `sft -c PRESET -b PROFILE OVERRIDES --dry-run --json`, kept when it cannot fit
    (plan.on_no_fit=warn) so its peak can be shown."""
    from nemotron.catalog import Catalog
    from nemotron.compile import compile_job
    from nemotron.launch import submit

    job = compile_job(Catalog(), "sft", preset, [*overrides, "plan.on_no_fit=warn"], profile_name=profile,
                      mode="batch", dry_run=True)  # fmt: skip
    (group,) = submit.dry_run_json(job)["resource_plan"]["groups"]
    return group  # type: ignore[no-any-return]


def _verdict(group: dict[str, Any]) -> str:
    return f"{'fits' if group['fits'] else 'refused'} ({group['peak_mb'] / 1024:.{_digits(group)}f} GiB)"


def _digits(group: dict[str, Any]) -> int:
    return 2 if group["peak_mb"] < 10 * 1024 else 1


def builtin_table() -> str:
    rows = ["| model (bf16-mixed, checkpointing, 8 sequences a step) | 1 node x 8 x 80 GB, ddp | 1 node x 8 x 80 GB, fsdp |",
            "|---|---|---|"]  # fmt: skip
    for name, hub in BUILTIN_MODELS.items():
        model = (f"inputs.init_from=/models/{name.lower()}", f"plan.models.policy={hub}")
        cells = [
            _verdict(
                training_group("default", "one_node", (*BUILTIN, *model, f"runtime.sharding={sharding}"))
            )
            for sharding in ("ddp", "fsdp")
        ]
        rows.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(rows) + "\n"


def nemo_rl_table() -> str:
    rows = ["| model | engine, parallelism | nodes x GPUs | peak per GPU | fits |", "|---|---|---|---|---|"]
    for name, profile, overrides in NEMO_RL_ROWS:
        group = training_group("nemo_rl", profile, overrides)
        parallelism = group["parallelism"]
        nodes = 8 if profile == "eight_nodes" else 1
        fits = "yes" if group["fits"] else "refused"
        rows.append(f"| {name} | `backend=nemo_rl`, {parallelism} | {nodes} x 8 | "
                    f"{group['peak_mb'] / 1024:.1f} GiB | {fits} |")  # fmt: skip
    return "\n".join(rows) + "\n"


def update_page(page: str) -> str:
    """`page` with both tables as the plan computes them now."""
    for name, table in (("builtin", builtin_table()), ("nemo_rl", nemo_rl_table())):
        page = splice(page, BEGIN.format(name), END.format(name), table, PAGE.name)
    return page


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "env.toml").write_text(PROFILES)
        os.environ["NEMOTRON_ENV_FILE"] = str(Path(tmp) / "env.toml")
        os.environ["NEMOTRON_HOME"] = str(Path(tmp) / "home")
        PAGE.write_text(update_page(PAGE.read_text()))
    print(f"wrote the plan tables of {PAGE}")


if __name__ == "__main__":
    main()
