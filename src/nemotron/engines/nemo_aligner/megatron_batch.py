"""The batch rule Megatron-Core asserts when a NeMo-Aligner trainer starts, checked on the compiled groups.

Megatron's micro-batch calculator (megatron/core/num_microbatches_calculator.py, which NeMo's MegatronGPTModel sets
up with the model's global and micro batch and the data-parallel size) asserts that the global batch is a multiple
of micro batch x data parallel, data parallel being the group's GPUs over TP x PP x CP. A job that breaks it queues,
starts its servers and dies in the trainer's set-up; here it is refused at compile. The sizes are the ones the
trainer runs with: NeMo-Aligner merges its YAML's `model` over the .nemo's own config (nemo_aligner/utils/utils.py
load_and_override_model_config), so a YAML that sets them wins (gpt_sft.yaml sets 1, 1, 1 at v0.7.0; the other
trainer YAMLs set none and the .nemo's count). A .nemo that is not on this machine cannot be read: no check."""

from __future__ import annotations

from pathlib import Path

from nemotron.engines.nemo_aligner.preflight import parallel_sizes
from nemotron.engines.nemo_aligner.scripts import AlignerRun, Script

RESTORE_KEYS = ("pretrained_checkpoint.restore_from_path", "model.restore_from_path")
GLOBAL_KEYS = ("model.global_batch_size", "model.data.train_ds.global_batch_size")
MICRO_KEYS = ("model.micro_batch_size", "model.data.train_ds.micro_batch_size")
# what the tag's trainer YAMLs give a key we do not override (examples/nlp/gpt/conf at v0.7.0)
YAML_MICRO = {"training_rm.yaml": 2, "gpt_sft.yaml": 1, "gpt_dpo.yaml": 1}
YAML_PARALLEL = {"gpt_sft.yaml": (1, 1, 1)}  # model.{tensor_model,pipeline_model,context}_parallel_size


def batch_problems(run: AlignerRun, gpus_per_node: int) -> list[str]:
    """One line for each training group of `run` whose global batch Megatron would refuse (servers that only
    score are skipped: they set no global batch)."""
    return [p for s in run.groups if (p := _problem(s, max(gpus_per_node, 1))) is not None]


def _problem(script: Script, gpus_per_node: int) -> str | None:
    given = dict(script.overrides)
    global_key = next((k for k in GLOBAL_KEYS if k in given), None)
    if global_key is None:
        return None
    restore = next((str(given[k]) for k in RESTORE_KEYS if k in given), "")
    sizes = YAML_PARALLEL.get(script.yaml) or (parallel_sizes(Path(restore)) if restore else None)
    if sizes is None:
        return None  # the .nemo is on the cluster: its sizes are not known here
    source = f"{script.yaml}'s" if script.yaml in YAML_PARALLEL else f"{restore}'s"
    tp, pp, cp = sizes
    gpus = script.nodes * gpus_per_node
    if gpus % (tp * pp * cp):
        return None  # the preflight's group check names the sizes that do not divide
    dp = gpus // (tp * pp * cp)
    micro_key = next((k for k in MICRO_KEYS if k in given), None)
    micro = int(given[micro_key]) if micro_key else YAML_MICRO.get(script.yaml, 1)
    micro_from = micro_key or f"{script.yaml}'s model.micro_batch_size"
    total = int(given[global_key])
    if total % (micro * dp) == 0:
        return None
    return (
        f"NeMo-Aligner's {script.role}: global batch {total} ({global_key}) is not a multiple of micro batch "
        f"{micro} ({micro_from}) x data parallel {dp} ({gpus} GPUs over {source} TP {tp} x PP {pp} x CP {cp}); "
        "Megatron asserts it when the trainer starts"
    )
