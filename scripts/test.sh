#!/usr/bin/env bash
# The project's checks, exactly as CI runs them: lint, types, then the whole test suite.
# Brings up the local Slurm test cluster first when this machine can run it (root + apt), so its tests run too.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${NEMOTRON_VENV:-.venv}
# No core dumps: the cancel tests kill Ray and torchrun workers, and a core file there is hundreds of MB.
ulimit -c 0
export PATH="$PWD/$VENV/bin:$PATH"
if [ -f scripts/slurm-up.sh ] && [ "$(id -u)" = 0 ]; then
  bash scripts/slurm-up.sh || echo "slurm-up failed: the Slurm tests will say why they skip" >&2
fi
# The team-store tests start their own PostgreSQL server (tests/services/postgres.py); install the server when missing.
if [ "$(id -u)" = 0 ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && command -v apt-get >/dev/null; then
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; } >/dev/null \
    || echo "installing PostgreSQL failed: the PostgreSQL tests will say why they cannot run" >&2
fi
# Every Python file in the tree (pyproject's [tool.ruff] include), not only the package: scripts/ and docs/examples/ too.
ruff check
ruff format --check
mypy
# Two workers (NEMOTRON_TEST_WORKERS=0: one process); the Slurm tests share one of them (tests/conftest.py).
pytest -n "${NEMOTRON_TEST_WORKERS:-2}" --dist loadgroup --durations=15 "$@"
