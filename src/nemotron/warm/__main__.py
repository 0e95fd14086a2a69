"""`python -m nemotron.warm serve SOCKET` (the warm server) or `python -m nemotron.warm stop`."""

import sys

from nemotron.warm.server import main

sys.exit(main(sys.argv[1:]))
