"""Render jobs two ways, in a fresh process: our render_sbatch, and NeMo-Run's own Experiment.dryrun over the
executors `submit` would hand it. Prints [{"case": ..., "ours": ..., "nemo_run": ...}, ...] as JSON.

Usage: python nemo_run_render.py '[["STEP", "PRESET", "PROFILE", ["--force-squash", "KEY=VALUE", ...]], ...]'
($NEMOTRON_HOME set; nemo_run is imported once, with NEMORUN_HOME under it)
"""

import json
import sys
from pathlib import Path

from nemotron.catalog import Catalog
from nemotron.compile import compile_job
from nemotron.config.profiles import SlurmProfile
from nemotron.launch import remote, slurm_executor, slurm_script
from nemotron.launch.nemo_run_layout import EXPERIMENT_TITLE, QUIET_EXPERIMENT

results = []
with remote.nemo_run() as run:
    for step, preset, profile, extra in json.loads(sys.argv[1]):
        job = compile_job(
            Catalog(),
            step,
            preset,
            [a for a in extra if "=" in a],
            profile_name=profile,
            mode="batch",
            force_squash="--force-squash" in extra,
        )
        assert isinstance(job.profile, SlurmProfile)
        plan = slurm_executor.slurm_plan(job)
        executors, scripts = slurm_script.executors(run, plan, job.profile), slurm_script.scripts(run, plan)
        with run.Experiment(EXPERIMENT_TITLE, id=plan.experiment.id, **QUIET_EXPERIMENT) as exp:
            if plan.heterogeneous:
                exp.add(scripts, executor=executors, name=plan.task)
            else:
                exp.add(scripts[0], executor=executors[0], name=plan.task)
            exp.dryrun(log=False, delete_exp_dir=False)
        written = Path(plan.experiment.sbatch_script(plan.task))
        results.append(
            {
                "case": [step, profile, *extra],
                "ours": slurm_script.render_sbatch(plan),
                "nemo_run": written.read_text(),
            }
        )
print(json.dumps(results))
