"""eval/policy as NeMo-RL v0.7.0's own eval entry (examples/run_eval.py): the policy answers on NeMo-RL's vLLM, its
math environment scores each answer against the prompt's reference, and it saves every sample to
`eval.save_path` (evaluation_data.json), which `nemotron.engines.nemo_rl.evaluation_report` turns into our eval_report.

Pure: our validated config in, the NeMo-RL config tree, the job-dir files and the driver out. Every key of the
schema is mapped, or refused (all at once, exit 2) when NeMo-RL's eval cannot honour it; docs/nemo-rl.md lists
each. Key names and where NeMo-RL reads them: tests/engines/nemo_rl_eval_v070.py."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel

from nemotron.config.configtree import flatten
from nemotron.engines.refusals import Refusals

if TYPE_CHECKING:  # mypy reads steps/ as a package root; at run time the catalog loads each schema.py itself
    from eval.policy.schema import Generation, Inputs, Judge, NemoRLEval, Scorers

    from nemotron.artifacts.binding import Binding
    from nemotron.catalog import Manifest
    from nemotron.config.stepconfig import Runtime


@runtime_checkable
class EvalConfig(Protocol):
    """What NeMo-RL's eval reads of the Config of a step it runs as its eval (eval/policy's schema.py, which the
    catalog loads itself: its groups are typed as that schema types them)."""

    inputs: Inputs
    generation: Generation
    scorers: Scorers
    judge: Judge
    runtime: Runtime
    nemo_rl: NemoRLEval
    max_prompts: int


RECIPE = "eval"  # a manifest's `engines.nemo_rl` for a step NeMo-RL runs as its eval entry
ENTRY = "examples/run_eval.py"
BASE = "examples/configs/evals/eval.yaml"
PROMPTS_FILE = (
    "nemo_rl_eval_prompts.jsonl"  # the prompts NeMo-RL reads: the first max_prompts of inputs.prompts
)
TEMPLATE_FILE = "nemo_rl_eval_prompt.txt"  # data.prompt_file: our prompt format, as str.format takes it
# Each message's content, nothing added: the text prompt as our sampler formats it. A template string, not the null
# that selects NeMo-RL's own passthrough: run_eval validates tokenizer.chat_template as a str (TokenizerConfig).
CONTENT_ONLY = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
PRECISION = {"fp32": "float32", "bf16": "bfloat16"}  # runtime.precision -> vllm_cfg.precision
REPORT = "report"

# Keys this compiler maps or refuses by name (a group here: each of its keys; judge.*: every one refused unless
# default). Any other schema key (one added later) is refused unless left at its default, so none silently does
# nothing here.
HANDLED = (
    "backend", "inputs.policy", "inputs.prompts", "inputs.baseline", "inputs.reward_model", "inputs.judge",
    "outputs.report", "generation.greedy", "generation.temperature", "generation.top_k", "generation.top_p",
    "generation.max_new_tokens", "generation.batch_size", "generation.backend", "generation.vllm_gpu_memory_utilization",
    "generation.vllm_max_model_len", "scorers.reward_model", "scorers.task", "scorers.math",
    "scorers.win_rate", "scorers.length", "scorers.distinct_n", "judge", "summary.resamples", "summary.level",
    "summary.seed", "max_prompts", "runtime.seed", "runtime.device", "runtime.precision", "runtime.num_threads",
    "nemo_rl",
)  # fmt: skip


@dataclass(frozen=True)
class CompiledEval:
    config: dict[str, Any]  # without `defaults`
    files: dict[str, str]
    prepare: str  # shell: the prompt file NeMo-RL reads, before the entry runs
    outputs: dict[str, str]


def prompt_template() -> str:
    """Our prompt format (nemotron.models.tokenizer.PROMPT_TEMPLATE, not imported: it loads transformers, which a
    dry run must not) with its one field as str.format's `{}`: NeMo-RL's math_data_processor formats each problem
    with the prompt file's text. A test holds the two equal."""
    return "{} =>"


def _refusals(c: EvalConfig, refuse: Refusals) -> None:
    s, r = c.scorers, c.runtime
    if not s.math:
        refuse("scorers.math", "NeMo-RL's eval scores with its math environment only: set scorers.math=true")
    if s.reward_model:
        refuse("scorers.reward_model", "NeMo-RL's eval takes no reward model (its env section is math only)")
    if s.task is not None:
        refuse("scorers.task", "our tiny tasks' ground truth does not run inside NeMo-RL")
    if s.win_rate:
        refuse("scorers.win_rate", "NeMo-RL's eval generates with one policy and has no judge")
    if s.length:
        refuse(
            "scorers.length",
            "NeMo-RL's eval saves the response text only (no token counts, no end flags): set scorers.length=false",
        )
    for key in dict(flatten({"judge": c.judge.model_dump(mode="json")})):
        refuse.unless_default(key, "the judge acts only with scorers.win_rate, which NeMo-RL's eval lacks")
    g = c.generation
    if g.backend != "vllm":
        refuse(
            "generation.backend",
            "NeMo-RL's eval answers on vLLM only: set generation.backend=vllm (-c nemo_rl does)",
        )
    wanted = c.nemo_rl.max_prompt_tokens + g.max_new_tokens
    if g.vllm_max_model_len and g.vllm_max_model_len < wanted:
        refuse(
            "generation.vllm_max_model_len",
            f"vLLM must hold nemo_rl.max_prompt_tokens + generation.max_new_tokens = {wanted} tokens: raise it, or 0 "
            "for exactly that",
        )
    if r.device == "cpu":
        refuse("runtime.device", "NeMo-RL's vLLM runs on GPUs only")
    if r.precision not in PRECISION:
        refuse("runtime.precision", "vLLM holds the weights in one dtype: use bf16 (or fp32)")
    refuse.unless_default(
        "runtime.seed",
        "NeMo-RL's vLLM workers seed themselves by their place in the cluster (node x 1024 + bundle), not by a "
        "setting",
    )
    refuse.unless_default("runtime.num_threads", "NeMo-RL's workers set their own threads")


