#!/usr/bin/env bash
# The vLLM tests (tests/vllm) in vLLM's own venv, built first when missing (scripts/bootstrap-vllm.sh). None may skip:
# NEMOTRON_REQUIRE_VLLM=1 turns a missing vllm into an error. Arguments go to one pytest over tests/vllm.
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
run() { NEMOTRON_REQUIRE_VLLM=1 "$VENV/bin/python" -m pytest -p no:cacheprovider -rs --durations=5 "$@"; }
if [ $# -gt 0 ] || [ "${NEMOTRON_VLLM_SPLIT:-1}" = 0 ]; then
  run tests/vllm "$@"
else
  # Two pytest processes at once, each with its own vLLM engines: one of them alone left a core idle about 40% of
  # the time (engine and server start-ups, the Slurm queue, a server's restart). The split puts the tests that mostly
  # wait beside those that mostly compute; each half's output is shown whole, the waiting half's first.
  logs=$(mktemp -d /tmp/nemotron-vllm-logs.XXXXXX)
  waits=(tests/vllm/test_vllm_judge.py tests/vllm/test_vllm_judge_slurm.py tests/vllm/test_bench_vllm_smoke.py)
  computes=()  # every other test file, a new one included
  for f in tests/vllm/test_*.py; do [[ " ${waits[*]} " == *" $f "* ]] || computes+=("$f"); done
  run "${waits[@]}" >"$logs/waiting.log" 2>&1 &
  waiting=$!
  computing_rc=0
  run "${computes[@]}" >"$logs/computing.log" 2>&1 || computing_rc=$?
  waiting_rc=0
  wait $waiting || waiting_rc=$?
  cat "$logs/waiting.log" "$logs/computing.log"
  rm -rf "$logs"
  [ $waiting_rc = 0 ] || { echo "tests/vllm failed: ${waits[*]}" >&2; exit $waiting_rc; }
  [ $computing_rc = 0 ] || { echo "tests/vllm failed: ${computes[*]}" >&2; exit $computing_rc; }
fi
echo "tests/vllm took $((SECONDS - start)) s"
