"""What NeMo v2.1.0's checkpoint converters accept, encoded as data from a reading of the tag's
scripts/checkpoint_converters/convert_*.py: each script's argparse arguments as its `add_argument` calls declare
them (first name -> the names, and the source text of type, default, required and action).

v2.1.0 is the NEMO_TAG of NeMo-Aligner v0.7.0's Dockerfile (commit 633cb602777bffefbe12066b0c915c87e7b469e9).
test_nemo_convert.py parses every command line we compile with a parser built from this data, and, when the
mirror is on disk, re-reads the real files at the tag (and at IMAGE_TAG, the NeMo of the image we run in) so the
data cannot drift from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MIRROR = Path("/work/.mirror/NVIDIA+NeMo/repo")
TAG = "v2.1.0"
PINNED_COMMIT = "633cb602777bffefbe12066b0c915c87e7b469e9"
ALIGNER_MIRROR = Path("/work/.mirror/NVIDIA+NeMo-Aligner/repo")
ALIGNER_TAG = "v0.7.0"
# nvcr.io/nvidia/nemo:25.02 (nemotron.config.targets.NEMO_ALIGNER_IMAGE) carries the NeMo 2.2 line: every argument we
# use must mean the same there
IMAGE_TAG = "v2.2.1"
DIR = "scripts/checkpoint_converters"

_IN = {"names": ["--input_name_or_path"], "type": "str", "default": "None", "required": "True"}
_OUT = {"names": ["--output_path"], "type": "str", "default": "None", "required": "True"}


def _hparams(family: str) -> dict[str, Any]:
    conf = f"'../../examples/nlp/language_modeling/conf/megatron_{family}_config.yaml'"
    default = f"os.path.join(os.path.dirname(__file__), {conf})"
    return {"names": ["--hparams_file"], "type": "str", "default": default, "required": "False"}


def _optional(name: str, default: str = "None") -> dict[str, Any]:
    return {"names": [name], "type": "str", "default": default}


_NEMO_TO_HF = {
    "--input_name_or_path": _IN,
    "--output_path": _OUT,
    "--hf_input_path": _optional("--hf_input_path"),
    "--hf_output_path": _optional("--hf_output_path"),
    "--input_tokenizer": _optional("--input_tokenizer"),
    "--hf_output_tokenizer": _optional("--hf_output_tokenizer"),
    "--precision": _optional("--precision"),
    "--cpu-only": {"names": ["--cpu-only"], "action": "'store_true'"},
}

# script name -> {first option name: its declaration}
ARGS: dict[str, dict[str, dict[str, Any]]] = {
    "convert_llama_hf_to_nemo.py": {
        "--input_name_or_path": _IN,
        "--output_path": _OUT,
        "--hparams_file": _hparams("llama"),
        "--llama31": {"names": ["--llama31"], "type": "bool", "default": "True", "required": "False"},
        "--precision": _optional("--precision", "'16'"),
    },
    "convert_llama_nemo_to_hf.py": _NEMO_TO_HF,
    "convert_qwen2_hf_to_nemo.py": {
        "--input_name_or_path": _IN,
        "--output_path": _OUT,
        "--hparams_file": _hparams("qwen2"),
        "--precision": _optional("--precision", "'16'"),
    },
    "convert_qwen2_nemo_to_hf.py": _NEMO_TO_HF,
    "convert_mistral_7b_hf_to_nemo.py": {
        "--input_name_or_path": _IN,
        "--output_path": _OUT,
        "--precision": _optional("--precision", "'bf16'"),
        "--low-ram": {"names": ["--low-ram", "--low-mem"], "action": "'store_true'"},
        "--tmp-dir": {"names": ["--tmp-dir"], "default": "'/tmp/mistral_ckpt_parts/'"},
    },
    "convert_mistral_7b_nemo_to_hf.py": {
        "--input_name_or_path": _IN,
        "--output_path": _OUT,
        "--hf_model_name": _optional("--hf_model_name", "'mistralai/Mistral-7B-v0.1'"),
        "--precision": _optional("--precision", "'bf16'"),
    },
}
