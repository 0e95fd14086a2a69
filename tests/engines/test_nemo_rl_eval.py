"""eval/policy with backend=nemo_rl: the compiled NeMo-RL v0.7.0 eval config checked against what the tag reads
(tests/engines/nemo_rl_eval_v070.py, re-read from the mirror when it is here), the refusals, and NeMo-RL's saved
samples turned into our eval_report."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from tests.engines import nemo_rl_eval_v070 as tag
from tests.engines import nemo_rl_rules as rules
from tests.engines import nemo_rl_v070 as rl_tag
from tests.engines.mirrors import git_files

from nemotron.catalog import Catalog
from nemotron.config.configtree import flatten, get_dotted, unflatten
from nemotron.engines.nemo_rl import evaluation as nemo_rl_eval
from nemotron.engines.nemo_rl.config import NemoRLRun, compile_run
from nemotron.engines.nemo_rl.evaluation_report import SAMPLES_FILE, adopt_report
from nemotron.engines.refusals import Refusals, builtin_refusals
from nemotron.errors import EngineOutputError, UserError
from nemotron.jobs.record import JobRecord
from nemotron.plan.placement import Placement
from nemotron.policy_eval.stats import bootstrap_interval

STEP = "eval/policy"
JOB = "/jobs/eval 1/$(touch pwned)"
PROMPTS = "/data/math prompts.jsonl"


def step_config(**overrides: Any) -> dict[str, Any]:
    tree = Catalog().get(STEP).config_schema()().model_dump(mode="json")
    flat = dict(flatten(tree)) | {
        "backend": "nemo_rl",
        "inputs.policy": "/models/policy",
        "inputs.prompts": PROMPTS,
        "scorers.math": True,
        "scorers.length": False,
        "generation.backend": "vllm",
    }
    return unflatten(flat | overrides)


def step_model(**overrides: Any) -> BaseModel:
    """`step_config` as compile hands it to an engine: validated by the step's schema (`Job.step_model`)."""
    return Catalog().get(STEP).config_schema().model_validate(step_config(**overrides))


def compiled(nodes: int = 1, gpus: int = 8, **overrides: Any) -> NemoRLRun:
    return compile_run(STEP, step_model(**overrides), Placement(JOB, nodes, gpus))


def loaded(run: NemoRLRun) -> dict[str, Any]:
    """The run's config as NeMo-RL's loader merges it over the base keys we encoded."""
    parent = run.config["defaults"]
    assert parent == f"/opt/nemo-rl/{tag.BASE}"
    merged: dict[str, Any] = rules.load_config(run.config, {parent: unflatten(tag.BASE_KEYS)})
    return merged


def _type_ok(value: Any, annotation: str) -> bool:
    """Whether `value` passes the annotation as pydantic would validate it (the forms the TypedDicts use)."""
    ann = annotation.strip()
    if ann.startswith("NotRequired[") and ann.endswith("]"):
        return _type_ok(value, ann[len("NotRequired[") : -1])
    parts = [p.strip() for p in re.split(r"\|(?![^\[]*\])", ann)]
    if len(parts) > 1:
        return any(_type_ok(value, p) for p in parts)
    if ann == "None":
        return value is None
    if ann.startswith("Literal["):
        return value in ast.literal_eval(f"[{ann[len('Literal[') : -1]}]")
    simple = {"str": str, "int": int, "float": (int, float), "bool": bool}
    if ann in simple:
        return isinstance(value, simple[ann]) and not (ann != "bool" and isinstance(value, bool))
    if ann.startswith("list["):
        return isinstance(value, list)
    if ann.startswith("dict[") or ann in tag.TYPED:
        return isinstance(value, dict)
    return True  # a type these classes use nowhere on our keys


def typed_problems(cfg: dict[str, Any]) -> list[str]:
    problems = [f"{k}: not a MasterConfig field" for k in cfg if k not in tag.TYPED["MasterConfig"][1]]
    for section, cls in tag.SECTIONS.items():
        node = get_dotted(cfg, section)
        fields = tag.TYPED[cls][1]
        if not isinstance(node, dict):
            problems.append(f"{section}: missing")
            continue
        if section in tag.REQUIRED_CHECKED:
            problems += [f"{section}.{f}: required by {cls}" for f, a in fields.items()
                         if not a.startswith("NotRequired[") and f not in node]  # fmt: skip
        problems += [f"{section}.{f}={node[f]!r}: not a {a}" for f, a in fields.items()
                     if f in node and not _type_ok(node[f], a)]  # fmt: skip
    return problems


