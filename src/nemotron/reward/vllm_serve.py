"""The generative judge served by `vllm serve` (vLLM's OpenAI-compatible server) beside the trainer: `judge.server:
vllm`. Started like our own chat server (sibling.py: one per node, local rank 0 owns it, stopped with the trainer),
so the judge client talks to it unchanged; the valid verdicts are enforced with vLLM's `structured_outputs.choice`.

The bearer token reaches vLLM through its `VLLM_API_KEY` environment variable, never the command line. A judge whose
tokenizer has no chat template gets ours: the same `role: content` lines our chat server renders.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nemotron.procs import die_with_parent
from nemotron.reward.client import RewardServerError, wait_ready
from nemotron.reward.sibling import sibling_server, stop_process

log = logging.getLogger("nemotron")
# The layout of chat_server.render_messages, as a Jinja chat template.
PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def structured_outputs_backend(tokenizer_json: dict[str, object]) -> str:
    """vLLM's structured-outputs backend for this tokenizer: xgrammar (vLLM's "auto") cannot follow a SentencePiece-
    style Metaspace decoder (it ends the verdict half-way on our tiny tokenizer), outlines can."""
    decoder = tokenizer_json.get("decoder")
    kinds: list[object] = [decoder, *(decoder.get("decoders") or [])] if isinstance(decoder, dict) else []
    return "outlines" if any(isinstance(k, dict) and k.get("type") == "Metaspace" for k in kinds) else "auto"


def vllm_serve_command(
    python: str,
    model: str,
    port: int,
    *,
    max_length: int,
    memory: float,
    chat_template: str | None,
    name: str,
    structured: str = "auto",
) -> list[str]:
    """The argv of `vllm serve` for the judge (a pure function; the token goes in the environment)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
           "--port", str(port), "--served-model-name", name, "--max-model-len", str(max_length),
           "--gpu-memory-utilization", str(memory), "--enforce-eager", "--disable-uvicorn-access-log",
           "--structured-outputs-config", json.dumps({"backend": structured})]  # fmt: skip
    if chat_template is not None:
        cmd += ["--chat-template", chat_template]
    return cmd


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def own_vllm_server(
    model: str | Path,
    *,
    port: int = 0,
    token: str | None = None,
    memory: float = 0.3,
    name: str = "judge",
    startup_timeout: float = 300.0,
    log_path: Path | None = None,
) -> Iterator[tuple[str, str]]:
    """Start `vllm serve MODEL` on 127.0.0.1 (a free port unless given), wait for /health, yield (url, token); stop it
    (SIGTERM, then SIGKILL) on exit, on error and on Ctrl-C."""
    token = token or secrets.token_urlsafe(24)
    config = json.loads((Path(model) / "config.json").read_text())
    max_length = int(config.get("max_position_embeddings") or config.get("n_positions") or 2048)
    tokenizer_config = Path(model) / "tokenizer_config.json"
    has_template = tokenizer_config.is_file() and bool(
        json.loads(tokenizer_config.read_text()).get("chat_template")
    )
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="nemotron-vllm-judge-") as tmp:
        template = None
        if not has_template:
            template = str(Path(tmp) / "chat_template.jinja")
            Path(template).write_text(PLAIN_CHAT_TEMPLATE)
        tokenizer_json = Path(model) / "tokenizer.json"
        structured = (
            structured_outputs_backend(json.loads(tokenizer_json.read_text()))
            if tokenizer_json.is_file()
            else "auto"
        )
        cmd = vllm_serve_command(sys.executable, str(model), port, max_length=max_length, memory=memory,
                                 chat_template=template, name=name, structured=structured)  # fmt: skip
        out = log_path.open("ab") if log_path else subprocess.DEVNULL
        env = {
            **os.environ,
            "VLLM_API_KEY": token,
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        }
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=die_with_parent())  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + startup_timeout
            while True:
                if proc.poll() is not None:
                    raise RewardServerError(f"vllm serve exited with code {proc.returncode} before it was ready"
                                            + (f"; see {log_path}" if log_path else ""))  # fmt: skip
                try:
                    wait_ready(url, timeout=2.0, token=token, path="/health")
                    break
                except RewardServerError:
                    if time.monotonic() > deadline:
                        raise RewardServerError(
                            f"vllm serve was not ready within {startup_timeout:.0f} s"
                        ) from None
            log.info("vllm serve (pid %d) ready at %s", proc.pid, url)
            yield url, token
        finally:
            stop_process(proc)
            if log_path and not isinstance(out, int):
                out.close()


@contextmanager
def vllm_judge_server(
    model: str | Path, log_path: Path | None = None, memory: float = 0.3
) -> Iterator[tuple[str, str]]:
    """`vllm serve` beside the trainer, one per node (local rank 0 starts it, the node's other ranks use it)."""
    with sibling_server(model, module="vllm.serve", log_path=log_path, ready_path="/health",
                        own=lambda: own_vllm_server(model, memory=memory, log_path=log_path)) as pair:  # fmt: skip
        yield pair
