"""The NeMo-Aligner engine: rl/reinforce, rl/ppo and rm/serve as NeMo-Aligner v0.7.0's own scripts (pinned in
`nemotron.config.targets`) in the NeMo container, one heterogeneous Slurm job: the reward (and critic) servers first, the
actor last. The config compiler is `nemotron.engines.nemo_aligner.config`; this class turns its result into the
executor's launch shape."""

from __future__ import annotations

import shlex

from nemotron.compile import Job
from nemotron.config.targets import NEMO_ALIGNER_DIR, NEMO_ALIGNER_IMAGE, NEMO_ALIGNER_VERSION
from nemotron.engines.base import HetGroup, HetJob, Launch, pinned_or_profile
from nemotron.engines.nemo_aligner.config import compile_aligner
from nemotron.engines.remote_tracking import RunLabels
from nemotron.plan.placement import Placement


class NemoAlignerEngine:
    name = "nemo_aligner"

    def launch(self, job: Job, where: Placement) -> Launch:
        # the profile may name another image or checkout holding the pinned tag; image "": the nodes' own
        image = pinned_or_profile(job, "nemo_aligner_image", NEMO_ALIGNER_IMAGE)
        checkout = pinned_or_profile(job, "nemo_aligner_dir", NEMO_ALIGNER_DIR) or NEMO_ALIGNER_DIR
        run = compile_aligner(job.step_id, job.step_model, where, RunLabels.of(job))
        python = str(getattr(job.profile, "python", None) or "python")
        tasks = max(where.gpus_per_node, 1)  # one process per GPU, as Lightning expects under Slurm
        groups = tuple(
            HetGroup(
                role=s.role,
                argv=(python, f"{checkout}/{s.script}", *s.words()),
                nodes=s.nodes,
                tasks_per_node=tasks,
                env=tuple(sorted(s.env.items())),
                waits_for=s.waits_for,
            )
            for s in run.groups
        )
        where_it_runs = f"in {image}" if image else "on the nodes' own environment"
        shown = [
            f"# backend=nemo_aligner: NeMo-Aligner {NEMO_ALIGNER_VERSION} ({checkout}) {where_it_runs}, "
            f"one heterogeneous job of {len(groups)} group(s), {tasks} task(s) per node"
        ]
        if where.gpus_per_node < 1:
            shown.append(
                "# note: the profile gives no GPUs per node; NeMo-Aligner needs GPUs (gpus_per_node)"
            )
        shown += [f"# note: {note}" for note in run.notes]
        prepare = " ".join(shlex.quote(w) for w in (python, *run.prepare)) if run.prepare else ""
        if prepare:
            shown.append(f"# ---- first, once (its data files in the job dir)\n{prepare}")
        for i, (s, g) in enumerate(zip(run.groups, groups, strict=True)):
            shown.append(f"# ---- group {i}: {s.role} on {s.nodes} node(s), config conf/{s.yaml}")
            shown.append(" \\\n    ".join(shlex.quote(w) for w in g.argv))
        shown += [f"# ---- registered after success: {n} <- {p}" for n, p in sorted(run.outputs.items())]
        return HetJob(
            prepare=prepare,
            image=image,
            groups=groups,
            outputs=tuple(sorted(run.outputs.items())),
            ports=tuple(run.ports.items()),
            shown="\n".join(shown) + "\n# ---- executor\n",
        )
