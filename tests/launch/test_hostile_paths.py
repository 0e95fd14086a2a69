"""Hostile paths never reach a shell unquoted: the rendered sbatch script is executed with stub `srun`/`scontrol`
that record their arguments, and no `$(...)`, backtick, `;` or space in $NEMOTRON_HOME runs or splits a word."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from nemotron.catalog import Catalog
from nemotron.compile import compile_job
from nemotron.errors import UserError
from nemotron.launch import slurm_executor, slurm_script

FIXTURE_STEPS = Path(__file__).resolve().parents[1] / "fixtures" / "steproot"
STUBS = {
    # every srun records its words, each ended by a NUL (a word may hold newlines), then an end marker, in one
    # write (a hetjob's sruns run at once)
    "srun": '#!/bin/bash\nprintf "%s\\0" "$@" "--end--" >> "$STUB_LOG"\n',
    "scontrol": "#!/bin/bash\necho node1\n",
}
# any printable directory name, shell and Hydra grammar included
HOMES = st.text(alphabet=st.sampled_from(list(" $();`'\"&|<>*?!#~\\{}[]=aZ9._-")), min_size=1, max_size=12)
HOSTILE = [
    "x $(touch PWNED1);y",
    "a`touch PWNED2`b",
    "q'uote\"s",
    "semi;colon & amp | pipe",
    "dollar $HOME ${PATH}",
]


def _script(home: Path) -> tuple[str, str]:
    job = compile_job(Catalog(), "test/count", "tiny", [], profile_name="local_slurm", mode="batch")
    plan = slurm_executor.slurm_plan(job)
    return slurm_script.render_sbatch(plan), plan.paths.job_dir


def _run_with_stubs(script: str, tmp: Path) -> list[list[str]]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp / "job.sh").write_text(script)
    log = tmp / "srun.log"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STUB_LOG": str(log),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node1",
    }
    done = subprocess.run(
        ["bash", str(tmp / "job.sh")], cwd=tmp, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    calls, current = [], []
    for word in log.read_text().split("\0")[:-1]:
        if word == "--end--":
            calls.append(current)
            current = []
        else:
            current.append(word)
    return calls


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_hostile_home_is_one_word_in_every_srun(
    hostile: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / hostile / "home"
    monkeypatch.setenv("NEMOTRON_HOME", str(home))
    monkeypatch.setenv("NEMOTRON_STEPS_PATH", str(FIXTURE_STEPS))
    monkeypatch.delenv("NEMOTRON_ENV_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    script, job_dir = _script(home)
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0

    calls = _run_with_stubs(script, tmp_path)

    step = calls[-1]
    assert step[step.index("--job-dir") + 1] == job_dir  # the job dir arrives whole, $(...) and all
    assert step[step.index("--output") + 1].startswith(str(home))
    assert step[step.index("--output") + 1].endswith("_%j_0.out")
    assert not list(tmp_path.rglob("PWNED*")), "a hostile path ran a command"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=HOMES)
def test_any_printable_home_renders_a_script_bash_accepts(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if name in (".", ".."):
        return
    monkeypatch.setenv("NEMOTRON_HOME", str(tmp_path / name / "home"))
    monkeypatch.setenv("NEMOTRON_STEPS_PATH", str(FIXTURE_STEPS))
    monkeypatch.delenv("NEMOTRON_ENV_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    script, _ = _script(tmp_path)
    assert subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True).returncode == 0


def test_a_home_with_a_newline_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMOTRON_HOME", str(tmp_path / "a\nb"))
    monkeypatch.setenv("NEMOTRON_STEPS_PATH", str(FIXTURE_STEPS))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="control character"):
        _script(tmp_path)


def test_a_lepton_job_root_the_pod_shell_cannot_carry_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "env.toml").write_text('[lep]\nextends = "lepton_rl"\nnemo_run_dir = "/mnt/x $(reboot)"\n')
    monkeypatch.setenv("NEMOTRON_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("NEMOTRON_ENV_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    job = compile_job(Catalog(), "rl/reinforce", "default", [], profile_name="lep", mode="batch")
    from nemotron.launch.lepton import LeptonExecutor

    with pytest.raises(UserError, match="cannot carry"):
        LeptonExecutor().placement(job)


def _aligner_script(home: Path) -> tuple[str, str]:
    """backend=nemo_aligner's hetjob (no container, so the stubbed script runs through): script, actor log dir."""
    from dataclasses import replace

    from nemotron.engines.base import HetJob
    from nemotron.engines.nemo_aligner.engine import NemoAlignerEngine
    from nemotron.launch import het_slurm
    from nemotron.plan.placement import Placement

    job = compile_job(
        Catalog(),
        "rl/reinforce",
        "nemo_aligner",
        [],
        profile_name="local_slurm",
        mode="batch",
    )
    job = replace(job, profile=job.profile.model_copy(update={"nemo_aligner_image": ""}))
    paths = slurm_executor.slurm.cluster_paths(job, home, "python")
    launch = NemoAlignerEngine().launch(job, Placement(paths.job_dir, 2, 0))
    assert isinstance(launch, HetJob)
    plan = het_slurm.plan_het(job, launch)
    return slurm_script.render_sbatch(plan), f"{paths.job_dir}/actor_results"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=HOMES)
def test_any_printable_home_reaches_nemo_aligner_whole(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shlex
    import tempfile

    from nemotron.engines.nemo_aligner.scripts import hydra_value

    # NeMo-Run's `$name` macros read `$$` as an escaped `$` (in its own submission too): a home holding one never
    # gets here, since placement refuses any `$` in it (slurm.refuse_unsafe_paths)
    assume(name not in (".", "..") and "$$" not in name)
    run_dir = Path(tempfile.mkdtemp(dir=tmp_path))  # one per example: the stubs' log must start empty
    home = run_dir / name / "home"
    monkeypatch.setenv("NEMOTRON_HOME", str(home))
    monkeypatch.delenv("NEMOTRON_STEPS_PATH", raising=False)
    monkeypatch.delenv("NEMOTRON_ENV_FILE", raising=False)
    monkeypatch.chdir(run_dir)
    script, log_dir = _aligner_script(home)
    calls = _run_with_stubs(script, run_dir)
    actor_call = next(c for c in calls if "train_gpt_reinforce_actor.py" in c[-1])
    actor = shlex.split(
        actor_call[-1]
    )  # the actor's `bash -c` text: its waiting loop, then `exec python ...`
    assert f"exp_manager.explicit_log_dir={hydra_value(log_dir)}" in actor  # one word, every character kept
    assert not list(run_dir.rglob("PWNED*")), "a hostile path ran a command"
