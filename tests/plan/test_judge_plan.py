"""The judge planned where it runs (issue 43): a generative judge was "not planned (outside the policy's GPUs)" on a
1-GPU profile where no other GPU exists. The built-in engine's judge server is planned on the device it starts on
(beside local rank 0, or a node of its own in a Slurm job's group 0); NeMo-RL's is NeMo-Gym's own vLLM, which needs
GPUs outside NeMo-RL's cluster: the compiled config keeps its nodes out, and a profile too small for both is refused."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml

ONE_GPU = """
[one_gpu]
extends = "slurm_rlhf"
nodes = 1
gpus_per_node = 1
"""
ONE_NODE = """
[one_node]
extends = "slurm_rlhf"
nodes = 1
"""
TWO_NODES = """
[two_nodes]
extends = "slurm_rlhf"
nodes = 2
"""
BUILTIN = ("backend=builtin", "env.should_use_nemo_gym=false", "judge.kind=generative")


def _plan(out: str) -> tuple[dict[str, str], str]:
    """The dry run's plan table: its rows by group name, and the whole section."""
    plan = out.split("## resource plan")[1].split("## launch")[0]
    rows = {line.split("  ")[0]: line for line in plan.splitlines()[2:] if line and not line.startswith("#")}
    return rows, plan


