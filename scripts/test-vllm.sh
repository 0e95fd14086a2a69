#!/usr/bin/env bash
# The vLLM tests (tests/vllm) in vLLM's own venv, built first when missing (scripts/bootstrap-vllm.sh). None may skip:
# NEMOTRON_REQUIRE_VLLM=1 turns a missing vllm into an error. About 6 minutes on 2 cores once the venv exists. One
# pytest: two at once (the judge tests beside the engine and RL tests, 717cabc) took as long (6 m 28 s against
# 6 m 50 s) and 4 CPU-minutes more, their vLLM engines' threads spinning against each other (the judge's restart
# test 72 s alone, 222 s beside the other half).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${NEMOTRON_VLLM_VENV:-.venv-vllm}
# The Slurm test submits from the main venv (it holds nemo-run): the one scripts/bootstrap.sh built.
export NEMOTRON_MAIN_PYTHON=${NEMOTRON_MAIN_PYTHON:-$PWD/${NEMOTRON_VENV:-.venv}/bin/python}
bash scripts/bootstrap-vllm.sh
ulimit -c 0
# Local steps fork from warm servers (docs/executors.md): this run's own, in a folder of its own, stopped at the end.
export NEMOTRON_WARM_DIR=${NEMOTRON_WARM_DIR:-$(mktemp -d /tmp/nemotron-test-warm.XXXXXX)}
export NEMOTRON_WARM_IDLE_S=${NEMOTRON_WARM_IDLE_S:-300}  # a server some tests' environment needed goes sooner
# and so does the CLI the tests run a few thousand times (`python -m nemotron`, no terminal): docs/executors.md
export NEMOTRON_WARM_CLI=${NEMOTRON_WARM_CLI:-1}
trap '"$VENV/bin/python" -m nemotron.warm stop >/dev/null || true' EXIT
start=$SECONDS
NEMOTRON_REQUIRE_VLLM=1 "$VENV/bin/python" -m pytest -p no:cacheprovider -rs --durations=5 tests/vllm "$@"
echo "tests/vllm took $((SECONDS - start)) s"