# ---- the compiled config carries what the tag reads, as its TypedDicts type it -------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {
            "generation.greedy": False,
            "generation.temperature": 0.7,
            "generation.top_k": 5,
            "runtime.precision": "fp32",
        },
    ],
    ids=["greedy", "sampled"],
)
def test_the_loaded_config_meets_the_typeddicts_and_every_key_we_write_is_read(
    overrides: dict[str, Any],
) -> None:
    run = compiled(**overrides)
    assert run.entry == tag.ENTRY
    cfg = loaded(run)
    assert typed_problems(cfg) == []
    written = {k for k, _ in flatten({k: v for k, v in run.config.items() if k != "defaults"})} - {
        "data._override_",
        "env._override_",
    }
    assert sorted(written ^ {k for k, _, _ in tag.READS}) == []


def test_the_type_rules_catch_a_null_chat_template() -> None:
    # NeMo-RL's RL entries read tokenizer.chat_template null as "passthrough"; run_eval's pydantic model refuses it
    cfg = loaded(compiled())
    cfg["tokenizer"]["chat_template"] = None
    assert typed_problems(cfg) == ["tokenizer.chat_template=None: not a NotRequired[str]"]


def test_the_base_dataset_and_environment_do_not_survive_the_loader() -> None:
    cfg = loaded(compiled())
    assert cfg["data"]["dataset_name"] == f"{JOB}/{nemo_rl_eval.PROMPTS_FILE}" and "aime2024" not in str(cfg)
    assert list(cfg["env"]) == ["math"] and "_override_" not in str(cfg)
    assert cfg["eval"]["seed"] == 42  # left to the base: it seeds nothing NeMo-RL's vLLM samples with


def test_generation_maps_key_by_key() -> None:
    greedy = compiled(**{"generation.max_new_tokens": 300, "nemo_rl.max_prompt_tokens": 200}).config
    g = greedy["generation"]
    assert (g["temperature"], g["top_p"], g["top_k"]) == (0.0, 1.0, -1)
    assert g["max_new_tokens"] == 300 and g["vllm_cfg"]["max_model_len"] == 500
    assert greedy["data"]["max_input_seq_length"] == 200
    sampled = compiled(
        **{"generation.greedy": False, "generation.temperature": 0.7, "generation.top_k": 5,
           "generation.top_p": 0.9, "generation.batch_size": 4, "nemo_rl.generation_tensor_parallel_size": 2}
    ).config["generation"]  # fmt: skip
    assert (sampled["temperature"], sampled["top_p"], sampled["top_k"]) == (0.7, 0.9, 5)
    assert sampled["num_prompts_per_step"] == 4 and sampled["vllm_cfg"]["tensor_parallel_size"] == 2
    assert (
        compiled(**{"runtime.precision": "fp32"}).config["generation"]["vllm_cfg"]["precision"] == "float32"
    )
    assert compiled(nodes=2, gpus=4).config["cluster"] == {"num_nodes": 2, "gpus_per_node": 4}


def test_the_prompt_file_is_our_prompt_format() -> None:
    from nemotron.models.tokenizer import format_prompt

    run = compiled()
    template = run.files[nemo_rl_eval.TEMPLATE_FILE]
    assert template.format("the movie was") == format_prompt("the movie was")
    assert yaml.safe_load(run.files["nemo_rl_config.yaml"]) == run.config


@pytest.mark.parametrize(("max_prompts", "kept"), [(0, ["a", "b", "c"]), (2, ["a", "b"])])
def test_the_driver_prepares_the_first_prompts_then_runs_the_entry(
    tmp_path: Path, max_prompts: int, kept: list[str]
) -> None:
    source = tmp_path / "it's prompts.jsonl"
    source.write_text('{"prompt": "a"}\n\n  \n{"prompt": "b"}\n{"prompt": "c"}\n')
    job = tmp_path / "job $x"
    job.mkdir()
    cfg = step_model(**{"inputs.prompts": str(source), "max_prompts": max_prompts})
    run = compile_run(STEP, cfg, Placement(str(job), 1, 1))
    prepare, _, entry = run.driver.partition(" && cd ")
    assert entry.endswith(f"uv run python examples/run_eval.py --config '{job}/nemo_rl_config.yaml'")
    subprocess.run(["sh", "-c", prepare], check=True)
    got = (job / nemo_rl_eval.PROMPTS_FILE).read_text().splitlines()
    assert [json.loads(line)["prompt"] for line in got] == kept
    assert run.finalize == "" and run.outputs == {"report": f"{job}/outputs/report"}


