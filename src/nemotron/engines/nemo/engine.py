"""The NeMo converter engine (backend=nemo): convert/hf_to_nemo and convert/nemo_to_hf as NeMo's own
scripts/checkpoint_converters/ at the release NeMo-Aligner v0.7.0's image pins (`nemotron.config.targets.NEMO_VERSION`),
one task in the NeMo container on Slurm: the same image NeMo-Aligner runs in, so the .nemo written is one its NeMo
reads. There is no CPU path: the scripts need NeMo (Megatron-Core, Transformer Engine), which only that container
has.

Every argument is one the tag's argparse declares (tests/engines/test_nemo_convert.py parses our words with the
real scripts' arguments). A family the tag has no converter for in both directions is refused (exit 2)."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemotron.compile import Job
from nemotron.config.targets import NEMO_ALIGNER_IMAGE, NEMO_DIR, NEMO_VERSION
from nemotron.engines.base import HetGroup, HetJob, Launch, pinned_or_profile, recipe_for
from nemotron.errors import UserError
from nemotron.plan.placement import Placement

CONVERTERS = "scripts/checkpoint_converters"  # under the NeMo checkout
# our family (config.json's model_type) -> the script's family word: convert_<word>_{hf_to_nemo,nemo_to_hf}.py
SCRIPT_FAMILY = {"llama": "llama", "qwen2": "qwen2", "mistral": "mistral_7b"}
# the files of a Hugging Face tokenizer; llama's and qwen2's nemo_to_hf write none (their --input_tokenizer reads
# a sentencepiece model only), so the template's are copied beside the converted weights
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


@dataclass(frozen=True)
class ConvertRun:
    """One converter invocation: `script` (under the NeMo checkout) with `args`, then `finalize` (shell) once it
    succeeded; `outputs` maps our output name to the path the run leaves it at."""

    script: str
    args: tuple[str, ...]
    outputs: dict[str, str]
    finalize: str = ""
    notes: tuple[str, ...] = ()


def _local_config(path: str | None) -> dict[str, Any] | None:
    """config.json of a checkpoint directory readable here; None for a path on the cluster (or a planned one)."""
    from nemotron.models.layout import CheckpointError, read_config

    if not path or not Path(path).is_dir():
        return None
    try:
        return read_config(Path(path))
    except CheckpointError as err:
        raise UserError(str(err)) from None


def _family(step_id: str, given: str | None, config: dict[str, Any] | None, what: str) -> str:
    """The family NeMo's script is picked by: the key, checked against config.json where that is readable."""
    found = str(config.get("model_type", "")) if config is not None else None
    if found is not None and found not in SCRIPT_FAMILY:
        raise UserError(
            f"{step_id}: {what} is a {found or 'model_type-less'} checkpoint; NeMo {NEMO_VERSION}'s converters "
            f"(both directions) take {', '.join(SCRIPT_FAMILY)} only"
        )
    if given is not None and found is not None and given != found:
        raise UserError(f"{step_id}: convert.family={given}, but {what}'s config.json says {found}")
    family = given or found
    if family is None:
        raise UserError(
            f"{step_id}: {what} is not readable here, so its family is unknown: set convert.family "
            f"({', '.join(SCRIPT_FAMILY)})"
        )
    return family


def _uses_llama31_rope(config: dict[str, Any]) -> bool:
    scaling = config.get("rope_scaling") or {}
    return str(scaling.get("rope_type") or scaling.get("type") or "") == "llama3"


def compile_hf_to_nemo(step: str, c: dict[str, Any], job_dir: str) -> ConvertRun:
    source = c["inputs"]["checkpoint"]
    hf = _local_config(source)
    conv = c["convert"]
    family = _family(step, conv["family"], hf, "inputs.checkpoint")
    out = f"{job_dir}/checkpoint.nemo"
    args = [f"--input_name_or_path={source}", f"--output_path={out}", f"--precision={conv['precision']}"]
    if family == "llama":
        llama31 = conv["llama31"]
        if hf is not None:
            found = _uses_llama31_rope(hf)
            if llama31 is not None and llama31 != found:
                raise UserError(
                    f"{step}: convert.llama31={str(llama31).lower()}, but inputs.checkpoint's config.json "
                    f"{'has' if found else 'has no'} Llama 3.1 RoPE scaling (rope_scaling.rope_type llama3)"
                )
            llama31 = found
        if llama31 is None:
            raise UserError(
                f"{step}: inputs.checkpoint is not readable here, so whether it uses Llama 3.1's RoPE scaling is "
                "unknown: set convert.llama31 (true for Llama 3.1 and later, false otherwise)"
            )
        # NeMo's --llama31 is `type=bool`: any non-empty word is true, so false is the empty word
        args.append("--llama31=True" if llama31 else "--llama31=")
    elif conv["llama31"] is not None:
        raise UserError(f"{step}: convert.llama31 acts on family llama only (this is {family})")
    script = f"{CONVERTERS}/convert_{SCRIPT_FAMILY[family]}_hf_to_nemo.py"
    note = f"the .nemo names {source} as its tokenizer: keep that checkpoint where it is"
    return ConvertRun(script, tuple(args), {"checkpoint": out}, notes=(note,))


