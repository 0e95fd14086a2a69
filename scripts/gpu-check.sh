#!/usr/bin/env bash
# The GPU checks of issue 30 (item 6), in one run of a few minutes on a machine with one NVIDIA GPU:
#   1. the tiny pipeline with runtime.device=cuda runtime.precision=bf16-mixed (every step but data/prep);
#   2. small Llama, Qwen2 and GPT-2 (16 layers x 512, at least 50M parameters, `python -m nemotron.models.tiny`) trained
#      on CUDA by `nemotron steps run sft` (2 steps), in fp32 and bf16, activation checkpointing off and on;
#   3. the resource plan's predicted peak (plan.json) against the run's measured peak, which on CUDA is
#      torch.cuda.max_memory_allocated (nemotron.runtime.devices.peak_memory_mb): a table, via
#      bench/memory_plan.py;
#   4. asynchronous RL against synchronous on CUDA (issue 46): bench/async_rl.py, trainer and generator process on
#      the one GPU;
#   5. the same with vLLM's CUDA build as the generator (bench/async_rl.py --generator vllm): run by vLLM's venv
#      (NEMOTRON_VLLM_VENV, else .venv-vllm; `bash scripts/bootstrap-vllm.sh` builds the CUDA one on a machine where
#      nvidia-smi works); without that venv it is skipped, in one line that says so.
# Figures go to $OUT (if set; else a temporary folder): gpu-check.txt (the whole log), memory_plan_cuda.json,
# async_rl_cuda.json, async_rl_vllm_cuda.json, pipeline.txt. It installs nothing: it needs Python >= 3.11 with a
# CUDA build of torch and the project's runtime wheels (pyproject.toml: typer, rich, omegaconf, pydantic, pyyaml,
# jinja2, transformers, safetensors, tokenizers, numpy, tensorboard, matplotlib, vaderSentiment, h11,
# prometheus_client), and runs this checkout (PYTHONPATH=src). Exit 0: every check ran (5 skipped only as said
# above) and the plan is within the bench's tolerance; 1: a check failed; 2: this machine cannot run it (no CUDA
# device, or a wheel missing).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu-check: no CUDA device here (torch.cuda.is_available() is false, or torch is missing); run scripts/gpu-check.sh on a machine with an NVIDIA GPU" >&2
    exit 2
fi
missing=$("$PY" - <<'PY'
import importlib.util
wheels = {"typer": "typer", "rich": "rich", "omegaconf": "omegaconf", "pydantic": "pydantic", "yaml": "pyyaml",
          "jinja2": "jinja2", "transformers": "transformers", "safetensors": "safetensors",
          "tokenizers": "tokenizers", "numpy": "numpy", "tensorboard": "tensorboard", "matplotlib": "matplotlib",
          "vaderSentiment": "vaderSentiment", "h11": "h11", "prometheus_client": "prometheus_client"}
print(" ".join(w for m, w in wheels.items() if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ]; then
    echo "gpu-check: missing wheels: $missing (pip install them next to torch)" >&2
    exit 2
fi

OUT_DIR=${OUT:-$(mktemp -d)}
mkdir -p "$OUT_DIR"
WORK=$(mktemp -d)
export NEMOTRON_HOME="$WORK/home"
exec > >(tee "$OUT_DIR/gpu-check.txt") 2>&1
"$PY" - <<'PY'
import torch
print(f"gpu-check: torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}, "
      f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.1f} GiB")
PY

echo "== 1. the tiny pipeline on CUDA, bf16-mixed"
"$PY" "$ROOT/scripts/cuda_pipeline.py" "$ROOT/manifests/pipelines/tiny.toml" "$WORK/tiny-cuda.toml"
start=$(date +%s)
"$PY" -m nemotron pipeline run "$WORK/tiny-cuda.toml" | tee "$OUT_DIR/pipeline.txt"
echo "gpu-check: tiny pipeline on CUDA took $(( $(date +%s) - start )) s"

echo "== 2-3. small Llama, Qwen2 and GPT-2 on CUDA: the plan against torch.cuda.max_memory_allocated"
"$PY" "$ROOT/bench/memory_plan.py" --families llama qwen2 gpt2 --sizes small --device cuda --json "$OUT_DIR/memory_plan_cuda.json"

echo "== 4. asynchronous RL against synchronous on CUDA"
"$PY" "$ROOT/bench/async_rl.py" --runs 2 --steps 20 --max-new-tokens 24 --device cuda --json "$OUT_DIR/async_rl_cuda.json"

echo "== 5. asynchronous RL against synchronous on CUDA, vLLM's CUDA build as the generator"
VLLM_VENV="$ROOT/${NEMOTRON_VLLM_VENV:-.venv-vllm}"
case ${NEMOTRON_VLLM_VENV:-} in /*) VLLM_VENV=$NEMOTRON_VLLM_VENV ;; esac
if "$VLLM_VENV/bin/python" -c 'import vllm' 2>/dev/null; then
    "$PY" "$ROOT/bench/async_rl.py" --generator vllm --runs 2 --steps 20 --max-new-tokens 24 --device cuda --json "$OUT_DIR/async_rl_vllm_cuda.json"
else
    echo "gpu-check: check 5 skipped: no vLLM venv at $VLLM_VENV (bash scripts/bootstrap-vllm.sh builds it)"
fi
echo "gpu-check: done; figures in $OUT_DIR"
