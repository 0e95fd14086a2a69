"""The CLI as a user meets it: real subprocesses, exit codes, messages, and what is (not) written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

COUNT = ("steps", "run", "test/count", "-c", "tiny")  # the fixture step with its tiny preset (3 steps)
# The same, long enough (1000 steps of 0.05 s) to be stopped while it runs.
LONG_COUNT = (*COUNT, "trainer.max_steps=1000", "trainer.sleep_s=0.05")


# What no command loads at start-up (issue 33): the ML stack, the executors' clients, the HTTP stack. A dry run
# compiles the step's config; listing, showing and the help also leave the compiler, nemotron's pydantic models
# (profiles, job records, step configs) and every step's schema unloaded.
NEVER = ("torch", "transformers", "safetensors", "nemo_run", "leptonai", "torchx", "h11", "httpx", "uvicorn",
         "mlflow", "wandb", "sqlalchemy")  # fmt: skip
BROWSE = (*NEVER, "omegaconf", "yaml", "jinja2", "nemotron.compile", "nemotron.config.profiles", "nemotron.jobs.record",
          "nemotron.config.stepconfig", "nemotron.config.rlgroups", "nemotron.config.strict",
          "nemotron_step_schema_*")  # fmt: skip
# What a dry run on this machine leaves to the run itself: job records and their writer, the process launcher,
# NeMo-RL's compiler (rl/rlhf -c tiny runs on the built-in engine), tarfile (its checkpoints are directories),
# sqlite3 (the artifact store is opened, never queried: its inputs are pkg:// paths) and logging (nothing is logged).
LOCAL_DRY_RUN = ("nemotron.jobs.record", "nemotron.jobs.dirs", "nemotron.launch.local", "nemotron.core.procs",
                 "nemotron.engines.nemo_rl.config", "tarfile", "sqlite3", "logging")  # fmt: skip
GROUPS = ("nemotron.cli.steps", "nemotron.cli.jobs", "nemotron.cli.pipeline", "nemotron.cli.profiles",
          "nemotron.cli.artifacts", "nemotron.catalog")  # fmt: skip


def loaded(imported: set[str], banned: tuple[str, ...]) -> list[str]:
    """The modules of `imported` that are, or are under, one of `banned` (NAME* a prefix)."""

    def under(module: str, name: str) -> bool:
        if name.endswith("*"):
            return module.startswith(name[:-1])
        return module == name or module.startswith(name + ".")

    return sorted(m for m in imported if any(under(m, b) for b in banned))


def _no_traceback(r: Any) -> None:
    assert "Traceback" not in r.err and "Traceback" not in r.out


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (
            ["steps", "run", "test/count", "-c", "tiny", "trainer.max_stepz=3"],
            "did you mean 'trainer.max_steps'",
        ),
        (["steps", "run", "test/cuont", "-c", "tiny"], "did you mean 'test/count'"),
        (["steps", "run", "test/count", "-c", "tinyy"], "did you mean 'tiny'"),
        (
            ["steps", "run", "test/count", "-c", "tiny", "trainer.max_steps=many"],
            "trainer.max_steps: Input should be a valid integer",
        ),
        (["steps", "run", "test/count", "-c", "tiny", "-r", "local", "-b", "local"], "mutually exclusive"),
        (
            ["steps", "run", "test/count", "-c", "missing/preset.yaml"],
            "preset file missing/preset.yaml does not exist",
        ),
        (["steps", "run", "test/count", "-c", "tiny", "notakeyvalue"], "overrides must look like key=value"),
        (
            ["steps", "run", "test/count", "-c", "tiny", "-r", "nosuchprofile"],
            "unknown profile 'nosuchprofile'",
        ),
        (["steps", "show", "rl/reinfroce"], "did you mean 'rl/reinforce'"),
        (["steps", "list", "--consumes", "prompt_jsnl"], "did you mean 'prompt_jsonl'"),
        (["steps", "list", "--category", "rll"], "unknown category 'rll' (did you mean 'rl'?)"),
        (["steps", "list", "--tag", "rlfh", "--tree"], "unknown tag 'rlfh' (did you mean 'rlhf'"),
        (
            ["steps", "list", "--engine", "nemo_alinger"],
            "no step runs on engine 'nemo_alinger' (did you mean",
        ),
        (["jobs", "status", "no-such-job"], "no job 'no-such-job'"),
    ],
)
def test_bad_input_exits_2_with_one_clear_message_and_writes_nothing(
    args: list[str], expect: str, home: Path, fixture_steps: Path, run_cli: Any
) -> None:
    r = run_cli(*args)
    assert r.code == 2, (r.out, r.err)
    assert expect in r.err
    _no_traceback(r)
    assert not home.exists(), "a failed command must not write anything"


def test_malformed_yaml_preset(home: Path, fixture_steps: Path, run_cli: Any, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: {max_steps: 3\n")
    r = run_cli("steps", "run", "test/count", "-c", str(bad))
    assert r.code == 2 and "malformed YAML" in r.err and "bad.yaml:" in r.err
    _no_traceback(r)
    assert not home.exists()


def test_dry_run_prints_config_sources_bindings_and_command_without_torch(
    home: Path, fixture_steps: Path, tmp_path: Path, run_cli_imports: Any
) -> None:
    nums = tmp_path / "nums.jsonl"
    nums.write_text('{"prompt": "1"}\n')
    t0 = time.monotonic()
    r, imported = run_cli_imports(*COUNT, "--dry-run", f"inputs.numbers={nums}", "trainer.sleep_s=0.5")
    elapsed = time.monotonic() - t0
    assert r.code == 0, r.err
    assert not loaded(imported, NEVER)
    assert {"nemotron.compile", "omegaconf"} <= imported  # the check is real: imports are being recorded
    out = r.out
    assert "max_steps: 3  # preset:tiny" in out
    assert "sleep_s: 0.5  # cli" in out
    assert "fail_at: null\n" in out  # default: no source marker
    assert f"numbers        prompt_jsonl       <- {nums}" in out
    assert "step.py --job-dir" in out
    assert not home.exists(), "dry-run must write nothing"
    assert elapsed < 5  # generous: the machine may be busy; bench/ measures the real figure


@pytest.mark.parametrize(
    ("args", "banned", "needed"),
    [
        # the groups' names and help are in cli.app; plain click help: no typer.rich_utils, no rich at all
        (["--help"], (*BROWSE, *GROUPS, "rich"), "nemotron.cli.app"),
        ([], (*BROWSE, *GROUPS, "rich"), "nemotron.cli.app"),  # bare `nemotron`: the same help
        (["steps", "list"], (*BROWSE, "rich.console"), "nemotron.catalog"),  # piped: plain text, no rich
        # every filter at once, as JSON: manifests only (the engines are declared, no schema is read), no rich
        (["steps", "list", "--category", "rl", "--tag", "ppo", "--consumes", "reward_model_hf", "--produces",
          "checkpoint_hf", "--engine", "nemo_aligner", "--json"], (*BROWSE, "rich"), "nemotron.catalog.query"),
        (["steps", "list", "--tree"], BROWSE, "rich.tree"),  # rich draws the tree, from the manifests alone
        # manifest text is printed as written: no emoji codes to look up
        (["steps", "show", "rl/rlhf"], (*BROWSE, "rich._emoji_codes"), "rich.table"),
        # a dry run prints plain text: no rich
        (["steps", "run", "rl/rlhf", "-c", "tiny", "--dry-run"], (*NEVER, "rich", *LOCAL_DRY_RUN),
         "nemotron_step_schema_steps_rl_rlhf"),
        # eval/policy's preflight reads the prompts for scorers.math's answers (json), never a model
        (["steps", "run", "eval/policy", "-c", "tiny", "--dry-run", "scorers.math=true",
          "inputs.prompts=" + str(Path(__file__).resolve().parents[2] / "docs" / "examples" / "math_prompts.jsonl")],
         (*NEVER, "rich", "math_verify", "sympy"), "nemotron_step_schema_steps_eval_policy"),
        # ... and on NeMo-RL's eval entry: the compiler only, no model, no math-verify, no NeMo-Run
        (["steps", "run", "eval/policy", "-c", "nemo_rl", "-b", "slurm_rlhf", "--dry-run", "inputs.policy=/models/p",
          "inputs.prompts=" + str(Path(__file__).resolve().parents[2] / "docs" / "examples" / "math_prompts.jsonl")],
         (*NEVER, "rich", "math_verify", "sympy"), "nemotron.engines.nemo_rl.evaluation"),
        # no override and no ${...} in rl/ppo's presets: nothing for OmegaConf to do (rl/rlhf's has one); NeMo-Run's
        # sbatch template filled in without jinja2 (launch/nemo_run_sbatch.py), and no Ray module for a hetjob
        (["steps", "run", "rl/ppo", "-c", "default", "-b", "slurm_rlhf", "--dry-run"],
         (*NEVER, "rich", "omegaconf", "jinja2", "nemotron.launch.ray_slurm"), "nemotron.plan.terms"),
        # trackers on: preflight checks their settings, their libraries wait for the step itself
        (["steps", "run", "rl/ppo", "-c", "tiny", "--dry-run", "tracking.mlflow.enabled=true",
          "tracking.mlflow.tracking_uri=http://127.0.0.1:5000", "tracking.wandb.enabled=true"],
         (*NEVER, "rich", "nemotron.tracking.fanout", *LOCAL_DRY_RUN), "nemotron.tracking.checks"),
    ],
    ids=["help", "bare", "steps list", "steps list filtered", "steps list --tree", "steps show", "tiny local dry run", "eval dry run", "eval nemo_rl dry run",
         "slurm dry run", "dry run with trackers"],
)  # fmt: skip
def test_start_up_loads_only_what_the_command_needs(
    home: Path, args: list[str], banned: tuple[str, ...], needed: str, run_cli_imports: Any
) -> None:
    """bench/cli_latency.py measures these commands; a module loaded where it is not needed shows here first."""
    r, imported = run_cli_imports(*args)
    assert r.code == 0, r.err
    assert needed in imported  # the check is real: the command did its work and its modules are recorded
    assert not loaded(imported, banned)


def test_a_preset_interpolation_is_resolved(home: Path, run_cli_imports: Any) -> None:
    """rl/rlhf's default preset names its judge as ${oc.env:RL_REWARD_MODEL,...}: OmegaConf resolves it (and is
    loaded only because there is one to resolve)."""
    r, imported = run_cli_imports("steps", "run", "rl/rlhf", "-c", "default", "-b", "slurm_rlhf", "--dry-run",
                                  env={"RL_REWARD_MODEL": "my-org/my-judge"})  # fmt: skip
    assert r.code == 0, r.err
    assert "model: my-org/my-judge  # preset:default" in r.out and "${" not in r.out.split("## launch")[0]
    assert "omegaconf" in imported


def test_local_run_writes_job_record_and_jobs_ls_lists_it(
    home: Path, fixture_steps: Path, run_cli: Any
) -> None:
    r = run_cli(*COUNT, "server.token=tok-abcdef-123456")
    assert r.code == 0, r.err
    (job_dir,) = (home / "jobs").iterdir()
    record = (job_dir / "job.yaml").read_text()
    assert "argv:" in record and "git:" in record and "versions:" in record and "config_hash:" in record
    assert (
        "tok-abcdef-123456" not in record and "tok-abcdef-123456" not in (job_dir / "config.yaml").read_text()
    )
    assert oct((job_dir / ".secrets.json").stat().st_mode & 0o777) == "0o600"
    assert "token available to the step: True" in (job_dir / "logs" / "step.log").read_text()
    metrics = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    listed = json.loads(run_cli("jobs", "ls", "--json").out)
    assert [(j["job_id"], j["state"]) for j in listed] == [(job_dir.name, "succeeded")]
    shown = json.loads(run_cli("jobs", "show", job_dir.name, "--json").out)
    assert shown["produced"] == ["count_result:v1"]


def test_failed_step_is_marked_failed_and_registers_nothing(
    home: Path, fixture_steps: Path, run_cli: Any
) -> None:
    r = run_cli(*COUNT, "trainer.fail_at=2")
    assert r.code == 3
    (job_dir,) = (home / "jobs").iterdir()
    assert json.loads((job_dir / "status.json").read_text())["state"] == "failed"
    assert json.loads(run_cli("jobs", "show", job_dir.name, "--json").out)["produced"] == []


def test_batch_run_detaches_and_cancel_stops_it(home: Path, fixture_steps: Path, run_cli: Any) -> None:
    t0 = time.monotonic()
    r = run_cli(*LONG_COUNT, "-b", "local")
    assert r.code == 0, r.err
    assert time.monotonic() - t0 < 20  # returned at once, the job keeps running
    job_id = r.out.strip()
    deadline = time.monotonic() + 30
    while "step 2/1000" not in run_cli("jobs", "logs", job_id).out:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert json.loads(run_cli("jobs", "status", job_id, "--json").out)["state"] == "running"
    r = run_cli("jobs", "cancel", job_id)
    assert r.code == 0, r.err
    status = json.loads(run_cli("jobs", "status", job_id, "--json").out)
    assert status["state"] == "cancelled"
    with pytest.raises(ProcessLookupError):
        os.kill(status["pid"], 0)  # the step process is gone
    logs = run_cli("jobs", "logs", job_id).out
    assert "step 1/1000" in logs and "step 1000/1000" not in logs
    assert json.loads(run_cli("jobs", "show", job_id, "--json").out)["produced"] == []


def test_ctrl_c_on_attached_run_cancels_the_job(home: Path, fixture_steps: Path, nemotron_cmd: Any) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(
        nemotron_cmd(*LONG_COUNT),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not list((home / "jobs").glob("*/metrics.jsonl")):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    (job_dir,) = (home / "jobs").iterdir()
    status = json.loads((job_dir / "status.json").read_text())
    assert status["state"] == "cancelled"
    with pytest.raises(ProcessLookupError):
        os.kill(status["pid"], 0)
    assert "Traceback" not in err


def test_passthrough_args_reach_the_step(home: Path, fixture_steps: Path, run_cli: Any) -> None:
    r = run_cli(*COUNT, "--dry-run", "trainer.max_steps=2", "--", "--extra-arg", "x=1")
    assert r.code == 0, r.err
    assert "--job-dir" in r.out and r.out.rstrip().endswith("--extra-arg x=1")
    assert "max_steps: 2  # cli" in r.out


def test_steps_list_json_filters_by_type(home: Path, run_cli: Any) -> None:
    rows = json.loads(run_cli("steps", "list", "--json", "--produces", "checkpoint_hf").out)
    ids = {r["id"] for r in rows}
    assert {
        "sft",
        "rl/reinforce",
        "rl/ppo",
        "rl/rlhf",
        "rl/dpo",
        "rm/train",
    } <= ids  # reward_model_hf is_a checkpoint_hf
    assert "data/prep" not in ids
    rows = json.loads(run_cli("steps", "list", "--json", "--consumes", "preference_jsonl").out)
    assert {r["id"] for r in rows} == {"rm/train", "rl/dpo"}


def test_steps_list_filters_combine_and_json_names_the_engines(home: Path, run_cli: Any) -> None:
    rows = json.loads(run_cli("steps", "list", "--json", "--category", "rl", "--engine", "nemo_aligner").out)
    assert [(r["id"], r["engines"]) for r in rows] == [
        ("rl/dpo", ["builtin", "nemo_rl", "nemo_aligner"]),
        ("rl/ppo", ["builtin", "nemo_rl", "nemo_aligner"]),
        ("rl/reinforce", ["builtin", "nemo_rl", "nemo_aligner"]),
    ]  # rl/rlhf is rl but has no NeMo-Aligner workflow; rm/serve has one but is no rl step
    # on NeMo-Aligner the RL steps read a .nemo policy: --engine asks for the types that engine reads
    ids = lambda *a: [r["id"] for r in json.loads(run_cli("steps", "list", "--json", *a).out)]  # noqa: E731
    # sft and rm/train start from a .nemo on NeMo-Aligner (their init_from), never on the built-in engine
    assert ids("--consumes", "checkpoint_nemo") == [
        "convert/nemo_to_hf",
        "rl/dpo",
        "rl/ppo",
        "rl/reinforce",
        "rm/train",
        "sft",
    ]
    assert ids("--consumes", "checkpoint_nemo", "--engine", "nemo_aligner") == [
        "rl/dpo",
        "rl/ppo",
        "rl/reinforce",
        "rm/train",
        "sft",
    ]
    assert ids("--consumes", "checkpoint_nemo", "--engine", "builtin") == []
    assert ids("--tag", "critic") == ["rl/ppo"]
    r = run_cli("steps", "list", "--category", "data", "--engine", "nemo_rl")
    assert r.code == 0 and r.out == "" and "no step matches" in r.err  # an empty answer is no error
    assert "engines: builtin, nemo_aligner " in run_cli("steps", "show", "rm/serve").out  # no NeMo-RL server


def test_steps_list_tree_draws_the_tiny_pipeline(home: Path, run_cli: Any) -> None:
    """Each step of the tiny pipeline stands in the tree once, under a step the pipeline feeds it from (or at the
    top when the pipeline feeds it nothing): the tree and the pipeline's wiring agree, derived apart."""
    import tomllib

    pipeline = tomllib.loads(
        (Path(__file__).resolve().parents[2] / "manifests/pipelines/tiny.toml").read_text()
    )
    by_name = {s["id"]: s["step"] for s in pipeline["steps"]}
    fed_from: dict[str, set[str]] = {}
    for s in pipeline["steps"]:
        sources = {by_name[ref.split(".")[0]] for ref in s.get("inputs", {}).values()}
        fed_from.setdefault(s["step"], set()).update(sources)
    parents: dict[str, str] = {}

    def walk(nodes: list[dict[str, Any]], parent: str) -> None:
        for n in nodes:
            assert n["id"] not in parents, f"{n['id']} stands twice"
            parents[n["id"]] = parent
            assert (n["via"] or {}).get("from", "") == parent
            walk(n["children"], n["id"])

    walk(json.loads(run_cli("steps", "list", "--tree", "--json").out), "")
    for step, sources in fed_from.items():
        assert parents[step] in (sources or {""}), (step, parents[step], sources)
    assert parents["rl/ppo"] == "sft" and parents["sft"] == "data/prep"  # the check above is not vacuous
    drawn = run_cli("steps", "list", "--tree")
    assert drawn.code == 0, drawn.err
    for step in fed_from:
        assert f" {step}  " in drawn.out, drawn.out
    assert "└── sft_jsonl → sft  Supervised fine-tuning" in drawn.out, drawn.out


def test_python_m_and_console_script_agree(run_cli: Any) -> None:
    r = run_cli("steps", "show", "rl/reinforce", "--json")
    data = json.loads(r.out)
    assert data["manifest"]["step"]["launch"] == "torchrun"
    assert [c["name"] for c in data["consumes"]] == ["prompts", "policy", "reward_model"]
    script = Path(sys.executable).parent / "nemotron"
    out = subprocess.run(
        [str(script), "steps", "show", "rl/reinforce", "--json"], capture_output=True, text=True
    )
    assert json.loads(out.stdout) == data
