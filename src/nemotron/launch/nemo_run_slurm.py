"""Our layer over NeMo-Run's Slurm job details (imports nemo_run: only the submit path loads this module).

NeMo-Run pastes each srun's `--output` path into the script unquoted (its `noquote`), so a job dir with a space
or a `$(...)` broke the script or ran the text. `QuotedJobDetails` hands NeMo-Run the path already quoted, with
only Slurm's `%j` and the restart-count variable left for the shell to see.
"""

from __future__ import annotations

from dataclasses import dataclass

from nemo_run.core.execution.slurm import SlurmJobDetails

from nemotron.launch.nemo_run_layout import srun_log


@dataclass(kw_only=True)
class QuotedJobDetails(SlurmJobDetails):  # type: ignore[misc]  # nemo_run ships no types
    @property
    def srun_stdout(self) -> str:
        assert self.folder and self.job_name
        return srun_log(self.folder, self.job_name, ".out")

    @property
    def srun_stderr(self) -> str:
        assert self.folder and self.job_name
        return srun_log(self.folder, self.job_name, ".err")
