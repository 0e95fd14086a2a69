"""Config schema of convert/nemo_to_hf: a .nemo (as NeMo-Aligner writes it) back into a Hugging Face
checkpoint, by NeMo's own converter script (the NeMo release NeMo-Aligner v0.7.0's image pins) in the NeMo
container."""

from typing import Literal

from pydantic import Field

from nemotron.config.stepconfig import NemoFamily, NemoPrecision, Strict


class Inputs(Strict):
    """The artifacts read: an artifact reference (name:latest, name:vN, art://...) or a path."""

    checkpoint: str | None = None
    """the .nemo to convert (checkpoint_nemo)"""
    hf_template: str | None = None
    """the Hugging Face checkpoint the .nemo came from (checkpoint_hf): NeMo's script takes its config.json
    for the output and loads its architecture; its tokenizer files are copied into the output"""


class Outputs(Strict):
    """Names the outputs are registered under in the artifact store."""

    checkpoint: str = "policy_hf"
    """artifact name of the Hugging Face checkpoint (checkpoint_hf)"""


class Convert(Strict):
    """What NeMo's converter is told (scripts/checkpoint_converters/convert_<family>_nemo_to_hf.py)."""

    family: NemoFamily | None = None
    """the model family, which picks the converter script; unset: inputs.hf_template's config.json model_type,
    refused when that is not readable here"""
    precision: NemoPrecision | None = None
    """dtype of the output weights (--precision); unset: the .nemo's own (llama, qwen2) or bf16 (mistral,
    the script's default)"""
    cpu_only: bool = False
    """load the .nemo on the CPU (--cpu-only: a model too large for one GPU, much slower); llama and qwen2
    only, mistral's script has no such switch"""


class Config(Strict):
    """convert/nemo_to_hf: a .nemo back into a Hugging Face checkpoint that every built-in step reads."""

    backend: Literal["nemo"] = "nemo"
    """who converts: NeMo's converter scripts in the NeMo container (the only converter; no CPU path)"""
    inputs: Inputs = Field(default_factory=Inputs)
    outputs: Outputs = Field(default_factory=Outputs)
    convert: Convert = Field(default_factory=Convert)
    """the converter's settings"""
