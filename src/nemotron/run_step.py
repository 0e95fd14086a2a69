"""`python -m nemotron.run_step STEP.py --job-dir DIR`: run a flat step script as __main__, turning user mistakes
into one clear line and exit code 2 (no traceback), a failed service (reward server, judge) or a full disk into exit
code 3, and SIGTERM/Ctrl-C into exit code 130."""

from __future__ import annotations

import runpy
import sys

from nemotron.errors import DiskFull, ServiceError, UserError, disk_full, moved_import
from nemotron.runtime import preempt


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: python -m nemotron.run_step STEP.py --job-dir DIR [args...]", file=sys.stderr)
        return 2
    script = sys.argv[1]
    preempt.install()  # Slurm's time-limit warning must find a handler even while the step still imports torch
    sys.argv = sys.argv[1:]
    try:
        try:
            runpy.run_path(script, run_name="__main__")
        except ImportError as e:  # a module the step imports moved: one line, not a traceback
            moved = moved_import(e)
            if moved is None:
                raise
            raise moved from None
    except UserError as e:
        print(f"error: {e.render()}", file=sys.stderr, flush=True)
        return 2
    except DiskFull as e:
        return _disk_full(e)
    except ServiceError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        print(
            "the step stopped; the same command again goes on from its last checkpoint if it saved one "
            "(checkpoint.resume=auto)",
            file=sys.stderr,
            flush=True,
        )
        return ServiceError.exit_code
    except KeyboardInterrupt:
        print("stopped (SIGTERM or Ctrl-C)", file=sys.stderr, flush=True)
        return 130
    except Exception as e:
        full = disk_full(e, _job_dir())
        if full is None:
            raise
        return _disk_full(full)
    return 0


RESUME = "a step with checkpoints goes on from its last one: checkpoint.resume=auto"


def _job_dir() -> str | None:
    """The step's --job-dir: where it writes, so the path a full disk is named by when the error names none."""
    args = sys.argv
    return next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--job-dir"), None)


def _disk_full(e: DiskFull) -> int:
    """One line, exit 3: the step's last checkpoint resumes once there is space (nothing half-written was
    registered: outputs are registered after they are complete)."""
    try:
        print(f"error: {e}; free space, then run it again ({RESUME})", file=sys.stderr, flush=True)
    except OSError:
        pass  # stderr is a file on the same full disk
    return DiskFull.exit_code


if __name__ == "__main__":
    sys.exit(main())
