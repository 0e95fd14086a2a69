"""Training checkpoints for exact resume: weights (safetensors), optimizer, RNG streams and data position,
written atomically (temporary dir, then rename) and checked against the model and config on resume."""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from nemotron.errors import UserError, disk_full, disk_full_while
from nemotron.rl.distributed import World, barrier
from nemotron.rl.sharding import SHARDED_STATE, is_sharded, load_sharded, save_sharded
from nemotron.runtime.faults import inject
from nemotron.runtime.resume import (
    PREFIX,
    check_compatible,
    config_fingerprint,
    latest,
    model_fingerprint,
    own_checkpoint,
    resume_checkpoint,
)

if TYPE_CHECKING:
    from nemotron.config.stepconfig import Checkpointing

log = logging.getLogger("nemotron")

__all__ = [
    "Resumed",
    "config_fingerprint",
    "fingerprints",
    "latest",
    "load",
    "maybe_resume",
    "model_fingerprint",
    "resume_checkpoint",
    "save",
]


@dataclass(frozen=True)
class Resumed:
    step: int
    data_position: int
    path: Path


def save(
    root: Path,
    step: int,
    modules: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    generators: dict[str, torch.Generator],
    data_position: int,
    meta: dict[str, Any],
    keep: int = 2,
    world: World | None = None,
) -> Path:
    """Write `root/step_NNNNNN` atomically and point `root/latest` at it; keep the newest `keep`.

    With several ranks every rank calls this (it gathers each rank's random streams: the weights and optimizer
    are the same everywhere, the sampling streams are not) and rank 0 writes. Under `runtime.sharding=fsdp` the
    weights and optimizer are not the same everywhere: every rank writes its shard of them into the temporary dir
    (`sharded/`, torch.distributed.checkpoint) before rank 0 writes the rest and renames it into place.
    """
    world = world or World()
    ranks = _gather_random_state(generators, world)
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".{final.name}.tmp"
    sharded = any(is_sharded(m) for m in modules.values())
    if world.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    if sharded:
        barrier(world)  # the temporary dir exists before any rank writes into it
        save_sharded(tmp / SHARDED_STATE, modules, optimizers)
    if not world.is_main:
        return final
    try:
        _write(tmp, step, {} if sharded else modules, {} if sharded else optimizers, ranks, data_position, meta,
               world)  # fmt: skip
    except Exception as err:
        if disk_full(err, root) is None:
            raise
        shutil.rmtree(
            tmp, ignore_errors=True
        )  # the space it took goes back; `latest` still names a whole one
        needed = sum(_tensor_bytes(m.state_dict()) for m in modules.values())
        needed += sum(_tensor_bytes(o.state_dict()) for o in optimizers.values())
        raise disk_full_while(f"the checkpoint of step {step}", final, needed) from err
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    latest_tmp = root / ".latest.tmp"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, root / "latest")
    for old in sorted(root.glob(f"{PREFIX}*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _tensor_bytes(tree: Any) -> int:
    """The bytes of every tensor in a (nested) state dict."""
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(_tensor_bytes(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return sum(_tensor_bytes(v) for v in tree)
    return 0


def _write(
    tmp: Path,
    step: int,
    modules: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    ranks: Any,
    data_position: int,
    meta: dict[str, Any],
    world: World,
) -> None:
    """Every file of the checkpoint into `tmp`, flushed to disk (the modules and optimizers not written sharded)."""
    for name, module in modules.items():
        # Hugging Face format (config.json + model.safetensors): any checkpoint loads with from_pretrained.
        _hf_model(module).save_pretrained(tmp / name, safe_serialization=True)
    # Optimizer state is tensors and numbers only; it is read back with weights_only=True (no pickle code).
    inject("checkpoint", step)  # half-written: models are on disk, the rest is not
    torch.save({n: o.state_dict() for n, o in optimizers.items()}, tmp / "optimizers.pt")
    save_file({f"rank{r}.{k}": v for r, (streams, _) in enumerate(ranks) for k, v in streams.items()},
              str(tmp / "rng.safetensors"))  # fmt: skip
    info = {"step": step, "data_position": data_position, "world_size": world.size,
            "python_random": [py for _, py in ranks], **meta}  # fmt: skip
    (tmp / "state.json").write_text(json.dumps(info, indent=2))
    for f in tmp.rglob("*"):
        if f.is_file():
            with f.open("rb") as fh:
                os.fsync(fh.fileno())


def load(
    path: Path,
    modules: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    generators: dict[str, torch.Generator],
    expect: dict[str, Any],
    force: bool = False,
    world: World | None = None,
) -> Resumed:
    """Restore everything `save` wrote, each rank its own random streams.

    Refuses, unless `force`, a checkpoint of another model or config, or one written by another number of ranks
    (the sampling streams would not continue exactly; forced, ranks without a saved stream keep their fresh seed).
    """
    world = world or World()
    check_compatible(path, expect, force)
    info = json.loads((path / "state.json").read_text())
    saved_ranks = int(info.get("world_size", 1))
    if saved_ranks != world.size and not force:
        raise UserError(
            f"checkpoint {path} was written by {saved_ranks} rank(s) and this run has {world.size}: its sampling "
            "streams would not continue exactly. Resume with the same number of ranks, or set checkpoint.force=true"
        )
    if any(is_sharded(m) for m in modules.values()):
        load_sharded(path / SHARDED_STATE, modules, optimizers)
        modules, optimizers = {}, {}
    elif (path / SHARDED_STATE).is_dir():
        raise UserError(
            f"checkpoint {path} holds sharded state (runtime.sharding=fsdp); resume it with runtime.sharding=fsdp"
        )
    for name, module in modules.items():
        model = _hf_model(module)
        state = load_file(str(path / name / "model.safetensors"))
        model.load_state_dict(state, strict=False)
        missing = [k for k in model.state_dict() if k not in state and not k.endswith("lm_head.weight")]
        if missing:
            raise UserError(f"checkpoint {path} lacks weights for {name}: {sorted(missing)[:5]}")
    try:
        opt_states = torch.load(path / "optimizers.pt", weights_only=True)
    except pickle.UnpicklingError as e:
        raise UserError(
            f"{path / 'optimizers.pt'} holds more than tensors and numbers; refusing to unpickle it ({str(e).splitlines()[0]})"
        ) from None
    for name, opt in optimizers.items():
        opt.load_state_dict(opt_states[name])
    if world.rank < saved_ranks:
        rng = load_file(str(path / "rng.safetensors"))
        legacy = "world_size" not in info  # written before per-rank streams: one unprefixed set
        prefix = "" if legacy else f"rank{world.rank}."
        for name, g in generators.items():
            g.set_state(rng[f"{prefix}generator.{name}"])
        torch.set_rng_state(rng[f"{prefix}torch"])
        py = info["python_random"] if legacy else info["python_random"][world.rank]
        random.setstate(_py_state_from(py))
    return Resumed(step=int(info["step"]), data_position=int(info["data_position"]), path=path)


def _hf_model(module: torch.nn.Module) -> Any:
    """The transformers model inside: the module itself, or a wrapper's `.model` (the PPO critic)."""
    model = module if hasattr(module, "save_pretrained") else getattr(module, "model", None)
    if model is None or not hasattr(model, "save_pretrained"):
        raise TypeError(f"{type(module).__name__} is not a transformers model and wraps none")
    return model


def _gather_random_state(
    generators: dict[str, torch.Generator], world: World
) -> list[tuple[dict[str, torch.Tensor], list[Any]]]:
    """Every rank's (torch streams, python `random` state), in rank order; a collective with several ranks."""
    streams = {f"generator.{n}": g.get_state() for n, g in generators.items()}
    streams["torch"] = torch.get_rng_state()
    mine = (streams, _py_state())
    if world.size == 1:
        return [mine]
    gathered: list[Any] = [None] * world.size
    # Between this job's own ranks over their process group: the same trust as the process itself.
    dist.all_gather_object(gathered, mine)
    return gathered


def _py_state() -> list[Any]:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _py_state_from(raw: list[Any]) -> tuple[Any, ...]:
    return (raw[0], tuple(raw[1]), raw[2])


def fingerprints(record_config: dict[str, Any], policy_path: str | None) -> dict[str, str]:
    """What a checkpoint must match to be resumed: the config (less resumable keys) and the starting model (none
    for a model built from the config, which the config's fingerprint covers)."""
    if not policy_path:
        return {"config": config_fingerprint(record_config)}
    return {"config": config_fingerprint(record_config), "model": model_fingerprint(policy_path)}


def maybe_resume(
    job_dir: Path,
    step_id: str,
    checkpoint: Checkpointing,
    modules: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    generators: dict[str, torch.Generator],
    expect: dict[str, Any],
    world: World | None = None,
) -> tuple[int, int]:
    """(start step, data position): (0, 0) for a fresh run, else where the resumed checkpoint left off. A job
    whose own dir holds a checkpoint is a restart of itself (Slurm requeued or preempted it, or it requeued itself
    before its time limit): it continues from there, whatever `checkpoint.resume` says."""
    source = own_checkpoint(job_dir)
    if source is not None:
        log.info("this job ran before (a requeue or restart): continuing from its own checkpoint")
    elif not (
        checkpoint.resume is True or checkpoint.resume_from
    ):  # auto: compile set resume_from, or nothing
        return 0, 0
    else:
        source = resume_checkpoint(job_dir, step_id, checkpoint.resume_from)
    resumed = load(source, modules, optimizers, generators, expect, checkpoint.force, world)
    log.info("resumed from %s at step %d", source, resumed.step)
    return resumed.step, resumed.data_position
