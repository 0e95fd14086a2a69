"""A submitted job's record in status.json is read as the launch shape it was submitted as: the new records by their
`shape`, and records written before `shape` existed (the dicts below are what that version wrote) by their old
`launch` field. A record no shape of its executor fits is one clear error naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nemotron.errors import UserError
from nemotron.launch.lepton import LeptonExecutor, LeptonProcess
from nemotron.launch.ray_lepton import LeptonRay
from nemotron.launch.ray_slurm import SlurmRay
from nemotron.launch.slurm_executor import SlurmExecutor, SlurmHetJob, SlurmProcess

LIFECYCLE = {
    "state": "running",
    "created_at": "2026-01-01T00:00:00+00:00",
    "submitted_at": "2026-01-01T00:00:01+00:00",
}
# What the version before `shape` wrote (launch/slurm_script.submit_job, ray_slurm.submit, lepton.submit_job,
# ray_lepton.submit), with the lifecycle fields beside it.
OLD_SLURM_PROCESS = LIFECYCLE | {
    "handle": "slurm_tunnel://nemo_run/812",
    "remote_id": "812",
    "remote_dir": "/h/nemorun/experiments/nemotron/nemotron_x/sft",
    "roles": ["rm-serve-0", "sft-1"],
}
OLD_SLURM_HETJOB_WITH_OUTPUTS = OLD_SLURM_PROCESS | {"register": {"policy": "/h/jobs/x/outputs/policy"}}
OLD_SLURM_RAY = LIFECYCLE | {
    "handle": "ray://nemotron-rl-rlhf-x",
    "remote_id": "813",
    "remote_dir": "/h/nemorun/ray/nemotron-rl-rlhf-x/logs",
    "roles": ["nemotron-rl-rlhf-x-driver"],
    "launch": "ray",
    "ray_name": "nemotron-rl-rlhf-x",
    "ray_root": "/h/nemorun/ray/nemotron-rl-rlhf-x",
    "register": {"policy": "/h/jobs/x/outputs/policy"},
    "profile": {
        "executor": "slurm",
        "tunnel": "ssh",
        "host": "login",
        "user": "me",
        "identity": None,
        "account": "a",
    },
}
OLD_LEPTON_PROCESS = LIFECYCLE | {"handle": "lepton://x", "remote_id": "sft-x", "roles": ["sft-x"]}
OLD_LEPTON_RAY = LIFECYCLE | {
    "handle": "lepton-ray://rl-rlhf-x",
    "remote_id": "rl-rlhf-x",
    "submission_id": "rl-rlhf-x-1",
    "roles": ["rl-rlhf-x"],
    "launch": "ray",
    "register": {"policy": "/mnt/jobs/x/outputs/policy"},
    "profile": {
        "executor": "lepton",
        "node_group": "ng",
        "resource_shape": "gpu.8xh100",
        "nemo_run_dir": None,
        "mounts": [{"from": "node-nfs:shared", "path": "/shared", "mount_path": "/mnt"}],
    },
}


def _read(executor: Any, status: dict[str, Any], tmp_path: Path) -> Any:
    return executor.record(json.loads(json.dumps(status)), tmp_path)


def test_records_written_before_shape_read_as_the_shape_their_launch_meant(tmp_path: Path) -> None:
    slurm, lepton = SlurmExecutor(), LeptonExecutor()

    process = _read(slurm, OLD_SLURM_PROCESS, tmp_path)
    assert type(process) is SlurmProcess and process.remote_dir == OLD_SLURM_PROCESS["remote_dir"]
    assert process.roles == ["rm-serve-0", "sft-1"] and process.outputs == {}
    # a hetjob's record said nothing of its shape: it reads as a process, whose questions it answered the same way
    assert type(_read(slurm, OLD_SLURM_HETJOB_WITH_OUTPUTS, tmp_path)) is SlurmProcess
    assert _read(slurm, OLD_SLURM_HETJOB_WITH_OUTPUTS, tmp_path).outputs == {
        "policy": "/h/jobs/x/outputs/policy"
    }

    ray = _read(slurm, OLD_SLURM_RAY, tmp_path)
    assert type(ray) is SlurmRay and ray.ray_name == "nemotron-rl-rlhf-x" and ray.ray_root.endswith("-x")
    assert (ray.profile.tunnel, ray.profile.host, ray.profile.user) == ("ssh", "login", "me")
    assert ray.outputs == {"policy": "/h/jobs/x/outputs/policy"}

    assert type(_read(lepton, OLD_LEPTON_PROCESS, tmp_path)) is LeptonProcess
    lepton_ray = _read(lepton, OLD_LEPTON_RAY, tmp_path)
    assert type(lepton_ray) is LeptonRay and lepton_ray.submission_id == "rl-rlhf-x-1"
    assert lepton_ray.profile.node_group == "ng" and lepton_ray.profile.mounts[0].mount_path == "/mnt"


def test_a_record_is_written_with_its_shape_and_reads_back_as_it(tmp_path: Path) -> None:
    slurm, lepton = SlurmExecutor(), LeptonExecutor()
    for executor, old, kind in [
        (slurm, OLD_SLURM_PROCESS, SlurmProcess),
        (slurm, OLD_SLURM_RAY, SlurmRay),
        (lepton, OLD_LEPTON_PROCESS, LeptonProcess),
        (lepton, OLD_LEPTON_RAY, LeptonRay),
    ]:
        written = _read(executor, old, tmp_path).model_dump(mode="json", by_alias=True)
        assert written["shape"] == kind.model_fields["shape"].default and "launch" not in written
        # the old record's fields, the old discriminator replaced by the new one
        old_fields = {k: v for k, v in old.items() if k not in LIFECYCLE and k != "launch"}
        assert written == old_fields | {"shape": written["shape"], "register": old.get("register", {})}
        again = _read(executor, LIFECYCLE | written, tmp_path)
        assert type(again) is kind and again == _read(executor, old, tmp_path)
    het = SlurmHetJob.model_validate(OLD_SLURM_HETJOB_WITH_OUTPUTS | {"shape": "hetjob"})
    assert type(_read(slurm, het.model_dump(mode="json", by_alias=True), tmp_path)) is SlurmHetJob


def test_the_profile_a_ray_record_keeps_is_only_what_reaches_the_cluster(tmp_path: Path) -> None:
    """status.json is not secret: the record keeps the fields that reach the cluster, not the profile's env."""
    ray = _read(SlurmExecutor(), OLD_SLURM_RAY, tmp_path)
    full = ray.model_copy(
        update={"profile": ray.profile.model_copy(update={"env_vars": {"WANDB_API_KEY": "s3cr3t"}})}
    )
    written = full.model_dump(mode="json", by_alias=True)
    assert written["profile"] == OLD_SLURM_RAY["profile"] and "s3cr3t" not in json.dumps(written)
    lepton = _read(LeptonExecutor(), OLD_LEPTON_RAY, tmp_path)
    assert lepton.model_dump(mode="json", by_alias=True)["profile"] == OLD_LEPTON_RAY["profile"]


@pytest.mark.parametrize(
    ("executor", "status", "names"),
    [
        (LeptonExecutor(), OLD_LEPTON_PROCESS | {"shape": "hetjob"}, "shape"),  # no hetjob on Lepton
        (SlurmExecutor(), {k: v for k, v in OLD_SLURM_RAY.items() if k != "ray_root"}, "ray.ray_root"),
        (SlurmExecutor(), OLD_SLURM_PROCESS | {"launch": "kubernetes"}, "kubernetes"),
    ],
)
def test_a_record_no_shape_fits_is_one_error_naming_the_file(
    executor: Any, status: dict[str, Any], names: str, tmp_path: Path
) -> None:
    with pytest.raises(UserError) as e:
        _read(executor, status, tmp_path)
    assert str(tmp_path / "status.json") in e.value.message and names in str(e.value)
