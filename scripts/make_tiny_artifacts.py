"""Rebuild the tiny artifacts shipped in src/nemotron/shipped/tiny/ (what the `-c tiny` presets read as pkg://tiny/...).

They are made by our own tiny pipeline (data/prep -> sft -> rm/train), in a scratch $NEMOTRON_HOME, and copied in
with a PROVENANCE.json that records each file's sha256, the producing step, preset and config hash:

    python scripts/make_tiny_artifacts.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEST = ROOT / "src" / "nemotron" / "shipped" / "tiny"
# shipped name -> artifact name the tiny pipeline registers
ARTIFACTS = {
    "prompts.jsonl": "tiny_prompts",
    "validation_prompts.jsonl": "tiny_validation_prompts",
    "sft.jsonl": "tiny_sft_data",
    "preferences.jsonl": "tiny_preferences",
    "sft_policy": "tiny_sft_policy",
    "reward_model": "tiny_reward_model",
}


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="nemotron-tiny-"))
    env = {**os.environ, "NEMOTRON_HOME": str(home)}
    subprocess.run(
        [sys.executable, "-m", "nemotron", "pipeline", "run", "tiny", "--until", "rm"],
        env=env,
        check=True,
        cwd=home,
    )
    os.environ["NEMOTRON_HOME"] = str(home)
    from nemotron.artifacts.store import ArtifactStore

    store = ArtifactStore(home / "artifacts")
    tmp = DEST.with_name(".tiny.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    provenance = {}
    for shipped, name in ARTIFACTS.items():
        art = store.resolve(name)
        src = Path(art.path)
        if src.is_dir():
            shutil.copytree(src, tmp / shipped)
        else:
            shutil.copy2(src, tmp / shipped)
        provenance[shipped] = {
            "artifact": art.ref,
            "type": art.type,
            "sha256": art.sha256,
            "step": art.metadata.get("step"),
            "preset": art.metadata.get("preset"),
            "config_hash": art.metadata.get("config_hash"),
        }
    (tmp / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n")
    shutil.rmtree(DEST, ignore_errors=True)
    os.rename(tmp, DEST)
    shutil.rmtree(home, ignore_errors=True)
    print(f"wrote {DEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
