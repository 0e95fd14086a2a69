"""What group 0 of a heterogeneous Slurm job serves beside the step, read from the compiled job: the reward model
(manifest `services = ["rm/serve"]`, an input whose type is a reward_model_hf) or the generative judge on `vllm serve`
(`judge.kind: generative` with `judge.server: vllm` and no `judge.url`). Pure: no torch, no vllm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, NamedTuple

from nemotron.compile import Job

REWARD_MODEL_TYPE = "reward_model_hf"
JUDGE_INPUT = "judge"


class ServedModel(NamedTuple):
    """The model group 0 serves: `rm` runs nemotron.reward.server (KServe v2), `vllm` runs `vllm serve` (OpenAI)."""

    input_name: str
    path: str  # a path on the cluster, or a hub id for vllm
    max_length: int | None = None  # the model's positions, when known here
    server: Literal["rm", "vllm"] = "rm"
    memory: float | None = None  # vllm: --gpu-memory-utilization (judge.vllm_gpu_memory_utilization)

    @property
    def what(self) -> str:
        return "vllm serve (the judge)" if self.server == "vllm" else "the reward server"


def served_model(job: Job) -> ServedModel | None:
    """None: no server group (the step starts its own beside it, or has none)."""
    return vllm_judge(job) or reward_model(job)


def vllm_judge(job: Job) -> ServedModel | None:
    """A generative judge for `vllm serve`: the `judge` input, when the job's config asks vLLM to serve it and gives
    no URL of a running server."""
    judge: dict[str, Any] = job.config_tree.get("judge") or {}
    if judge.get("kind") != "generative" or judge.get("server") != "vllm" or judge.get("url"):
        return None
    for b in job.bindings:
        if b.name == JUDGE_INPUT:
            memory = float(judge.get("vllm_gpu_memory_utilization") or 0.3)
            return ServedModel(b.name, b.path or b.ref, server="vllm", memory=memory)
    return None


def reward_model(job: Job) -> ServedModel | None:
    """The reward model rm/serve serves, when the manifest asks for it: the input whose declared, bound or
    detected type is a reward_model_hf."""
    if not job.services:  # the manifest names no server to start beside the step
        return None
    from nemotron.artifacts.typecheck import detect_type

    catalog = job.catalog
    for b in job.bindings:
        if b.path is None:
            continue
        local = Path(b.path)
        kinds = [b.expected_type, b.actual_type or ""] + (
            [detect_type(local, catalog) or ""] if local.is_dir() else []
        )
        if any(k and catalog.is_a(k, REWARD_MODEL_TYPE) for k in kinds):
            return ServedModel(b.name, b.path, positions(local))
    return None


def positions(model_dir: Path, cap: int = 512) -> int | None:
    """The model's context length, capped at the server's default (the server refuses a longer max_length)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    found = config.get("n_positions") or config.get("max_position_embeddings")
    return min(int(found), cap) if found else None
