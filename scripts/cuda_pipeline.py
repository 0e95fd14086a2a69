"""Write a copy of a pipeline file whose steps train on CUDA in bf16-mixed (scripts/gpu-check.sh):
`python scripts/cuda_pipeline.py SRC.toml DST.toml`. data/ steps have no runtime and stay as they are."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

CUDA = ["runtime.device=cuda", "runtime.precision=bf16-mixed"]


def _value(v: Any) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_value(x)}" for k, x in v.items()) + " }"
    return json.dumps(v)  # strings, lists of strings: JSON's escapes are TOML's


def cuda_pipeline(src: Path, dst: Path) -> None:
    pipe = tomllib.loads(src.read_text())
    info = {**pipe["pipeline"], "name": f"{pipe['pipeline']['name']}-cuda"}
    lines = ["[pipeline]", *(f"{k} = {_value(v)}" for k, v in info.items())]
    for step in pipe["steps"]:
        if not step["step"].startswith("data/"):
            step = {**step, "overrides": [*step.get("overrides", []), *CUDA]}
        lines += ["", "[[steps]]", *(f"{k} = {_value(v)}" for k, v in step.items())]
    dst.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    cuda_pipeline(Path(sys.argv[1]), Path(sys.argv[2]))