# ---- refusals -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"scorers.math": False}, "scorers.math"),
        ({"scorers.length": True}, "scorers.length"),
        ({"scorers.task": "sentiment"}, "scorers.task"),
        ({"scorers.reward_model": True, "inputs.reward_model": "/models/rm"}, "scorers.reward_model"),
        ({"generation.backend": "torch"}, "generation.backend"),
        ({"generation.vllm_max_model_len": 100}, "generation.vllm_max_model_len"),
        ({"runtime.device": "cpu"}, "runtime.device"),
        ({"runtime.precision": "bf16-mixed"}, "runtime.precision"),
        ({"runtime.seed": 7}, "runtime.seed"),
        ({"runtime.num_threads": 1}, "runtime.num_threads"),
        ({"inputs.policy": None}, "inputs.policy"),
    ],
)
def test_what_nemo_rls_eval_cannot_honour_is_refused(overrides: dict[str, Any], key: str) -> None:
    with pytest.raises(UserError) as err:
        compiled(**overrides)
    assert [p.split("=")[0] for p in err.value.problems] == [key]


def test_win_rate_is_refused_and_all_refusals_come_at_once() -> None:
    with pytest.raises(UserError) as err:
        compiled(**{"scorers.win_rate": True, "inputs.baseline": "/b", "inputs.judge": "/j",
                    "runtime.device": "cpu"})  # fmt: skip
    assert [p.split("=")[0] for p in err.value.problems] == ["scorers.win_rate", "runtime.device"]


def test_a_key_this_compiler_does_not_know_is_refused_unless_default() -> None:
    """A key added to the schema later must act on NeMo-RL or be refused, never pass."""
    config = {"generation": {"speculative_tokens": 4, "greedy": True}, "max_prompts": 0}
    defaults = {"generation": {"speculative_tokens": 0, "greedy": True}, "max_prompts": 0}
    refuse = Refusals(STEP, config, defaults, engine="nemo_rl", hint="")
    nemo_rl_eval._refuse_unhandled(refuse)
    assert refuse.problems == ["generation.speculative_tokens=4: NeMo-RL's eval has no setting for it"]


def test_every_schema_key_is_handled_by_name() -> None:
    keys = dict(flatten(Catalog().get(STEP).config_schema()().model_dump(mode="json")))
    assert [k for k in keys if not any(k == h or k.startswith(h + ".") for h in nemo_rl_eval.HANDLED)] == []


def test_nemo_rl_keys_are_refused_on_the_builtin_backend() -> None:
    schema = Catalog().get(STEP).config_schema()
    on_builtin = schema.model_validate(step_config(**{"backend": "builtin", "nemo_rl.max_prompt_tokens": 64}))
    assert builtin_refusals(on_builtin) == [
        "nemo_rl.max_prompt_tokens=64: only backend=nemo_rl reads it (the built-in backend would ignore it)"
    ]
    assert builtin_refusals(schema.model_validate(step_config(**{"nemo_rl.max_prompt_tokens": 64}))) == []


# ---- NeMo-RL's samples -> our eval_report ---------------------------------------------------------------------


def _job(tmp_path: Path, answers: list[str], max_prompts: int = 0) -> tuple[JobRecord, Path]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"q{i}", "answer": a}) for i, a in enumerate(answers)))
    config = step_config(**{"inputs.prompts": str(prompts), "max_prompts": max_prompts})
    record = JobRecord.model_validate(
        {"job_id": "eval-1", "step": STEP, "preset": "nemo_rl", "created_at": "now", "mode": "batch",
         "executor": "slurm", "profile": {}, "config": config, "config_hash": "x", "launch": "",
         "inputs": [{"name": "prompts", "expected_type": "prompt_jsonl", "ref": str(prompts), "kind": "path",
                     "path": str(prompts)},
                    {"name": "policy", "expected_type": "checkpoint_hf", "ref": "/models/policy", "kind": "path",
                     "path": "/models/policy"}]}
    )  # fmt: skip
    report = tmp_path / "report"
    report.mkdir()
    return record, report


