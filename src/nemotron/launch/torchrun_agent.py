"""`python -m nemotron.launch.torchrun_agent ARGS`: torchrun (`torch.distributed.run`, its own argument parser and
agent) as every executor starts a distributed step, with two differences:

- Slurm's time-limit warning (SIGUSR1, `nemotron.runtime.preempt`) is ignored in the agent. Slurm signals every
  process of the step; the agent catches no SIGUSR1 and would die of it, taking the ranks with it before they can
  checkpoint.
- The ranks' exit codes keep their meaning (`nemotron.run_step`: 2 bad input, 3 a needed service failed, 130
  cancelled). torchrun ends 1 with a traceback of its own whenever a rank fails; when the first rank to fail ended
  with one of those codes it has printed its one line already, so the agent ends with the same code and adds one
  line naming the rank. Any other failure prints torchrun's failure table and ends 1, as torchrun does."""

from __future__ import annotations

import sys

from nemotron.runtime import preempt

KEPT = (2, 3, 130)  # nemotron.run_step's codes for a bad input, a failed service, a cancel


def main(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(argv))  # type: ignore[no-untyped-call]  # torch leaves these untyped
    except ChildFailedError as e:
        rank, first = e.get_first_failure()
        if first.exitcode in KEPT:
            print(f"nemotron: rank {rank} ended with exit code {first.exitcode}", file=sys.stderr, flush=True)
            return first.exitcode
        print(e.format_msg(), file=sys.stderr, flush=True)  # type: ignore[no-untyped-call]
        return 1
    return 0


if __name__ == "__main__":
    preempt.ignore()
    sys.exit(main(sys.argv[1:]))
