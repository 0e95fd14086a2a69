"""Container images on Slurm: pyxis runs a `.sqsh` that enroot imports once beside the job dirs, with the
home and the artifact store mounted where the compute nodes see them."""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from nemotron.config.profiles import SlurmProfile

if TYPE_CHECKING:
    from nemotron.compile import Job


def squash_path(image: str, jobs_root: str) -> str:
    """`<jobs root>/<sanitised image>.sqsh`, shared by every job that uses the image."""
    return f"{jobs_root}/{re.sub(r'[^A-Za-z0-9._-]+', '+', image)}.sqsh"


def enroot_uri(image: str) -> str:
    """`nvcr.io/nvidia/nemo:25.07` -> `docker://nvcr.io#nvidia/nemo:25.07` (enroot puts `#` after a registry)."""
    if "://" in image:
        return image
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"docker://{first}#{rest}"
    return f"docker://{image}"


def squash_lines(image: str, sqsh: str, force: bool) -> list[str]:
    q = shlex.quote(sqsh)
    tmp = f"{q}.$SLURM_JOB_ID"
    lines = [
        "# container image: imported once on a compute node, reused by later jobs (--force-squash re-imports it)"
    ]
    if force:
        lines.append(f"rm -f {q}")
    lines += [
        f"if [ ! -f {q} ]; then",
        f"    srun --nodes=1 --ntasks=1 enroot import --output {tmp} {shlex.quote(enroot_uri(image))} && mv -f {tmp} {q} || exit 1",
        "fi",
    ]
    return lines


def container(
    job: Job[SlurmProfile], image: str | None, *, home: str, artifacts_root: str, job_dir: str
) -> tuple[str | None, list[str], tuple[str, ...]]:
    """(the image pyxis runs: a .sqsh, imported once beside the job dirs; the import lines; the mounts, with the
    home and the artifact store added), for a job whose `home`, `artifacts_root` and `job_dir` are the cluster's
    (slurm.ClusterPaths). No image: (None, [], ())."""
    if not image:
        return None, [], ()
    lines: list[str] = []
    if not image.endswith(".sqsh"):
        sqsh = squash_path(image, str(PurePosixPath(job_dir).parent))
        lines = squash_lines(image, sqsh, job.force_squash)
        image = sqsh
    shared = [home] + ([artifacts_root] if not artifacts_root.startswith(home + "/") else [])
    return image, lines, tuple(dict.fromkeys([*job.profile.mounts, *(f"{d}:{d}" for d in shared)]))
