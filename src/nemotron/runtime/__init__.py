"""What a step process uses: `step.StepRun` (its validated config, job dir, metrics and output registration),
`metrics`, where tensors live (`devices`), Slurm's time-limit warning (`preempt`), which checkpoint a run resumes
from (`resume`) and fault injection for the reliability tests (`faults`). This file imports nothing, so that
`run_step` installs `preempt` before anything heavy loads."""