def _samples(report: Path, rows: list[tuple[str, str, str, float]]) -> None:
    """NeMo-RL's evaluation_data.json: (prompt, response, ground truth, reward) per sample, its reprs as strings."""
    data = [
        {"prompt": nemo_rl_eval.prompt_template().format(p), "response": r, "reward": w,
         "message_log": str([{"role": "user", "content": p}]), "extra_env_info": str({"ground_truth": g}),
         "sample_index": i}
        for i, (p, r, g, w) in enumerate(rows)
    ]  # fmt: skip
    (report / SAMPLES_FILE).write_text(json.dumps({"evaluation_data": data}))


def test_samples_become_rows_and_our_bootstrap_summary(tmp_path: Path) -> None:
    record, report = _job(tmp_path, ["1", "2", "3", "4"], max_prompts=3)
    _samples(report, [("q0", "a b a", "1", 1.0), ("q1", "c", "2", 0.0), ("q2", "d d", "3", 1.0)])
    meta = adopt_report(record, report)
    rows = [json.loads(line) for line in (report / "responses.jsonl").read_text().splitlines()]
    assert [(r["line"], r["answer"], r["math_correct"], r["distinct_1"]) for r in rows] == [
        (1, "1", 1.0, 2 / 3),
        (2, "2", 0.0, 1.0),
        (3, "3", 1.0, 0.5),
    ]
    summary = json.loads((report / "summary.json").read_text())
    expected = bootstrap_interval([1.0, 0.0, 1.0], resamples=1000, level=0.95, seed=0).as_dict()
    assert summary["metrics"]["math_correct"] == expected and summary["nemo_rl"]["pass@1"] == 2 / 3
    assert summary["format"] == 1 and summary["inputs"]["policy"] == "/models/policy"
    assert meta == {"num_prompts": 3, "means": {k: v["mean"] for k, v in summary["metrics"].items()}}


@pytest.mark.parametrize(
    "rows",
    [
        [("q0", "x", "1", 1.0)],  # too few samples
        [("q0", "x", "1", 1.0), ("q9", "x", "2", 0.0)],  # another prompt
        [("q0", "x", "1", 1.0), ("q1", "x", "7", 0.0)],  # another reference
    ],
    ids=["count", "prompt", "reference"],
)
def test_samples_that_are_not_the_jobs_prompts_register_nothing(
    tmp_path: Path, rows: list[tuple[str, str, str, float]]
) -> None:
    record, report = _job(tmp_path, ["1", "2"])
    _samples(report, rows)
    with pytest.raises(EngineOutputError):
        adopt_report(record, report)
    assert not (report / "summary.json").exists()


# ---- the real tag ---------------------------------------------------------------------------------------------


def test_data_matches_the_tag() -> None:
    if not rl_tag.MIRROR.exists():
        pytest.skip("no NeMo-RL mirror on this machine; the data-encoded tests above still ran")
    files = git_files(rl_tag.MIRROR, rl_tag.TAG)
    assert {tag.ENTRY, tag.BASE} <= files
    base = dict(flatten(yaml.safe_load(rules.show(tag.BASE))))
    assert {k: base.get(k, "<absent>") for k in tag.BASE_KEYS} == tag.BASE_KEYS
    for cls, (path, fields) in tag.TYPED.items():
        (node,) = [
            n for n in ast.walk(ast.parse(rules.show(path))) if isinstance(n, ast.ClassDef) and n.name == cls
        ]
        real = {n.target.id: ast.unparse(n.annotation) for n in node.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}  # fmt: skip
        assert real == fields, cls
    sources: dict[str, ast.Module] = {}
    wrong = []
    for dotted, path, line in tag.READS:
        if path not in sources:
            sources[path] = ast.parse(rules.show(path))
        chains = rules.keys_read_on(sources[path], line)
        if not any(rules.reads(chain, dotted) for chain in chains):
            wrong.append((dotted, f"{path}:{line} reads {chains}"))
    assert wrong == []
    # run_eval validates its config as a pydantic model that keeps unknown keys (so they must be read to act)
    assert 'class MasterConfig(BaseModel, extra="allow")' in rules.show("nemo_rl/evals/eval.py")
    assert "config = MasterConfig(**config)" in rules.show(tag.ENTRY)


def test_every_schema_key_is_in_the_mapping_table() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "nemo-rl.md").read_text()
    section = text.split(f"## {STEP}\n")[1].split("\n## ")[0]
    rows = set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.M))
    keys = set(dict(flatten(Catalog().get(STEP).config_schema()().model_dump(mode="json"))))
    assert sorted(keys ^ rows) == []
