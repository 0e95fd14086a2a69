"""tests/vllm run in vLLM's own environment (`bash scripts/test-vllm.sh` builds .venv-vllm and runs them). In the main
venv, which has no vllm, they are not collected at all; with NEMOTRON_REQUIRE_VLLM=1 (test-vllm.sh, CI) a missing
vllm is an error, never a skip."""

from __future__ import annotations

import importlib.util
import os

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("NEMOTRON_REQUIRE_VLLM") == "1":
        raise RuntimeError("NEMOTRON_REQUIRE_VLLM=1 but vllm is not importable: run `bash scripts/bootstrap-vllm.sh`")
    collect_ignore_glob = ["test_*.py"]
