"""`-b lepton_rl` through NeMo-Run's LeptonExecutor against the loopback stub of the Lepton API: the job spec it
sends is the one --dry-run renders, the job's files reach the shared mount, and status, logs and cancel map to
the API."""

from __future__ import annotations

import base64
import io
import json
import re
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nemotron.catalog import Catalog
from nemotron.compile import compile_job
from nemotron.launch import lepton, lepton_site
from nemotron.launch.lepton import LeptonExecutor

STUB_TOKEN = "stub-token-0123456789"


def submit_count(nemotron: Any, *overrides: str) -> str:
    done = nemotron("steps", "run", "test/count", "-c", "tiny", *overrides, "-b", "lepton_rl")
    assert done.code == 0, done.err[-3000:]
    return done.out.strip().splitlines()[-1]


def _mover_archive(body: dict[str, Any]) -> dict[str, str]:
    """The files NeMo-Run's data-mover job unpacks on the mount (a base64 tarball inside its command)."""
    command = body["spec"]["container"]["command"][-1]
    data = base64.b64decode(re.search(r"echo (\S+) \| base64 -d", command).group(1))  # type: ignore[union-attr]
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {
            m.name.removeprefix("./"): tar.extractfile(m).read().decode(errors="replace")
            for m in tar.getmembers()
            if m.isfile()
        }  # type: ignore[union-attr]


def test_submission_sends_the_rendered_job_spec_and_ships_the_job_files(
    nemotron: Any, fixture_steps: Path, home: Path, lepton_api: Any
) -> None:
    job_id = submit_count(nemotron, "trainer.max_steps=2")

    mover, main = lepton_api.created_jobs()
    assert mover["metadata"]["id"].startswith(
        "data-mover-"
    )  # the copy onto the mount comes first, then is deleted
    assert lepton_api.calls("DELETE", f"/jobs/{mover['metadata']['id']}")
    assert all(r.authorization == f"Bearer {STUB_TOKEN}" for r in lepton_api.requests)

    job = replace(
        compile_job(
            Catalog(), "test/count", "tiny", ["trainer.max_steps=2"], profile_name="lepton_rl", mode="batch"
        ),
        job_id=job_id,
    )
    plan = LeptonExecutor().plan(job)
    expected = lepton.job_spec(plan, "ng-0123", ["node-a", "node-b"])
    sent_nodes = main["spec"]["affinity"].pop("allowed_nodes_in_node_group")
    assert sorted(sent_nodes) == expected["spec"]["affinity"].pop("allowed_nodes_in_node_group")
    assert main == expected
    assert (
        main["spec"]["resource_shape"] == "gpu.8xh100-80gb"
        and main["spec"]["mounts"][0]["from"] == "node-nfs:lepton-shared-fs"
    )
    assert {"name": "WANDB_API_KEY", "value_from": {"secret_name_ref": "wandb-api-key"}} in main["spec"][
        "envs"
    ]

    files = _mover_archive(mover)
    assert files["launch_script.sh"] == lepton.launch_script(plan)
    assert "max_steps: 2" in files["code/config.yaml"] and f"job_id: {job_id}" in files["code/job.yaml"]
    assert not [name for name in files if "secrets" in name]

    status = json.loads(nemotron("jobs", "status", job_id, "--json").out)
    assert status["state"] == "running" and status["remote_id"] == plan.name


def test_status_logs_and_cancel_map_to_the_api(nemotron: Any, fixture_steps: Path, lepton_api: Any) -> None:
    done_id, live_id = submit_count(nemotron), submit_count(nemotron, "trainer.sleep_s=60")
    done_name, live_name = lepton_site.lepton_name(done_id), lepton_site.lepton_name(live_id)

    lepton_api.states[done_name] = "Completed"
    lepton_api.logs[done_name] = "step 1/3 value=1\nstep 3/3 value=3\n"
    assert json.loads(nemotron("jobs", "status", done_id, "--json").out)["state"] == "succeeded"
    assert "step 3/3 value=3" in nemotron("jobs", "logs", done_id).out
    assert lepton_api.calls("GET", f"/jobs/{done_name}/replicas/{done_name}-0-abcde/log")

    cancelled = nemotron("jobs", "cancel", live_id)
    assert cancelled.code == 0, cancelled.err
    assert lepton_api.calls("DELETE", f"/jobs/{live_name}")
    assert lepton_api.states[live_name] == "Stopped"
    assert json.loads(nemotron("jobs", "status", live_id, "--json").out)["state"] == "cancelled"


