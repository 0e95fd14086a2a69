"""Our training JSONL as NeMo-Aligner v0.7.0's data files, written in the job dir on the cluster before the trainer
starts (`python -m nemotron.engines.nemo_aligner.data_files KIND DATA TRAIN VALIDATION EVERY`, KIND sft or rm).

- sft: GPTSFTDataset reads each row's columns through model.data.*.prompt_template ("{prompt}{response}"), so a
  row stays {"prompt", "response"}; a conversation prompt becomes its turns as text (`role: content` lines).
- rm: RewardModelDataset (nemo_aligner/data/nlp/datasets.py:196) reads a JSONL whose even lines are the chosen
  texts and odd lines the rejected ones, each {"text": prompt + response}.

Every EVERY-th record is held out to VALIDATION (nemotron.engines.held_out's rule), the rest go to TRAIN. Standard
library only: it runs in the NeMo container with nemotron on the path."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def prompt_text(prompt: Any) -> str:
    """A prompt as text: a conversation's turns as `role: content` lines (nemotron.data.records.prompt_text)."""
    if isinstance(prompt, list):
        return "\n".join(f"{m['role']}: {m['content']}" for m in prompt)
    return str(prompt)


def sft_lines(row: dict[str, Any]) -> str:
    return json.dumps({"prompt": prompt_text(row["prompt"]), "response": row["response"]}) + "\n"


def rm_lines(row: dict[str, Any]) -> str:
    """The chosen text then the rejected one: the prompt followed by each response, as the built-in engine joins
    them."""
    prompt = prompt_text(row["prompt"])
    return (
        json.dumps({"text": prompt + row["chosen"]})
        + "\n"
        + json.dumps({"text": prompt + row["rejected"]})
        + "\n"
    )


KINDS: dict[str, Callable[[dict[str, Any]], str]] = {"sft": sft_lines, "rm": rm_lines}


def split(
    lines: Iterable[str], every: int, convert: Callable[[dict[str, Any]], str]
) -> Iterator[tuple[bool, str]]:
    """(held out, its output lines) per non-blank record."""
    n = 0
    for line in lines:
        if line.strip():
            n += 1
            yield n % every == 0, convert(json.loads(line))


def main(argv: list[str]) -> int:
    kind, data, train, validation, every = argv[0], argv[1], argv[2], argv[3], int(argv[4])
    counts = [0, 0]
    with open(data) as src, open(train, "w") as t, open(validation, "w") as v:
        for held_out, out in split(src, every, KINDS[kind]):
            (v if held_out else t).write(out)
            counts[held_out] += 1
    print(
        f"data_files {kind}: {counts[0]} records to {train}, {counts[1]} held out to {validation}", flush=True
    )
    return 0 if all(counts) else 1  # no record on either side: fail here, not inside the trainer


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
