"""`python -m nemotron` runs the CLI: here, or in a child of the warm server when NEMOTRON_WARM_CLI=1 asks for it
and no terminal is attached (nemotron.warm.cli)."""

import os
import sys

if os.environ.get("NEMOTRON_WARM_CLI") == "1":
    from nemotron.warm.cli import forward

    code = forward(sys.argv[1:])
    if code is not None:
        sys.exit(code)

from nemotron.cli.app import main  # only when the CLI runs in this process

main()
