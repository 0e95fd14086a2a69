"""Slurm and NeMo-RL rendering as pure functions: what goes where, what never appears, and what the CLI imports."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from tests.launch.checkpoints import reward_model_dir

from nemotron.catalog import Catalog
from nemotron.compile import Job, compile_job
from nemotron.errors import UserError
from nemotron.launch import containers, slurm_executor, slurm_script, submit
from nemotron.launch.lepton_site import lepton_name
from nemotron.plan.served import served_model, vllm_judge

SERVED_STEPS = Path(__file__).resolve().parents[1] / "slurm" / "steproot"
PROFILES = """
[gpu]
extends = "slurm_rlhf"
tunnel = "local"
env_vars = { WANDB_API_KEY = "sk-live-abcdef123456", HF_HOME = "/hf home" }

[cpu]
extends = "local_slurm"
run_partition = "interactive"
batch_partition = "long"
"""


@pytest.fixture
def profiles(home: Path, tmp_path: Path) -> Path:
    (tmp_path / "env.toml").write_text(PROFILES)
    return tmp_path / "env.toml"


def job(step: str, profile: str, *overrides: str, preset: str = "default", **kw: Any) -> Job:
    return compile_job(Catalog(), step, preset, list(overrides), profile_name=profile, **kw)


def test_profile_secrets_reach_only_the_sourced_0600_file_never_the_script(profiles: Path) -> None:
    j = job("rl/ppo", "gpu", mode="batch")
    plan = slurm_executor.slurm_plan(j)
    text = submit.dry_run(j)
    script = slurm_script.render_sbatch(plan)
    assert "sk-live-abcdef123456" not in text and "sk-live-abcdef123456" not in script
    assert plan.secret_names == ("WANDB_API_KEY", "NEMOTRON_REWARD_TOKEN")
    # sourced with tracing off (the script runs under `set -vx`, which would echo every export)
    assert f"{{ set +vx; }} 2>/dev/null; source {plan.paths.job_dir}/.secrets.env; set -vx" in script
    # a non-secret value with a space stays one shell word
    assert "export HF_HOME='/hf home'" in script


def test_partition_follows_run_or_batch_mode(profiles: Path, fixture_steps: Path) -> None:
    attached = slurm_script.render_sbatch(
        slurm_executor.slurm_plan(job("test/count", "cpu", preset="tiny", mode="attached"))
    )
    batch = slurm_script.render_sbatch(
        slurm_executor.slurm_plan(job("test/count", "cpu", preset="tiny", mode="batch"))
    )
    plain = slurm_script.render_sbatch(
        slurm_executor.slurm_plan(job("test/count", "local_slurm", preset="tiny", mode="batch"))
    )
    assert "#SBATCH --partition=interactive" in attached
    assert "#SBATCH --partition=long" in batch
    assert "#SBATCH --partition=debug" in plain


def test_a_step_without_services_is_one_group(home: Path, fixture_steps: Path) -> None:
    plan = slurm_executor.slurm_plan(job("test/count", "local_slurm", preset="tiny"))
    assert [g.role for g in plan.groups] == ["test-count"]
    script = slurm_script.render_sbatch(plan)
    assert "hetjob" not in script and "NEMOTRON_REWARD" not in script and ".secrets.env" not in script


def test_services_make_a_hetjob_serving_the_reward_model_input(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEMOTRON_STEPS_PATH", str(SERVED_STEPS))
    rm = reward_model_dir(tmp_path / "rm")
    plan = slurm_executor.slurm_plan(
        job("test/served", "local_slurm", f"inputs.reward_model={rm}", preset="tiny")
    )
    server, policy = plan.groups
    assert server.role == "test-served-0" and policy.role == "test-served-1"
    assert server.command.words()[1:4] == ["-m", "nemotron.reward.server", "--model"]
    assert str(rm) in server.command.args and "--max-length" in server.command.args
    assert server.command.args[server.command.args.index("--max-length") + 1] == "48"  # the model's positions
    assert dict(policy.env)["NEMOTRON_REWARD_URL"] == '"http://${het_group_host_0}:${NEMOTRON_REWARD_PORT}"'
    # the step starts once the server wrote its ready file
    assert (
        policy.command.entrypoint == "bash"
        and "logs/reward_server.json ] && break; sleep 1; done;" in policy.command.args[0]
    )
    assert "exec " in policy.command.args[0] and "not ready after 3600 s" in policy.command.args[0]
    assert "NEMOTRON_REWARD_TOKEN" in plan.secret_names


def test_rlhf_serves_its_judge_only_when_the_judge_is_a_reward_model(home: Path, tmp_path: Path) -> None:
    generative = slurm_executor.slurm_plan(
        job("rl/rlhf", "local_slurm")
    )  # HF hub id: the step starts its own judge
    assert len(generative.groups) == 1
    key = "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model"
    served = served_model(
        job("rl/rlhf", "local_slurm", f"{key}={reward_model_dir(tmp_path / 'rm')}", "judge.kind=reward_model")
    )
    assert served is not None and served.input_name == "judge" and served.server == "rm"


def test_a_generative_judge_on_vllm_is_group_0_running_vllm_serve(home: Path) -> None:
    j = job("rl/rlhf", "local_slurm", "backend=builtin", "env.should_use_nemo_gym=false", "judge.server=vllm")
    plan = slurm_executor.slurm_plan(j)
    server, policy = plan.groups
    words = server.command.words()
    assert words[1:5] == ["-m", "nemotron.reward.vllm_serve", "--model", "meta-llama/Llama-3.2-1B-Instruct"]
    assert (
        words[words.index("--host") + 1] == "0.0.0.0"
        and words[words.index("--port") + 1] == "$NEMOTRON_REWARD_PORT"
    )
    assert "--ready-file" in words and "--threads" not in words  # vLLM's own threads, not torch's
    assert (
        words[words.index("--memory") + 1] == "0.3"
    )  # judge.vllm_gpu_memory_utilization (CPU build: of RAM)
    assert dict(policy.env)["NEMOTRON_REWARD_URL"] == '"http://${het_group_host_0}:${NEMOTRON_REWARD_PORT}"'
    assert "vllm serve (the judge) was not ready after 3600 s" in policy.command.args[0]
    # the token reaches vllm serve through the 0600 secrets file, never the script
    assert "NEMOTRON_REWARD_TOKEN" in plan.secret_names
    assert "VLLM_API_KEY" not in slurm_script.render_sbatch(plan)


@pytest.mark.parametrize(
    "overrides",
    [
        ("judge.server=builtin",),  # our chat server: one per node beside the trainer
        ("judge.kind=reward_model",),  # a hub id cannot be a served reward model here
    ],
)
def test_without_judge_server_vllm_the_generative_judge_is_not_a_group(
    home: Path, overrides: tuple[str, ...]
) -> None:
    j = job("rl/rlhf", "local_slurm", "backend=builtin", "env.should_use_nemo_gym=false", *overrides)
    assert vllm_judge(j) is None
    assert len(slurm_executor.slurm_plan(j).groups) == 1


def test_container_image_is_squashed_once_and_force_squash_reimports(profiles: Path) -> None:
    again = slurm_script.render_sbatch(slurm_executor.slurm_plan(job("rl/reinforce", "gpu")))
    forced = slurm_script.render_sbatch(
        slurm_executor.slurm_plan(job("rl/reinforce", "gpu", force_squash=True))
    )
    sqsh = f"{os.environ['NEMOTRON_HOME']}/jobs/nvcr.io+nvidia+nemo+25.07.sqsh"  # LocalTunnel: jobs live here
    assert f"if [ ! -f {sqsh} ]; then" in again and f"rm -f {sqsh}" not in again
    assert f"rm -f {sqsh}\nif [ ! -f {sqsh} ]" in forced
    assert "enroot import --output " + sqsh + ".$SLURM_JOB_ID 'docker://nvcr.io#nvidia/nemo:25.07'" in forced
    assert f"--container-image {sqsh}" in forced


@pytest.mark.parametrize(
    ("image", "uri"),
    [
        ("nvcr.io/nvidia/nemo:25.07", "docker://nvcr.io#nvidia/nemo:25.07"),
        ("ubuntu:22.04", "docker://ubuntu:22.04"),
        ("localhost:5000/me/img", "docker://localhost:5000#me/img"),
        ("docker://nvcr.io#nvidia/nemo:25.07", "docker://nvcr.io#nvidia/nemo:25.07"),
    ],
)
def test_enroot_uri_puts_a_hash_after_the_registry(image: str, uri: str) -> None:
    assert containers.enroot_uri(image) == uri


def test_squash_file_name_is_sanitised() -> None:
    assert containers.squash_path("nvcr.io/nvidia/nemo:25.07", "/j") == "/j/nvcr.io+nvidia+nemo+25.07.sqsh"


def test_torchrun_steps_run_one_launcher_per_node(profiles: Path) -> None:
    plan = slurm_executor.slurm_plan(job("rl/reinforce", "gpu"))
    policy = plan.groups[1]
    assert policy.nodes == 2 and policy.ntasks_per_node == 1  # slurm_rlhf: 2 nodes x 8 GPUs
    inner = policy.command.args[0]
    # torchrun's agent, with Slurm's time-limit warning ignored (it would die of it)
    assert "-m nemotron.launch.torchrun_agent --nnodes 2 --nproc-per-node 8" in inner
    assert "--rdzv-endpoint $NEMOTRON_RDZV_HOST:$((20000+SLURM_JOB_ID%10000))" in inner
    assert dict(policy.env)["NEMOTRON_RDZV_HOST"] == '"${het_group_host_1}"'


def test_a_server_step_runs_one_task_per_node_whatever_the_profile_asks(profiles: Path) -> None:
    """rm/serve on 2 nodes x 8 tasks (slurm_rlhf) used to start 16 servers, 8 to a node on one port."""
    j = job("rm/serve", "gpu")
    plan = slurm_executor.slurm_plan(j)
    (group,) = plan.groups
    assert (group.nodes, group.ntasks_per_node) == (2, 1)
    script = slurm_script.render_sbatch(plan)
    assert "#SBATCH --nodes=2\n" in script and "#SBATCH --ntasks-per-node=1\n" in script
    assert "--ntasks-per-node=8" not in script
    # one srun starts the server, with no task count of its own: the allocation's one task per node
    (serve,) = [
        line for line in script.splitlines() if line.startswith("srun ") and "rm/serve/step.py" in line
    ]
    assert "--ntasks" not in serve and " -n " not in serve and "torchrun_agent" not in serve
    # so each node has one process on the preset's port
    assert j.step_config["server"]["port"] == 5555
    text = submit.dry_run(j)
    assert (
        "# note: rm/serve is a server: one server process per node (2 in all), not the profile's ntasks_per_node=8"
        in text
    )


def test_a_server_step_on_one_task_per_node_has_nothing_to_say(home: Path) -> None:
    plan = slurm_executor.slurm_plan(job("rm/serve", "local_slurm", preset="tiny"))
    assert [(g.nodes, g.ntasks_per_node) for g in plan.groups] == [(1, 1)] and plan.notes == ()
    assert "# note:" not in slurm_script.render_text(plan)


def test_ssh_profiles_need_a_job_dir_and_map_the_code_root(home: Path) -> None:
    j = job("rl/ppo", "slurm_rlhf")
    plan = slurm_executor.slurm_plan(j)
    assert plan.paths.job_dir == f"/lustre/me/nemotron/jobs/{j.job_id}"
    assert plan.paths.home == "/lustre/me/nemotron"
    assert "/lustre/me/nemotron/code/steps/rl/ppo/step.py" in plan.groups[1].command.args[0]


def test_lepton_names_fit_kubernetes_and_keep_the_unique_suffix() -> None:
    name = lepton_name("my-very-long-step-name-with-parts-20250101-120000-abcd")
    assert len(name) <= 35 and name.endswith("-20250101-120000-abcd") and name == name.lower()
    assert lepton_name("rl-ppo-20250101-120000-abcd") == "rl-ppo-20250101-120000-abcd"


@pytest.mark.parametrize("profile", ["local_slurm", "slurm_rlhf", "lepton_rl"])
def test_dry_run_imports_neither_nemo_run_nor_torch_nor_leptonai(
    home: Path, profile: str, run_cli_imports: Any
) -> None:
    done, imported = run_cli_imports(
        "steps", "run", "rl/reinforce", "-c", "default", "-b", profile, "--dry-run", timeout=60
    )
    assert done.code == 0, done.err[-2000:]
    assert "nemotron.compile" in imported  # imports are being recorded
    assert not {m for m in imported if m.split(".")[0] in ("nemo_run", "torch", "leptonai", "torchx")}
    assert not home.exists()


def test_a_plain_python_step_runs_once_whatever_the_profile_asks(profiles: Path) -> None:
    """data/prep (launch = "python") on slurm_rlhf (2 nodes x 8 tasks) used to run 16 copies writing one output."""
    plan = slurm_executor.slurm_plan(job("data/prep", "gpu"))
    (group,) = plan.groups
    assert (group.nodes, group.ntasks_per_node) == (1, 1)
    assert plan.notes == (
        "data/prep runs as one process (python launch): 1 node, 1 task, not the profile's 2 node(s) x 8 task(s)",
    )
    script = slurm_script.render_sbatch(plan)
    assert "#SBATCH --nodes=1" in script and "#SBATCH --ntasks-per-node=1" in script


def test_a_one_process_torchrun_step_is_not_copied_per_task(profiles: Path, tmp_path: Path) -> None:
    """One GPU per node and 8 tasks per node on one node: one rank, so one process, not 8."""
    (tmp_path / "env.toml").write_text(
        PROFILES + '\n[one_gpu]\nextends = "local_slurm"\ngpus_per_node = 1\nntasks_per_node = 8\n'
    )
    (group,) = slurm_executor.slurm_plan(job("sft", "one_gpu", preset="tiny")).groups
    assert (group.nodes, group.ntasks_per_node) == (1, 1)
    assert "torchrun_agent" not in " ".join(group.command.words())


def test_the_judge_s_vllm_memory_share_reaches_group_0_and_is_refused_without_vllm(home: Path) -> None:
    base = ("backend=builtin", "env.should_use_nemo_gym=false")
    j = job("rl/rlhf", "local_slurm", *base, "judge.server=vllm", "judge.vllm_gpu_memory_utilization=0.8")
    words = slurm_executor.slurm_plan(j).groups[0].command.words()
    assert words[words.index("--memory") + 1] == "0.8"
    with pytest.raises(
        UserError, match=r"judge\.vllm_gpu_memory_utilization acts only with judge\.server=vllm"
    ):
        job("rl/rlhf", "local_slurm", *base, "judge.vllm_gpu_memory_utilization=0.8")


def test_time_limit_warning_reaches_our_steps_only(profiles: Path, tmp_path: Path) -> None:
    """`#SBATCH --signal=USR1@N` for our own steps (they checkpoint and requeue on it), none when the profile turns
    it off, none for NeMo-Aligner's hetjob (its processes would die of SIGUSR1)."""
    script = slurm_script.render_sbatch(slurm_executor.slurm_plan(job("rl/reinforce", "gpu")))
    assert script.count("#SBATCH --signal=USR1@300\n") == 2  # each group of the hetjob
    (tmp_path / "env.toml").write_text(PROFILES + '\n[quiet]\nextends = "gpu"\ntime_limit_signal_s = 0\n')
    assert "--signal" not in slurm_script.render_sbatch(
        slurm_executor.slurm_plan(job("rl/reinforce", "quiet"))
    )
    aligner = submit.dry_run(job("rl/reinforce", "gpu", preset="nemo_aligner"))
    assert "#SBATCH hetjob" in aligner and "--signal" not in aligner


