"""Our layer over NeMo-Run's Slurm Ray cluster (imports nemo_run: only submit, status and cancel load it).

`SlurmRayCluster.create()` always renders NeMo-Run's own `ray.sub.j2`, which cannot run without pyxis, gives every
raylet the same ports and calls `scontrol --json` (facts in shared/notes/ray-on-local-slurm.md). This subclass
submits the script nemotron rendered instead, the way `create()` does (the cluster dir, `ray.sub`, `sbatch` through
the executor's tunnel, `job_ids.json`), so NeMo-Run's `SlurmRayJob` status, logs and stop work on it unchanged.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from dataclasses import dataclass

from nemo_run.run.ray.slurm import SlurmRayCluster, SlurmRayJob

from nemotron.launch.nemo_run_layout import RayClusterDirs

__all__ = ["ScriptedSlurmRayCluster", "SlurmRayJob"]


@dataclass(kw_only=True)
class ScriptedSlurmRayCluster(SlurmRayCluster):  # type: ignore[misc]  # nemo_run ships no types
    def create_from_script(self, script: str) -> str:
        """Submit `script` as this cluster's `ray.sub`; return the Slurm job id."""
        tunnel = self.executor.tunnel
        tunnel.connect()
        dirs = RayClusterDirs(tunnel.job_dir, self.name)
        tunnel.run(f"mkdir -p {shlex.quote(dirs.logs)}")
        with tempfile.NamedTemporaryFile("w", suffix=".ray.sub") as f:
            f.write(script)
            f.flush()
            tunnel.put(f.name, dirs.script)
        job_id = str(tunnel.run(f"sbatch --parsable {shlex.quote(dirs.script)}").stdout.strip())
        job_id = job_id.split(";")[0]  # `--parsable` may add ";cluster"
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump([job_id], f)
            f.flush()
            tunnel.put(f.name, f"{dirs.dir}/job_ids.json")  # where SlurmRayJob finds the id
        self.cluster_map[self.name] = job_id
        return job_id
