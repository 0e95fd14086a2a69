"""The generative judge served by `vllm serve` (vLLM's OpenAI-compatible server): `judge.server: vllm`. Locally it
starts like our own chat server (sibling.py: one per node, local rank 0 owns it, stopped with the trainer); on Slurm
`python -m nemotron.reward.vllm_serve` runs it as group 0 of a heterogeneous job and writes a ready file the step
waits for. The judge client talks to it unchanged; valid verdicts are enforced with vLLM's `structured_outputs.choice`.

The bearer token reaches vLLM through its `VLLM_API_KEY` environment variable, never the command line. A judge whose
tokenizer has no chat template gets ours: the same `role: content` lines our chat server renders.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from nemotron.core.procs import Child, child_process, free_port
from nemotron.reward.client import RewardServerError, wait_ready
from nemotron.reward.sibling import sibling_server

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
    max_length: int | None,
    memory: float,
    chat_template: str | None,
    name: str,
    structured: str = "auto",
    host: str = "127.0.0.1",
) -> list[str]:
    """The argv of `vllm serve` for the judge (a pure function; the token goes in the environment). No max_length:
    vLLM takes the model's own."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", host,
           "--port", str(port), "--served-model-name", name,
           "--gpu-memory-utilization", str(memory), "--enforce-eager", "--disable-uvicorn-access-log",
           "--structured-outputs-config", json.dumps({"backend": structured})]  # fmt: skip
    if max_length is not None:
        cmd += ["--max-model-len", str(max_length)]
    if chat_template is not None:
        cmd += ["--chat-template", chat_template]
    return cmd


@contextmanager
def own_vllm_server(
    model: str | Path, *, token: str | None = None, **options: Any
) -> Iterator[tuple[str, str]]:
    """`vllm_process` on 127.0.0.1 (a free port unless `port=` is given) with a token (a fresh one unless given):
    yields (url, token); vllm serve is stopped (SIGTERM, then SIGKILL) on exit, on error and on Ctrl-C."""
    token = token or secrets.token_urlsafe(24)
    with vllm_process(model, token=token, **options) as (_, url):
        yield url, token


def _model_length(model: Path) -> int | None:
    """The model's positions from a local config.json; None for a hub id (vLLM reads it itself)."""
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return None
    positions = config.get("max_position_embeddings") or config.get("n_positions")
    return int(positions) if positions else None


@contextmanager
def vllm_process(
    model: str | Path,
    *,
    port: int = 0,
    token: str | None = None,
    memory: float = 0.3,
    name: str = "judge",
    startup_timeout: float = 300.0,
    log_path: Path | None = None,
    host: str = "127.0.0.1",
    inherit_output: bool = False,
) -> Iterator[tuple[Child, str]]:
    """`vllm serve MODEL` on host:port, ready (its /health answers): yields (process, loopback url). No token: no
    auth (loopback only; main() refuses a wider bind without one)."""
    max_length = _model_length(Path(model))
    tokenizer_config = Path(model) / "tokenizer_config.json"
    # a hub id brings its own template; a local checkpoint without one gets ours
    has_template = not Path(model).is_dir() or (
        tokenizer_config.is_file() and bool(json.loads(tokenizer_config.read_text()).get("chat_template"))
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
                                 chat_template=template, name=name, structured=structured, host=host)  # fmt: skip
        env = {**os.environ, "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
        env.pop("VLLM_API_KEY", None)
        if token:
            env["VLLM_API_KEY"] = token
        url = f"http://127.0.0.1:{port}"
        with child_process(cmd, env, log_path, inherit_output) as proc:
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
            yield proc, url


@contextmanager
def vllm_judge_server(
    model: str | Path, log_path: Path | None = None, memory: float = 0.3
) -> Iterator[tuple[str, str]]:
    """`vllm serve` beside the trainer, one per node (local rank 0 starts it, the node's other ranks use it)."""
    with sibling_server(model, module="vllm.serve", log_path=log_path, ready_path="/health",
                        own=lambda: own_vllm_server(model, memory=memory, log_path=log_path)) as pair:  # fmt: skip
        yield pair


# ----------------------------------------------------------------------------- group 0 of a Slurm heterogeneous job


class _Stopped(Exception):
    """SIGTERM: the job is over (Slurm stops group 0 when the step's group ends)."""


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Stopped  # unwinds vllm_process, which stops vllm serve


def main(argv: list[str] | None = None) -> int:
    """`vllm serve` for the judge until SIGTERM, with a ready file once /health answers (what the step waits for)."""
    from nemotron.core.atomic import write_atomic
    from nemotron.errors import UserError
    from nemotron.reward.address import Node, reachable_url
    from nemotron.reward.server_options import command_line, parse_checked

    parser = command_line(
        "python -m nemotron.reward.vllm_serve",
        main.__doc__,
        "the judge: a local HF checkpoint or a hub id",
        model_type=str,
    )
    parser.add_argument(
        "--memory",
        type=float,
        default=0.3,
        help="vLLM's --gpu-memory-utilization: the share of the GPU's memory (CPU build: of RAM) to reserve",
    )
    parser.add_argument("--startup-timeout", type=float, default=3600.0, help="seconds to wait for /health")
    args, token = parse_checked(parser, argv)
    logging.getLogger("nemotron.reward.client").setLevel(logging.WARNING)  # else a line per /health poll
    if not 0 < args.memory <= 1:
        raise UserError(f"--memory must be in (0, 1], got {args.memory}")
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    from nemotron.runtime import preempt

    preempt.ignore()  # Slurm's time-limit warning is for the step beside it; vllm serve inherits the ignore
    port = args.port or free_port()
    try:
        with vllm_process(args.model, port=port, token=token, memory=args.memory, host=args.host,
                          startup_timeout=args.startup_timeout, inherit_output=True) as (proc, _):  # fmt: skip
            if args.ready_file is not None:
                url = reachable_url(f"http://{args.host}:{port}", Node.from_env())
                write_atomic(args.ready_file, json.dumps({"url": url, "pid": os.getpid(), "server": "vllm"}))
            code = proc.wait()
            log.error("vllm serve exited with code %d", code)
            return 3
    except RewardServerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except _Stopped:
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    from nemotron.reward.server_options import exit_code_of

    sys.exit(exit_code_of(main))
