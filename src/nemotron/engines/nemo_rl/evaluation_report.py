"""NeMo-RL's eval output as our eval_report: what eval/policy with backend=nemo_rl registers.

NeMo-RL v0.7.0's run_eval saves every sample to `<eval.save_path>/evaluation_data.json` ({"evaluation_data": [{prompt,
response, reward, message_log, extra_env_info, sample_index}]}, message_log and extra_env_info as Python reprs) and
the settings to config.json beside it (nemo_rl/evals/eval.py, _save_evaluation_data_to_json). With one answer per
prompt, each sample is one prompt's, in the order of the file: its reward is the math environment's 0/1 verdict, our
math_correct. Our own statistics then give each metric's bootstrap interval over the prompts, the same code as the
built-in engine's report (nemotron.policy_eval), and responses.jsonl and summary.json are written beside NeMo-RL's
files, so the artifact holds both."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from nemotron.config.targets import NEMO_RL_VERSION
from nemotron.engines.nemo_rl.evaluation import ENTRY, prompt_template
from nemotron.errors import EngineOutputError
from nemotron.jobs.record import JobRecord

SAMPLES_FILE = "evaluation_data.json"


def _prompts(path: str, max_prompts: int) -> tuple[list[Any], list[int]]:
    """The records NeMo-RL was given (the first max_prompts non-blank lines) and their line numbers in the file."""
    from nemotron.data.jsonl import read_jsonl
    from nemotron.data.records import PromptRecord

    records = read_jsonl(path, PromptRecord)
    with open(path, encoding="utf-8") as handle:
        lines = [number for number, line in enumerate(handle, 1) if line.strip()]
    n = max_prompts or len(records)
    return records[:n], lines[:n]


def _samples(report_dir: Path) -> list[dict[str, Any]]:
    path = report_dir / SAMPLES_FILE
    try:
        samples = json.loads(path.read_text(encoding="utf-8"))["evaluation_data"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise EngineOutputError(f"{path}: not NeMo-RL's evaluation data ({err})") from None
    return sorted(samples, key=lambda s: int(s["sample_index"]))


def _ground_truth(sample: dict[str, Any]) -> str | None:
    """extra_env_info is saved as the repr of math_data_processor's {"ground_truth": ...}."""
    try:
        info = ast.literal_eval(str(sample["extra_env_info"]))
    except (ValueError, SyntaxError):
        return None
    return str(info["ground_truth"]) if isinstance(info, dict) and "ground_truth" in info else None


def adopt_report(record: JobRecord, report_dir: Path) -> dict[str, Any]:
    """Write responses.jsonl and summary.json into `report_dir` from NeMo-RL's evaluation_data.json there; the
    registration metadata. Raises EngineOutputError when the samples are not the prompts the job was given."""
    from nemotron.catalog import Catalog
    from nemotron.data.records import prompt_text
    from nemotron.policy_eval.report import corpus_metrics, summarise, write_report
    from nemotron.policy_eval.stats import distinct_n

    schema = Catalog().get(record.step).config_schema()
    try:
        cfg: Any = schema.model_validate(record.config)
    except ValueError as err:
        raise EngineOutputError(
            f"job {record.job_id}: its recorded config does not validate ({err})"
        ) from None
    bound = {b.name: b.path or b.ref for b in record.inputs}
    if not bound.get("prompts"):
        raise EngineOutputError(f"job {record.job_id} recorded no prompts input")
    records, lines = _prompts(str(bound["prompts"]), cfg.max_prompts)
    samples = _samples(report_dir)
    if len(samples) != len(records):
        raise EngineOutputError(
            f"{report_dir / SAMPLES_FILE}: {len(samples)} samples for {len(records)} prompts (one answer each)"
        )
    template = prompt_template()
    rows: list[dict[str, Any]] = []
    for i, (rec, line, sample) in enumerate(zip(records, lines, samples, strict=True)):
        text = prompt_text(rec.prompt)
        if sample.get("prompt") != template.format(text) or _ground_truth(sample) != str(rec.answer):
            raise EngineOutputError(
                f"{report_dir / SAMPLES_FILE}: sample {i} is not line {line} of {bound['prompts']} "
                f"(prompt {sample.get('prompt')!r}, reference {_ground_truth(sample)!r})"
            )
        response = str(sample["response"])
        row: dict[str, Any] = {"index": i, "line": line, "prompt": text, "response": response}
        row["answer"] = rec.answer
        row["math_correct"] = float(sample["reward"])
        for n in cfg.scorers.distinct_n:
            row[f"distinct_{n}"] = distinct_n(response, n)
        rows.append(row)
    names = ["math_correct", *(f"distinct_{n}" for n in cfg.scorers.distinct_n)]
    metrics = summarise(
        rows, names, resamples=cfg.summary.resamples, level=cfg.summary.level, seed=cfg.summary.seed
    )
    summary = {
        "metrics": metrics,
        "corpus": corpus_metrics([r["response"] for r in rows], cfg.scorers.distinct_n),
        "num_prompts": len(rows),
        "interval": cfg.summary.model_dump(mode="json"),
        "generation": cfg.generation.model_dump(mode="json"),
        "seed": None,  # vLLM's workers seed themselves (node x 1024 + bundle); runtime.seed is refused
        "scorers": cfg.scorers.model_dump(mode="json"),
        "judge": {},
        "inputs": {name: bound.get(name) for name in cfg.inputs.model_dump()},
        "backend": "nemo_rl",
        "nemo_rl": {
            "version": NEMO_RL_VERSION,
            "entry": ENTRY,
            "samples": SAMPLES_FILE,
            # NeMo-RL's own aggregate (pass@1 = the mean reward), which math_correct's mean equals
            "pass@1": sum(float(s["reward"]) for s in samples) / len(samples),
            "math_verify_impl": "hf_math_verify",
        },
    }
    write_report(report_dir, rows, summary)
    return {"num_prompts": len(rows), "means": {name: m["mean"] for name, m in metrics.items()}}