def test_a_builtin_judge_server_is_planned_on_the_policys_gpu(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    """The step starts the judge's chat server itself (no group 0: the sbatch script has no hetjob), under local
    rank 0 on its GPU: on one GPU its memory is on the policy's device, and a judge too large for it is refused
    naming the judge server."""
    (tmp_path / "env.toml").write_text(ONE_GPU)
    r = run_cli("steps", "run", "rl/rlhf", "-c", "default", "-b", "one_gpu", *BUILTIN, "--dry-run")
    assert r.code == 0, r.err
    rows, plan = _plan(r.out)
    assert list(rows) == ["policy training"] and "judge server" in rows["policy training"], plan
    assert "node 0" in rows["policy training"] and "not planned" not in plan
    assert "#SBATCH hetjob" not in r.out
    big = run_cli("steps", "run", "rl/rlhf", "-c", "default", "-b", "one_gpu", *BUILTIN,
                  "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model=meta-llama/Llama-3.1-8B-Instruct",
                  "--dry-run")  # fmt: skip
    assert big.code == 2, big.out[-2000:]
    (line,) = big.err.strip().splitlines()
    assert "resource plan: policy training (node 0)" in line and "the largest term is judge server" in line, (
        line
    )


def test_a_vllm_judge_under_slurm_is_planned_on_its_own_node_at_its_share(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    """judge.server=vllm: group 0 of the hetjob runs `vllm serve --gpu-memory-utilization` on a node of its own, so
    the plan's judge is that node's GPU holding vLLM's share of it."""
    (tmp_path / "env.toml").write_text(ONE_GPU)
    r = run_cli("steps", "run", "rl/rlhf", "-c", "default", "-b", "one_gpu", *BUILTIN, "judge.server=vllm",
                "judge.vllm_gpu_memory_utilization=0.5", "--dry-run")  # fmt: skip
    assert r.code == 0, r.err
    rows, _ = _plan(r.out)
    assert list(rows) == ["policy training", "judge"]
    assert "#SBATCH hetjob" in r.out and "--memory 0.5" in r.out
    assert "node 1 (a node of its own)" in rows["judge"]
    assert "vLLM share (weights + KV cache) 39.8 GiB" in rows["judge"]  # half of the H100's 79.6 GiB
    assert "judge server" not in rows["policy training"]


@pytest.mark.parametrize("profile", ["slurm_rlhf", "lepton_2nodes"])
def test_nemo_rls_generative_judge_runs_on_nodes_of_its_own(
    profile: str, home: Path, tmp_path: Path, run_cli: Any
) -> None:
    """NeMo-Gym's GenRM (genrm_compare.yaml at the Gym commit NeMo-RL v0.7.0 pins: vLLM DP 2 x TP 4) is placed by Ray
    on what NeMo-RL's cluster leaves: on 2 nodes x 8 GPUs the compiled cluster is node 0 (cluster.num_nodes 1) and
    the judge node 1 (env.nemo_gym.num_gpu_nodes 1), as NeMo-RL's own 2-node RLHF recipe; the plan puts the policy
    on node 0's 8 GPUs and the judge on node 1, and the dry run has no warning. The same on Slurm and Lepton."""
    (tmp_path / "env.toml").write_text('[lepton_2nodes]\nextends = "lepton_rl"\nnodes = 2\n')
    r = run_cli("steps", "run", "rl/rlhf", "-c", "default", "-b", profile, "--dry-run")
    assert r.code == 0, r.err
    assert "warning: resource plan" not in r.out
    rows, plan = _plan(r.out)
    assert (
        rows["judge (NeMo-Gym GenRM)"].split()[3:5] == ["node", "1"]
        and " yes " in rows["judge (NeMo-Gym GenRM)"]
    )
    assert rows["policy training"].split()[2:4] == ["node", "0"]
    assert "DTensor FSDP over 8 GPUs" in plan and "1 node of its own" in plan
    compiled = yaml.safe_load(r.out.split("nemo_rl_config.yaml\n")[1].split("\n# ----")[0])
    assert compiled["cluster"] == {"num_nodes": 1, "gpus_per_node": 8}
    assert compiled["env"]["nemo_gym"]["num_gpu_nodes"] == 1


def test_a_profile_too_small_for_nemo_rls_judge_is_refused_naming_what_fits(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    """One node of 8 GPUs holds the judge's two ranks but leaves the policy none; nodes of 1 GPU cannot hold a rank
    of 4. Each is one line, exit 2; what it names then passes without a warning."""
    (tmp_path / "env.toml").write_text(ONE_GPU + ONE_NODE + TWO_NODES)
    for profile, fits in (("one_node", "use a profile of at least 2 nodes x 8 GPUs"),
                          ("lepton_rl", "use a profile of at least 2 nodes x 8 GPUs"),
                          ("one_gpu", "use a profile whose nodes have at least 4 GPUs")):  # fmt: skip
        r = run_cli("steps", "run", "rl/rlhf", "-c", "default", "-b", profile, "--dry-run")
        assert r.code == 2, r.out[-2000:]
        (line,) = r.err.strip().splitlines()
        assert line.startswith("error: NeMo-Gym's GenRM judge (vLLM DP 2 x TP 4 x PP 1") and fits in line, (
            line
        )
        # one node: the reward model's GPU leaves the policy 7 ranks, and the remedy names the prompts a step whose
        # responses they split evenly (the nearest multiple of 7 to the preset's 32), followed below
        remedy = "judge.kind=reward_model env.should_use_nemo_gym=false grpo.num_prompts_per_step=35, or"
        assert (remedy in line) == (profile != "one_gpu"), line
        assert "backend=builtin env.should_use_nemo_gym=false" in line
    # one node with a reward model judge and the preset's prompts: its GPU leaves the policy 7 data-parallel ranks,
    # which the preset's 32 x 8 responses do not split evenly; that refusal names the multiple
    rm_judge = ("judge.kind=reward_model", "env.should_use_nemo_gym=false")
    uneven = run_cli("steps", "run", "rl/rlhf", "-c", "default", "-b", "one_node", *rm_judge, "--dry-run")
    assert (
        uneven.code == 2
        and "grpo.num_prompts_per_step=32: " in uneven.err
        and "a multiple of 7" in uneven.err
    )
    for profile, *named in (("two_nodes",),
                            ("one_node", *remedy.removesuffix(", or").split()),
                            ("one_gpu", "backend=builtin", "env.should_use_nemo_gym=false")):  # fmt: skip
        ok = run_cli("steps", "run", "rl/rlhf", "-c", "default", "-b", profile, *named, "--dry-run")
        assert ok.code == 0 and "warning: resource plan" not in ok.out, (profile, ok.err[-2000:])


def test_a_genrm_too_large_for_its_vllm_share_is_refused(home: Path, tmp_path: Path, run_cli: Any) -> None:
    """NeMo-Gym's GenRM shards the judge over TP 4 at 90% of each GPU: 160B parameters are 160e9 x 2 bytes / 4 =
    74.5 GiB of bf16 weights per GPU, over the 71.7 GiB share of an H100's 79.6: refused on the judge's node."""
    judge = tmp_path / "judge_160b"
    judge.mkdir()
    rows = 160_000_000_000 // 16384  # one bf16 tensor of 160e9 parameters, declared in the header (no data)
    header = json.dumps(
        {"w": {"dtype": "BF16", "shape": [rows, 16384], "data_offsets": [0, rows * 16384 * 2]}}
    )
    (judge / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode())
    (judge / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16384, "num_attention_heads": 128,
        "num_key_value_heads": 8, "num_hidden_layers": 50, "intermediate_size": 53248, "vocab_size": 128256,
        "max_position_embeddings": 8192,
    }))  # fmt: skip
    (judge / "tokenizer.json").write_text("{}")
    key = "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model"
    r = run_cli("steps", "run", "rl/rlhf", "-c", "default", "-b", "slurm_rlhf", f"{key}={judge}", "--dry-run")
    assert r.code == 2, r.out[-2000:]
    (line,) = r.err.strip().splitlines()
    assert "resource plan: judge (NeMo-Gym GenRM) (node 1)" in line, line
    assert "the largest term is judge weights (bf16 over TP 4) (74.5 GiB)" in line, line
