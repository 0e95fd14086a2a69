"""The NeMo-RL engine: rl/rlhf, rl/reinforce and rl/ppo, and eval/policy as NeMo-RL's eval entry, as NeMo-RL runs
(pinned in `nemotron.config.targets`), in NeMo-RL's container, on a Ray cluster across the profile's nodes. The config
compiler is `nemotron.engines.nemo_rl.config`; this class hands its result to the executor, and turns what the run
left into our artifact types before registration (`adopt_outputs`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nemotron.compile import Job
from nemotron.config.targets import NEMO_RL_DIR, NEMO_RL_IMAGE, NEMO_RL_VERSION
from nemotron.engines.base import Launch, RayDriver, pinned_or_profile
from nemotron.engines.nemo_rl.config import compile_run
from nemotron.engines.nemo_rl.evaluation import RECIPE, REPORT
from nemotron.engines.nemo_rl.supervised import RM_OUTPUT, RM_RECIPE, adopt_reward_model
from nemotron.engines.remote_tracking import RunLabels
from nemotron.plan.placement import Placement

if TYPE_CHECKING:
    from pathlib import Path

    from nemotron.jobs.record import JobRecord


def image(job: Job) -> str:
    """The profile may name another image (a mirror, a site build) whose NeMo-RL is the pinned tag; an empty
    string runs on the nodes' own environment (NeMo-RL installed at `nemo_rl_dir`, no container)."""
    return pinned_or_profile(job, "nemo_rl_image", NEMO_RL_IMAGE)


def nemo_rl_dir(job: Job) -> str:
    return pinned_or_profile(job, "nemo_rl_dir", NEMO_RL_DIR) or NEMO_RL_DIR


# NeMo-RL v0.7.0's algorithms print `===== Step N/M =====` as each training step starts (algorithms/grpo.py,
# sft.py, dpo.py, rm.py, ppo.py): what the watchdog times the pace of the driver by
STEP_LINE = r"(?i)\bstep \d+/\d+\b"


class NemoRLEngine:
    name = "nemo_rl"

    def adopt_outputs(self, record: JobRecord, paths: dict[str, Path]) -> dict[str, Any]:
        """Before registration: eval/policy's report is NeMo-RL's evaluation_data.json, turned into our
        eval_report in place (nemotron.engines.nemo_rl.evaluation_report); a trained reward model's HF config is
        made to name its sequence-classification architecture (supervised.adopt_reward_model); the other outputs
        are HF checkpoints already. Returns the registration metadata."""
        from nemotron.catalog import Catalog

        step = Catalog().steps.get(record.step)  # a step gone from the search path adopts nothing
        recipe = step.manifest.step.engines.get(self.name) if step is not None else None
        if recipe == RM_RECIPE:
            adopt_reward_model(paths[RM_OUTPUT])
            return {}
        if recipe != RECIPE:
            return {}
        from nemotron.engines.nemo_rl.evaluation_report import adopt_report

        return adopt_report(record, paths[REPORT])

    def launch(self, job: Job, where: Placement) -> Launch:
        run = compile_run(
            job.step_id, job.step_model, where, nemo_rl_dir=nemo_rl_dir(job), labels=RunLabels.of(job)
        )
        files = tuple(sorted(run.files.items()))
        where_it_runs = (
            f"in {image(job)}" if image(job) else f"on the nodes' own environment ({nemo_rl_dir(job)})"
        )
        shown = [
            f"# backend=nemo_rl: NeMo-RL {NEMO_RL_VERSION} ({run.entry}) {where_it_runs}, Ray across "
            f"{where.nodes} node(s) x {where.gpus_per_node} GPU(s)"
        ]
        if where.gpus_per_node < 1:
            shown.append(
                "# note: the profile gives no GPUs per node; NeMo-RL's workers need GPUs (gpus_per_node)"
            )
        shown += [f"# ---- {where.job_dir}/{name}\n{text.rstrip()}" for name, text in files]
        shown += [f"# ---- driver (once, on the Ray head)\n{run.driver}"]
        if run.finalize:
            shown.append(f"# ---- then, if it succeeded\n{run.finalize}")
        shown += [
            f"# ---- registered after success: {name} <- {path}" for name, path in sorted(run.outputs.items())
        ]
        return RayDriver(
            image=image(job),
            driver=run.driver,
            finalize=run.finalize,
            files=files,
            outputs=tuple(sorted(run.outputs.items())),
            shown="\n".join(shown) + "\n# ---- executor\n",
            step_line=STEP_LINE,
        )
