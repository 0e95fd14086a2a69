"""`python -m nemotron.run_step STEP.py --job-dir DIR`: run a flat step script as __main__, turning user mistakes
into one clear line and exit code 2 (no traceback), a failed service (reward server, judge) into exit code 3, and
SIGTERM/Ctrl-C into exit code 130."""

from __future__ import annotations

import runpy
import sys

from nemotron import preempt
from nemotron.errors import ServiceError, UserError


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: python -m nemotron.run_step STEP.py --job-dir DIR [args...]", file=sys.stderr)
        return 2
    script = sys.argv[1]
    preempt.install()  # Slurm's time-limit warning must find a handler even while the step still imports torch
    sys.argv = sys.argv[1:]
    try:
        runpy.run_path(script, run_name="__main__")
    except UserError as e:
        print(f"error: {e.render()}", file=sys.stderr, flush=True)
        return 2
    except ServiceError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        print(
            "the step stopped; its last checkpoint can be resumed with checkpoint.resume_from=<this job id>",
            file=sys.stderr,
            flush=True,
        )
        return ServiceError.exit_code
    except KeyboardInterrupt:
        print("stopped (SIGTERM or Ctrl-C)", file=sys.stderr, flush=True)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
