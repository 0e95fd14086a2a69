#!/usr/bin/env bash
# Create .venv and install nemotron with its dev tools. Idempotent; safe to re-run.
# Everything comes from requirements.lock, the exact set the tests passed on (scripts/lock.sh moves it). torch goes
# first, so CPU machines get the CPU build instead of a multi-GB CUDA one. uv installs (scripts/pip-install.sh: pip
# where uv cannot be installed).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${NEMOTRON_VENV:-.venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
. scripts/pip-install.sh
pip_install -c requirements.lock "torch==2.13.0"
pip_install -c requirements.lock -e '.[dev,bench,tracking,postgres]'
echo "nemotron installed in $VENV: activate with  . $VENV/bin/activate"
