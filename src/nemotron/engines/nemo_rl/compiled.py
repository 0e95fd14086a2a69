"""What a NeMo-RL recipe compiler returns: the entry, its base YAML, our keys over it, and what to convert after."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Compiled:
    entry: str
    base: str
    config: dict[str, Any]
    conversions: list[
        tuple[str, str | None, str]
    ]  # (component, converter config file or None, our output name)
    extra_files: dict[str, dict[str, Any]]
    megatron: bool  # nemo_rl.policy_backend: which converter turns the checkpoints into HF ones
    # the arguments of nemotron.engines.data_files, run on the head before the entry: the data files it reads
    prepare: tuple[str, ...] = ()