def test_the_team_store_url_reaches_the_nodes_and_its_password_only_the_0600_file(
    profiles: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEMOTRON_STORE_URL", "postgresql://team@db.example.com:5432/nemotron")
    j = job("rl/ppo", "gpu", mode="batch")
    script = slurm_script.render_sbatch(slurm_executor.slurm_plan(j))
    assert "export NEMOTRON_STORE_URL=postgresql://team@db.example.com:5432/nemotron" in script
    assert "export NEMOTRON_STORE_URL=postgresql://team@db.example.com:5432/nemotron" in submit.dry_run(j)
    monkeypatch.setenv("NEMOTRON_STORE_URL", "postgresql://team:hunter2@db.example.com:5432/nemotron")
    j = job("rl/ppo", "gpu", mode="batch")
    plan = slurm_executor.slurm_plan(j)
    text, script = submit.dry_run(j), slurm_script.render_sbatch(plan)
    assert "hunter2" not in text and "hunter2" not in script and "NEMOTRON_STORE_URL=" not in script
    assert "NEMOTRON_STORE_URL" in plan.secret_names
    from nemotron.launch.slurm import SECRETS_FILE, write_secrets

    write_secrets(j, tmp_path, plan.secret_names)
    written = (tmp_path / SECRETS_FILE).read_text()
    assert "export NEMOTRON_STORE_URL=postgresql://team:hunter2@db.example.com:5432/nemotron" in written
    assert (tmp_path / SECRETS_FILE).stat().st_mode & 0o777 == 0o600
