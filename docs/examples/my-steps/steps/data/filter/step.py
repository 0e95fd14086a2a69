"""Example step: keep the short prompts. `main()` reads top to bottom: config -> inputs -> work -> output -> register."""

import json
import os
from pathlib import Path

from nemotron.runtime.step import StepRun


def main() -> None:
    # ---- setup: the validated config
    run = StepRun.start(__file__)
    cfg = run.config

    # ---- inputs and work
    lines = Path(cfg.inputs.prompts).read_text().splitlines()
    kept = [
        line
        for line in lines
        if line.strip() and len(json.loads(line)["prompt"].split()) <= cfg.filter.max_words
    ]
    run.log_metrics(1, {"kept": len(kept), "dropped": len(lines) - len(kept)})
    print(f"step 1/1 kept={len(kept)} dropped={len(lines) - len(kept)}", flush=True)

    # ---- output and register
    out = run.output_dir("prompts").with_suffix(".jsonl")
    tmp = out.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, out)  # never a half-written output
    run.register_outputs({"prompts": out})


if __name__ == "__main__":  # importing the module does nothing; `nemotron steps run` runs it as __main__
    main()