def compile_nemo_to_hf(step: str, c: dict[str, Any], job_dir: str) -> ConvertRun:
    source, template = c["inputs"]["checkpoint"], c["inputs"]["hf_template"]
    conv = c["convert"]
    family = _family(step, conv["family"], _local_config(template), "inputs.hf_template")
    out = f"{job_dir}/checkpoint_hf"
    script = f"{CONVERTERS}/convert_{SCRIPT_FAMILY[family]}_nemo_to_hf.py"
    precision = [f"--precision={conv['precision']}"] if conv["precision"] else []
    if family == "mistral":
        if conv["cpu_only"]:
            raise UserError(f"{step}: convert.cpu_only: NeMo's mistral converter has no --cpu-only")
        # this script writes the whole directory itself, the tokenizer taken from --hf_model_name (a path works:
        # it reads it with from_pretrained)
        words = (f"--input_name_or_path={source}", f"--output_path={out}", f"--hf_model_name={template}")
        return ConvertRun(script, (*words, *precision), {"checkpoint": out})
    args = (
        f"--input_name_or_path={source}",
        # the bare weights the script writes first; --hf_input_path/--hf_output_path then make the directory
        f"--output_path={job_dir}/nemo_weights/pytorch_model.bin",
        f"--hf_input_path={template}",
        f"--hf_output_path={out}",
        *precision,
        *(["--cpu-only"] if conv["cpu_only"] else []),
    )
    copy = " ".join(TOKENIZER_FILES)
    src, dst = shlex.quote(template), shlex.quote(out)
    finalize = f'for f in {copy}; do if [ -e {src}/"$f" ]; then cp {src}/"$f" {dst}/ || exit 1; fi; done\n'
    return ConvertRun(script, args, {"checkpoint": out}, finalize)


def compile_convert(step_id: str, step_config: dict[str, Any], job_dir: str) -> ConvertRun:
    """Our resolved step config (input refs already paths) -> NeMo's converter invocation."""
    recipe = recipe_for(step_id, "nemo", "NeMo converter")
    return RECIPES[recipe](step_id, step_config, job_dir)


# recipe (a manifest's `engines.nemo`) -> its compiler
RECIPES: dict[str, Callable[[str, dict[str, Any], str], ConvertRun]] = {
    "hf_to_nemo": compile_hf_to_nemo,
    "nemo_to_hf": compile_nemo_to_hf,
}


class NemoConvertEngine:
    name = "nemo"

    def launch(self, job: Job, where: Placement) -> Launch:
        # the image NeMo-Aligner runs in (a profile's nemo_aligner_image too): its NeMo reads what we write
        image = pinned_or_profile(job, "nemo_aligner_image", NEMO_ALIGNER_IMAGE)
        nemo = pinned_or_profile(job, "nemo_dir", NEMO_DIR) or NEMO_DIR
        run = compile_convert(job.step_id, job.step_config, where.job_dir)
        python = str(getattr(job.profile, "python", None) or "python")
        # one task: the scripts convert on one process (a Trainer of one device), whatever the profile's GPUs
        group = HetGroup(role="convert", argv=(python, f"{nemo}/{run.script}", *run.args))
        where_it_runs = f"in {image}" if image else "on the nodes' own environment"
        shown = [f"# backend=nemo: NeMo {NEMO_VERSION} ({nemo}/{run.script}) {where_it_runs}, one task"]
        shown += [f"# note: {note}" for note in run.notes]
        shown.append(" \\\n    ".join(shlex.quote(w) for w in group.argv))
        if run.finalize:
            shown.append(f"# ---- then, if it succeeded\n{run.finalize.rstrip()}")
        shown += [f"# ---- registered after success: {n} <- {p}" for n, p in sorted(run.outputs.items())]
        return HetJob(
            image=image,
            groups=(group,),
            outputs=tuple(sorted(run.outputs.items())),
            shown="\n".join(shown) + "\n# ---- executor\n",
            finalize=run.finalize,
            local_hint=(
                f"{job.step_id} has no CPU path: NeMo's converters need NeMo, Megatron-Core and Transformer "
                "Engine, which only the NeMo container has"
            ),
            elsewhere="",
        )
