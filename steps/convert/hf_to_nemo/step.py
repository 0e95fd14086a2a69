"""convert/hf_to_nemo runs as NeMo's own converter script in the NeMo container (backend=nemo,
nemotron.engines.nemo.engine), never as this process: nemotron.runtime.step.container_only says why."""

import sys

from nemotron.runtime.step import container_only


def main() -> int:
    return container_only("convert/hf_to_nemo", "NeMo's converter", "the NeMo container (backend=nemo)")


if __name__ == "__main__":
    sys.exit(main())
