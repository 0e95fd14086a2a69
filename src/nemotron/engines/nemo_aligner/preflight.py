"""NeMo-Aligner's preflight (nemotron.config.backends.PREFLIGHT_RULES): the GPU groups of its heterogeneous job,
each with the model-parallel sizes of the .nemo it loads, which the centre (nemotron.compile.preflight) divides
into the group's GPUs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from nemotron.compile.preflight import EngineChecks, Group, shape
from nemotron.models.layout import CheckpointError
from nemotron.models.nemo_checkpoint import NEMO_MODEL_CONFIG, nemo_model_config

if TYPE_CHECKING:
    from nemotron.artifacts.binding import Binding
    from nemotron.catalog import Manifest


def preflight(
    manifest: Manifest, _config: BaseModel, bindings: Sequence[Binding], nodes: int, gpus: int
) -> EngineChecks:
    """The job's GPU groups on `nodes` x `gpus` (none on a profile without GPUs); no rules of its own beyond them."""
    return EngineChecks([], _groups(manifest, bindings, nodes, gpus) if gpus >= 1 else [])


def _groups(manifest: Manifest, bindings: Sequence[Binding], nodes: int, gpus: int) -> list[Group]:
    """NeMo-Aligner v0.7.0 takes the model-parallel sizes from the .nemo's own model_config.yaml (its scripts merge
    the YAML's `model` over it: examples/nlp/gpt/train_gpt_ppo_actor.py:58, nemo_aligner/utils/utils.py:260
    load_and_override_model_config; the RL and server YAMLs set no tensor/pipeline size, gpt_sft.yaml's 1s are
    read by megatron_batch), and Megatron needs the group's trainer.num_nodes x trainer.devices to be a multiple
    of TP x PP x CP (data parallel = world / model parallel, as
    examples/nlp/synthetic_data_gen/compute_topk_logits.py:101 computes it). The groups are our het job's
    (nemotron.engines.nemo_aligner.config): each server one node, the actor the nodes left (at least one); a
    step that only serves its model serves it on every node. Which inputs they load, the manifest's [[models]]
    say."""
    by_name = {b.name: b for b in bindings}
    trained = [m for m in manifest.models if m.trained]
    actor = next((m for m in trained if m.reference), None)
    critic = any(m.role == "critic" for m in trained)
    servers = [m for m in manifest.models if not m.trained]
    places: list[tuple[str, int, bool]] = []  # (input, nodes, whether it is the actor)
    if actor is not None:
        places.append((actor.input, max(1, nodes - len(servers[:1]) - critic), True))
        places += [(m.input, 1, False) for m in servers[:1]]
    else:
        places += [(m.input, nodes, False) for m in servers[:1]]
    groups = []
    for name, group_nodes, is_actor in places:
        b = by_name.get(name)
        sizes = parallel_sizes(Path(b.path)) if b is not None and b.path else None
        if b is None or sizes is None:
            continue
        tp, pp, cp = sizes
        keys = f"{b.ref}'s {NEMO_MODEL_CONFIG}"
        where = f"{shape(group_nodes, gpus)} of the profile's {shape(nodes, gpus)}"
        if is_actor:
            groups.append(Group("actor (policy)", keys, tp, pp, cp, group_nodes * gpus, where))
        else:
            groups.append(Group("reward model server", keys, tp, pp, cp, group_nodes * gpus, where))
            if critic:  # the critic restores from the reward model (serve_ppo_critic.py)
                critic_where = f"{shape(1, gpus)} of the profile's {shape(nodes, gpus)}"
                groups.append(Group("critic server", keys, tp, pp, cp, gpus, critic_where))
    return groups


def parallel_sizes(path: Path) -> tuple[int, int, int] | None:
    """(tensor, pipeline, context) from a local .nemo's model config; None when it is not here or not readable
    (the centre's unloadable-input check reports the latter)."""
    try:
        config = nemo_model_config(path)
    except CheckpointError:
        return None
    if config is None:
        return None
    tensor, pipeline, context = (
        int(config.get(f"{k}_parallel_size") or 1) for k in ("tensor_model", "pipeline_model", "context")
    )
    return tensor, pipeline, context
