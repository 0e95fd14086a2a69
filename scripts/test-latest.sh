#!/usr/bin/env bash
# Install the newest versions pyproject.toml allows (no lock) in a throwaway venv and run the CLI tests there: the
# first step of moving the lock (see scripts/lock.sh). A failure here is an upgrade that would break users.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(mktemp -d)/venv
"${PYTHON:-python3}" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q --upgrade -e '.[dev]'
export PATH="$VENV/bin:$PATH"
# the unit tests of the CLI and what it calls first (catalog, compile, config, jobs), its docs, its rendering and
# the whole-repo checks
pytest -q tests/catalog tests/cli tests/compile tests/config tests/jobs tests/repo tests/docs/test_docs.py \
    tests/docs/test_docs_listings.py tests/launch/test_render.py tests/launch/test_pipeline_verdict.py "$@"
