"""convert/nemo_to_hf runs as NeMo's own converter script in the NeMo container (backend=nemo,
nemotron.engines.nemo.engine), never as this process: the engine compiles the job, and every executor that
cannot run the container refuses it before anything is written. This entry exists for the catalog and says so
if it is run."""

from __future__ import annotations

import sys


def main() -> int:
    print(
        "convert/nemo_to_hf: NeMo's converter runs it in the NeMo container (backend=nemo); submit it with a "
        "Slurm profile: nemotron steps run convert/nemo_to_hf -c default -b PROFILE",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
