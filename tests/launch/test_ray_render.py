"""The Ray sbatch script for any node count: one head, a worker per other node, one driver on the head, the
NeMo-RL config sized to the allocation; bash accepts it; dry-run and submit render it from the same plan."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from nemotron.catalog import Catalog
from nemotron.compile import compile_job
from nemotron.launch import ray_slurm, submit

PROFILES = "".join(f'[slurm_{n}]\nextends = "slurm_rlhf"\nnodes = {n}\n' for n in (1, 2, 8))


@pytest.mark.parametrize("nodes", [1, 2, 8])
def test_one_head_workers_and_one_driver(nodes: int, home: Path, tmp_path: Path) -> None:
    (tmp_path / "env.toml").write_text(PROFILES)
    job = compile_job(Catalog(), "rl/rlhf", "default", [], profile_name=f"slurm_{nodes}", mode="batch")
    _, where, launch, text = submit.plan(job)
    plan = ray_slurm.plan_for(job, where, launch)  # type: ignore[arg-type]
    script = ray_slurm.render_sbatch(plan)

    assert script in text  # --dry-run shows the very script submit sends
    assert f"#SBATCH --nodes={nodes}" in script and "#SBATCH --ntasks-per-node=1" in script
    assert (
        "#SBATCH --gpus-per-node=8" in script and "#SBATCH --cpus-per-task=128" in script
    )  # 8 tasks x 16 CPUs
    assert len(re.findall(r"ray start --head", script)) == 1
    assert (
        len(re.findall(r"ray start --address", script)) == 1
        and "for ((i = 1; i < ${#nodes[@]}; i++))" in script
    )
    assert len(re.findall(r"srun --overlap .* bash .*ray_driver\.sh", script)) == 1
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert plan.driver_script.count("uv run python examples/nemo_gym/run_grpo_nemo_gym.py") == 1
    assert "NEMOTRON_RAY_NODES" in plan.driver_script and f"export NEMOTRON_RAY_NODES={nodes}" in script
    config = yaml.safe_load(dict(launch.files)["nemo_rl_config.yaml"])  # type: ignore[union-attr]
    assert config["cluster"] == {"num_nodes": nodes, "gpus_per_node": 8}


def test_port_blocks_never_overlap_between_the_raylets_of_one_host() -> None:
    def block(job: int, node: int) -> range:
        base = (
            ray_slurm.PORT_BASE
            + (job % ray_slurm.PORT_JOBS) * ray_slurm.PORT_JOB_STRIDE
            + (node % ray_slurm.PORT_NODES) * ray_slurm.PORT_NODE_STRIDE
        )
        return range(base, base + ray_slurm.MAX_WORKER_OFFSET + 1)

    blocks = [block(job, node) for job in range(ray_slurm.PORT_JOBS) for node in range(ray_slurm.PORT_NODES)]
    taken = [port for b in blocks for port in b]
    assert len(taken) == len(set(taken))  # 12 jobs x 8 raylets on one host, no port twice
    assert max(taken) < 32768  # below the kernel's ephemeral range
