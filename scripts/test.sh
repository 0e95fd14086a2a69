#!/usr/bin/env bash
# The project's checks, exactly as CI runs them: lint, then types beside the whole test suite.
# Brings up the local Slurm test cluster first when this machine can run it (root + apt), so its tests run too.
#   bash scripts/test.sh                 everything (CI)
#   bash scripts/test.sh --quick         the inner loop, about 5 minutes: lint, types, every test recorded under 2 s
#                                        in tests/test_seconds.json and one tiny step end to end (no Slurm)
#   bash scripts/test.sh tests/rl -x     other arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${NEMOTRON_VENV:-.venv}
# No core dumps: the cancel tests kill Ray and torchrun workers, and a core file there is hundreds of MB.
ulimit -c 0
# Local steps fork from warm servers (docs/executors.md): this run's own, in a folder of its own, stopped at the end.
export NEMOTRON_WARM_DIR=${NEMOTRON_WARM_DIR:-$(mktemp -d /tmp/nemotron-test-warm.XXXXXX)}
export NEMOTRON_WARM_IDLE_S=${NEMOTRON_WARM_IDLE_S:-300}  # a server some tests' environment needed goes sooner
# and so does the CLI the tests run a few thousand times (`python -m nemotron`, no terminal): docs/executors.md
export NEMOTRON_WARM_CLI=${NEMOTRON_WARM_CLI:-1}
export PATH="$PWD/$VENV/bin:$PATH"
quick=0
[ "${1:-}" = "--quick" ] && quick=1
[ $quick = 1 ] || bash scripts/test-services.sh
# Every Python file in the tree (pyproject's [tool.ruff] include), not only the package: scripts/ and docs/examples/ too.
ruff check
ruff format --check
# mypy from a fresh clone (no cache) is about 100 s on one core, which left the other idle: it checks beside the
# tests, and its verdict comes after theirs (either failing fails the run).
types_log=$(mktemp /tmp/nemotron-mypy.XXXXXX)
mypy >"$types_log" 2>&1 &
types=$!
trap 'kill $types 2>/dev/null || true; python -m nemotron.warm stop >/dev/null || true' EXIT  # no mypy, no warm server
# Three workers on two cores (NEMOTRON_TEST_WORKERS=0: one process): the Slurm tests share one of them and mostly
# wait on the cluster, so the other two keep both cores busy; --quick has no Slurm tests and takes two. The longest
# units (a test file, or a group such as the Slurm tests) start first (tests/conftest.py).
# NEMOTRON_TEST_TIMES=DIR records each test's wall and CPU time (docs/testing.md).
workers=3
[ $quick = 1 ] && workers=2
tests_rc=0
pytest -n "${NEMOTRON_TEST_WORKERS:-$workers}" --dist loadgroup --durations=15 "$@" || tests_rc=$?
types_rc=0
wait $types || types_rc=$?
cat "$types_log"
rm -f "$types_log"
[ $types_rc = 0 ] || { echo "mypy failed (exit $types_rc)" >&2; exit $types_rc; }
exit $tests_rc
