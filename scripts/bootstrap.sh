#!/usr/bin/env bash
# Create .venv and install nemotron with its dev tools. Idempotent; safe to re-run.
# Everything comes from requirements.lock, the exact set the tests passed on (scripts/lock.sh moves it). torch goes
# first, so CPU machines get the CPU build instead of a multi-GB CUDA one.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${NEMOTRON_VENV:-.venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# Some machines list package mirrors that do not exist on every host; pip warns once per package about each.
pip_install() { "$VENV/bin/python" -m pip install -q "$@" 2> >(grep -v "WARNING: Location '" >&2); }
pip_install -c requirements.lock "torch==2.13.0"
pip_install -c requirements.lock -e '.[dev,bench,tracking,postgres]'
echo "nemotron installed in $VENV: activate with  . $VENV/bin/activate"
