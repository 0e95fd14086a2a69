"""Our training JSONL as an external engine's data files, written in the job dir on the cluster before its trainer
starts: `python data_files.py KIND DATA TRAIN VALIDATION EVERY [HELD_OUT]`. Every EVERY-th non-blank record is held
out to VALIDATION (`every_nth`; the engines take validation sets from files; 0: none), the rest go to TRAIN. The split
is deterministic, so a requeued job holds out the same records. HELD_OUT, a file of the user's own held-out records
(EVERY 0), is converted to VALIDATION instead.

Standard library only, and nothing imported from nemotron: NeMo-RL's container has no nemotron, so its engine
writes this very file into the job dir and runs it there; NeMo-Aligner's runs it as
`python -m nemotron.engines.data_files`. Rows are read as nemotron.data.records reads them (a prompt is a string or
a conversation, a list of {role, content}; chosen/rejected may be named chosen_response/rejected_response).

KIND:
- messages (NeMo-RL SFT): {"messages": [the prompt's turns, {"role": "assistant", "content": response}]}, the
  column ResponseDataset takes as it is (nemo_rl/data/datasets/response_datasets/response_dataset.py).
- pairs (NeMo-RL reward model): {"prompt", "chosen", "rejected"}, BinaryPreferenceDataset's default keys (a
  conversation prompt stays a list: it reads one as the context's turns).
- sft_text (NeMo-Aligner SFT): {"prompt": text, "response"}, read through model.data.*.prompt_template.
- rm_text (NeMo-Aligner reward model): the chosen text then the rejected one, {"text": prompt + response} each, the
  line pairs RewardModelDataset reads (nemo_aligner/data/nlp/datasets.py:196).
- dpo_text (NeMo-Aligner DPO): {"prompt": text, "chosen_response", "rejected_response"}, the keys DPOModelDataset
  reads (a string prompt is joined to each response as it is), with the record's chosen_reward and
  rejected_reward when it has them (the RPO losses' ground truth; the dataset takes 1 and 0 for absent ones)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def every_nth(fraction: float) -> int:
    """The EVERY that holds out `fraction` of the records: round(1 / fraction), at least 2; 0 holds out none."""
    return max(2, round(1 / fraction)) if fraction > 0 else 0


def turns(prompt: Any) -> list[dict[str, str]]:
    if isinstance(prompt, list):
        return [{"role": m["role"], "content": m["content"]} for m in prompt]
    return [{"role": "user", "content": str(prompt)}]


def prompt_text(prompt: Any) -> str:
    """A conversation's turns as `role: content` lines (nemotron.data.records.prompt_text)."""
    return (
        prompt
        if isinstance(prompt, str)
        else "\n".join(f"{m['role']}: {m['content']}" for m in turns(prompt))
    )


def pair(row: dict[str, Any]) -> tuple[str, str]:
    """(chosen, rejected), under either of the names nemotron.data.records.PreferenceRecord accepts."""
    chosen = row["chosen"] if "chosen" in row else row["chosen_response"]
    return str(chosen), str(row["rejected"] if "rejected" in row else row["rejected_response"])


def messages(row: dict[str, Any]) -> str:
    return json.dumps(
        {"messages": [*turns(row["prompt"]), {"role": "assistant", "content": row["response"]}]}
    )


def pairs(row: dict[str, Any]) -> str:
    chosen, rejected = pair(row)
    return json.dumps({"prompt": row["prompt"], "chosen": chosen, "rejected": rejected})


def sft_text(row: dict[str, Any]) -> str:
    return json.dumps({"prompt": prompt_text(row["prompt"]), "response": row["response"]})


def rm_text(row: dict[str, Any]) -> str:
    """The prompt followed by each response, as the built-in engine joins them."""
    prompt, (chosen, rejected) = prompt_text(row["prompt"]), pair(row)
    return json.dumps({"text": prompt + chosen}) + "\n" + json.dumps({"text": prompt + rejected})


def dpo_text(row: dict[str, Any]) -> str:
    chosen, rejected = pair(row)
    rewards = {k: row[k] for k in ("chosen_reward", "rejected_reward") if row.get(k) is not None}
    return json.dumps(
        {
            "prompt": prompt_text(row["prompt"]),
            "chosen_response": chosen,
            "rejected_response": rejected,
            **rewards,
        }
    )


KINDS: dict[str, Callable[[dict[str, Any]], str]] = {
    "messages": messages,
    "pairs": pairs,
    "sft_text": sft_text,
    "rm_text": rm_text,
    "dpo_text": dpo_text,
}


def split(
    lines: Iterable[str], every: int, convert: Callable[[dict[str, Any]], str]
) -> Iterator[tuple[bool, str]]:
    """(held out, its output lines) per non-blank record."""
    n = 0
    for line in lines:
        if line.strip():
            n += 1
            yield every > 0 and n % every == 0, convert(json.loads(line)) + "\n"


def main(argv: list[str]) -> int:
    kind, data, train, validation, every = argv[0], argv[1], argv[2], argv[3], int(argv[4])
    held = argv[5] if len(argv) > 5 else None  # the user's own held-out file: nothing is held out of DATA
    counts = [0, 0]
    with open(train, "w") as t, open(validation, "w") as v:
        sources = [(data, 0 if held else every, False)] + ([(held, 0, True)] if held else [])
        for source, nth, all_held in sources:
            with open(source) as src:
                for held_out, out in split(src, nth, KINDS[kind]):
                    (v if held_out or all_held else t).write(out)
                    counts[held_out or all_held] += 1
    print(
        f"data_files {kind}: {counts[0]} records to {train}, {counts[1]} held out to {validation}", flush=True
    )
    # no record to train on, or none held out when some should be: fail here, not inside the trainer
    return 0 if counts[0] and (counts[1] or (every == 0 and not held)) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