def _refuse_unhandled(refuse: Refusals) -> None:
    for key in refuse.defaults:
        if not any(key == h or key.startswith(h + ".") for h in HANDLED):
            refuse.unless_default(key, "NeMo-RL's eval has no setting for it")


def compile_eval(c: EvalConfig, refuse: Refusals, job_dir: str, nodes: int, gpus: int) -> CompiledEval:
    """The NeMo-RL eval config (its `defaults:` is the tag's eval.yaml), the files and the prompt preparation;
    refusals go to `refuse`."""
    _refusals(c, refuse)
    _refuse_unhandled(refuse)
    policy, prompts = c.inputs.policy, c.inputs.prompts
    for key, value in (("inputs.policy", policy), ("inputs.prompts", prompts)):
        if not value:
            refuse(key, "NeMo-RL needs it set (an artifact ref or a path)")
    g, nemo = c.generation, c.nemo_rl
    report = f"{job_dir}/outputs/{REPORT}"
    config: dict[str, Any] = {
        # pass@1 over one answer per prompt: the mean of the math environment's 0/1 rewards
        "eval": {"metric": "pass@k", "num_tests_per_prompt": 1, "k_value": 1, "save_path": report},
        "generation": {
            "backend": "vllm",
            "model_name": str(policy or ""),
            "max_new_tokens": g.max_new_tokens,
            # temperature 0 is vLLM's greedy decoding; the schema keeps the sampling keys at their defaults then
            "temperature": 0.0 if g.greedy else g.temperature,
            "top_p": g.top_p,
            "top_k": g.top_k or -1,  # NeMo-RL's "off" is -1 (or null), ours 0
            "num_prompts_per_step": g.batch_size,
            "vllm_cfg": {
                "precision": PRECISION.get(c.runtime.precision, "bfloat16"),
                "tensor_parallel_size": nemo.generation_tensor_parallel_size,
                "gpu_memory_utilization": g.vllm_gpu_memory_utilization,
                "max_model_len": g.vllm_max_model_len or nemo.max_prompt_tokens + g.max_new_tokens,
            },
        },
        "tokenizer": {"name": str(policy or ""), "chat_template": CONTENT_ONLY, "chat_template_kwargs": None},
        # owned whole: the base's dataset (aime2024) must not survive the merge
        "data": {
            "_override_": True,
            "max_input_seq_length": nemo.max_prompt_tokens,
            "dataset_name": f"{job_dir}/{PROMPTS_FILE}",  # a path: load_eval_dataset's LocalMathDataset
            "problem_key": "prompt",
            "solution_key": "answer",
            "file_format": "json",  # JSON lines, read by datasets' json loader
            "split": "train",  # the one split that loader makes of a file
            "prompt_file": f"{job_dir}/{TEMPLATE_FILE}",
            "system_prompt_file": None,
        },
        "env": {"_override_": True, "math": {"num_workers": 8, "math_verify_impl": "hf_math_verify"}},
        "cluster": {"num_nodes": nodes, "gpus_per_node": gpus},
    }
    q = shlex.quote
    first = f"-m {c.max_prompts} " if c.max_prompts else ""
    # the first max_prompts records (blank lines skipped, as our reader does) where NeMo-RL and the report read them
    prepare = f"grep {first}'[^[:space:]]' {q(str(prompts or ''))} > {q(f'{job_dir}/{PROMPTS_FILE}')}"
    return CompiledEval(config, {TEMPLATE_FILE: prompt_template()}, prepare, {REPORT: report})


def preflight_problems(manifest: Manifest, config: BaseModel, bindings: Sequence[Binding]) -> list[str]:
    """NeMo-RL's own preflight rule (run by nemotron.engines.nemo_rl.preflight), for a step it runs as its eval
    (eval/policy): its math processor formats each prompt as one string (NeMo-RL v0.7.0
    nemo_rl/data/processors.py, math_data_processor), so a conversation (a list of messages) cannot be expressed.
    The first one among the records it would read (the first max_prompts) is refused; paths not here are left to
    the registration, which checks each sample against its prompt."""
    if manifest.step.engines.get("nemo_rl") != RECIPE:
        return []
    limit = int(getattr(config, "max_prompts", 0) or 0)
    for b in bindings:
        if b.name != "prompts" or not b.path or not Path(b.path).is_file():
            continue
        seen = 0
        with Path(b.path).open(encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                seen += 1
                if limit and seen > limit:
                    break
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # left to the record validation that reports it
                if isinstance(record, dict) and not isinstance(record.get("prompt"), str):
                    return [
                        f"input 'prompts' ({b.ref}): line {number} is a conversation; backend=nemo_rl runs NeMo-RL's "
                        "eval, which takes text prompts only"
                    ]
    return []
