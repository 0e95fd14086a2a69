"""Config schema of convert/hf_to_nemo: a Hugging Face causal LM into a .nemo, by NeMo's own converter script
(the NeMo release NeMo-Aligner v0.7.0's image pins) in the NeMo container on Slurm."""

from typing import Literal

from pydantic import Field

from nemotron.config.stepconfig import NemoFamily, NemoPrecision, Strict


class Inputs(Strict):
    """The artifact converted: an artifact reference (name:latest, name:vN, art://...) or a path."""

    checkpoint: str | None = None
    """the Hugging Face checkpoint to convert (checkpoint_hf): config.json, weights and tokenizer. The .nemo
    names this directory as its tokenizer, so it must stay where it is"""


class Outputs(Strict):
    """Names the outputs are registered under in the artifact store."""

    checkpoint: str = "policy_nemo"
    """artifact name of the .nemo (checkpoint_nemo)"""


class Convert(Strict):
    """What NeMo's converter is told (scripts/checkpoint_converters/convert_<family>_hf_to_nemo.py)."""

    family: NemoFamily | None = None
    """the checkpoint's model family, which picks the converter script; unset: config.json's model_type,
    refused when the checkpoint is not readable here (a path on the cluster, a pipeline's planned output)"""
    precision: NemoPrecision = "bf16"
    """dtype of the .nemo's weights (--precision; NeMo falls back to 16 where the GPU has no bf16)"""
    llama31: bool | None = None
    """family llama only: the checkpoint uses Llama 3.1's RoPE scaling (config.json rope_scaling.rope_type
    "llama3"); sets --llama31, whose default in NeMo's script is true. Unset: read from config.json, refused
    when that is not readable here"""


class Config(Strict):
    """convert/hf_to_nemo: a Hugging Face causal LM into a .nemo that NeMo-Aligner reads."""

    backend: Literal["nemo"] = "nemo"
    """who converts: NeMo's converter scripts in the NeMo container (the only converter; no CPU path)"""
    inputs: Inputs = Field(default_factory=Inputs)
    outputs: Outputs = Field(default_factory=Outputs)
    convert: Convert = Field(default_factory=Convert)
    """the converter's settings"""