def test_a_step_s_exit_code_reaches_jobs_status_as_on_every_executor(
    nemotron: Any, fixture_steps: Path, home: Path, lepton_api: Any
) -> None:
    """Lepton's job state says only Failed: the launch script echoes the step's code (run_step's 2 for bad input) as
    its last log line, and `jobs status` reads it back, so 2/3/130 mean the same on Lepton as locally and on Slurm."""
    job_id = submit_count(nemotron, "trainer.bad_input_at=1")
    mover, _ = lepton_api.created_jobs()[-2:]
    name = lepton_site.lepton_name(job_id)
    script = _mover_archive(mover)["launch_script.sh"]  # what the pod runs
    assert "-m nemotron.run_step" in script and script.endswith(
        '; code=$?; echo "nemotron: job exited with code $code"; exit $code\n'
    )

    # what the pod prints when run_step refuses the input (its own line, then the script's last words)
    step = nemotron("steps", "run", "test/count", "-c", "tiny", "trainer.bad_input_at=1")
    assert step.code == 2  # locally
    lepton_api.states[name] = "Failed"
    lepton_api.logs[name] = step.err + f"nemotron: job exited with code {step.code}\n"
    shown = json.loads(nemotron("jobs", "status", job_id, "--json").out)
    assert shown["state"] == "failed" and shown["exit_code"] == 2


@pytest.mark.parametrize(
    ("step", "preset"),
    [("test/count", "tiny"), ("rl/rlhf", "default")],  # our step as a Lepton job; NeMo-RL as a RayCluster
)
def test_a_literal_secret_in_a_lepton_profile_is_refused(
    step: str, preset: str, home: Path, fixture_steps: Path, tmp_path: Path, run_cli: Any
) -> None:
    (tmp_path / "env.toml").write_text(  # 2 nodes: rl/rlhf's NeMo-Gym judge takes one beside the policy's
        '[leaky]\nextends = "lepton_rl"\nnodes = 2\nenv_vars = { HF_TOKEN = "hf_abcdefgh123456" }\n'
    )
    r = run_cli("steps", "run", step, "-c", preset, "-b", "leaky", "--dry-run", cwd=tmp_path)
    assert (
        r.code == 2
        and "HF_TOKEN" in r.err
        and "secret_vars" in r.err
        and "hf_abcdefgh123456" not in r.out + r.err
    ), r.err[-2000:]


def test_a_server_step_on_several_lepton_nodes_is_refused(home: Path, tmp_path: Path, run_cli: Any) -> None:
    """rm/serve's per-node address scheme reads Slurm's variables: its Lepton replicas would all claim node 0."""
    (tmp_path / "env.toml").write_text('[two]\nextends = "lepton_rl"\nnodes = 2\n')
    r = run_cli("steps", "run", "rm/serve", "-c", "tiny", "-b", "two", "--dry-run", cwd=tmp_path)
    assert r.code == 2 and "rm/serve is a server: on Lepton it runs on one node" in r.err, r.err[-2000:]
    assert (
        run_cli("steps", "run", "rm/serve", "-c", "tiny", "-b", "lepton_rl", "--dry-run", cwd=tmp_path).code
        == 0
    )


@pytest.mark.parametrize(
    ("args", "instead"),
    [
        (("rl/ppo", "-c", "nemo_aligner"), "use a Slurm profile, or backend=nemo_rl / builtin"),
        (
            ("convert/hf_to_nemo", "-c", "default", "inputs.checkpoint=/models/llama", "convert.family=llama",
             "convert.llama31=false"),
            "use a Slurm profile: convert/hf_to_nemo runs on Slurm only",
        ),
    ],
)  # fmt: skip
def test_a_slurm_only_job_on_lepton_says_what_runs_instead(
    args: tuple[str, ...], instead: str, home: Path, run_cli: Any
) -> None:
    """A heterogeneous Slurm job is refused on Lepton with the way out its engine has: another backend for
    NeMo-Aligner's steps, none for NeMo's converters."""
    r = run_cli("steps", "run", *args, "-b", "lepton_rl", "--dry-run")
    assert r.code == 2 and "which Lepton cannot place" in r.err and instead in r.err, r.err[-2000:]
    assert "Traceback" not in r.err
