"""The weights of an HF checkpoint as safetensors, run in the job dir after NeMo-RL's DCP converter:
`python to_safetensors.py HF_DIR`.

NeMo-RL v0.7.0's examples/converters/convert_dcp_to_hf.py (nemo_rl/utils/native_checkpoint.py, convert_dcp_to_hf)
writes the weights as `pytorch_model.bin`, a pickle, where nemotron registers safetensors only (loading a pickle
runs code). This reads that file with torch's weights-only unpickler (tensors and containers, nothing callable),
writes it as safetensors with huggingface_hub's writer (shards and an index past 5 GB, tied tensors once, as
`save_pretrained` does) and removes the pickle. Its Megatron converter writes safetensors already.

Nothing imported from nemotron: NeMo-RL's container has no nemotron, so its engine writes this very file into the
job dir and runs it with NeMo-RL's Python (torch and huggingface_hub come with its transformers)."""

from __future__ import annotations

import sys
from pathlib import Path

PICKLE = "pytorch_model.bin"


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    pickle = folder / PICKLE
    if not pickle.is_file():
        if any(folder.glob("*.safetensors")):
            return 0  # a converter that writes safetensors
        print(f"to_safetensors: neither {PICKLE} nor safetensors in {folder}", file=sys.stderr)
        return 1
    import torch
    from huggingface_hub import save_torch_state_dict

    state = torch.load(pickle, map_location="cpu", weights_only=True)
    if set(state) == {"model"}:  # a DCP export wrapped as {"model": ...} (the converter unwraps it; so do we)
        state = state["model"]
    if not state or not all(isinstance(t, torch.Tensor) for t in state.values()):
        print(f"to_safetensors: {pickle} is not a flat state dict of tensors", file=sys.stderr)
        return 1
    save_torch_state_dict(state, folder)
    pickle.unlink()
    print(f"to_safetensors: {folder}: {len(state)} tensors as safetensors", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
