"""rm/serve: a reward model behind a KServe v2 (Triton-compatible) HTTP server with dynamic batching, until
Ctrl-C or SIGTERM (then in-flight requests finish). server.mode=chat serves a causal LM as an
OpenAI-compatible chat-completions judge instead. The address is printed and written to the job's
server.json (and servers/node-<i>.json: one server per node on Slurm)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from nemotron.models.checkpoint import load_reward_model, load_tokenizer
from nemotron.models.prompts import model_positions
from nemotron.reward.address import announce_server
from nemotron.reward.scorer import scorer_from_reward_model
from nemotron.reward.server import batching_of, run_forever_until_signal
from nemotron.reward.server_options import check_bind, find_token, http_settings
from nemotron.reward.transport import ServerHandle, run_until_signal
from nemotron.runtime.devices import model_dtype, runtime_device
from nemotron.runtime.step import StepRun, required

if TYPE_CHECKING:  # mypy reads steps/ as a package root; at run time StepRun loads schema.py beside this file
    from rm.serve.schema import Config

log = logging.getLogger("nemotron")


def announcer(run: StepRun[Any], model_name: str, mode: str) -> Any:
    """What to do once the server listens: write its address where clients look, and print it."""

    def announce(handle: ServerHandle) -> None:
        # one server per node: servers/node-<i>.json on each, node 0's also as server.json (docs/executors.md)
        entry = announce_server(run.job_dir, handle.url, model=model_name, mode=mode)
        run.progress.unwatched("serving")  # loaded: from now on it waits for requests, which is not a hang
        print(
            f"serving {mode} model '{model_name}' at {entry['url']} (Ctrl-C or SIGTERM to stop)", flush=True
        )

    return announce


def main() -> int:
    """Serve until Ctrl-C or SIGTERM; the exit code of the server."""
    # ---- setup
    run: StepRun[Config] = StepRun.start(__file__)
    cfg = run.config
    s = cfg.server
    # The token from $NEMOTRON_REWARD_TOKEN or a 0600 file, never the config: a command line is visible in ps.
    token = find_token(token_file=Path(s.token_file) if s.token_file else None)
    check_bind(s.host, token)  # exit 2 for a non-loopback address without a token, before loading anything
    torch.set_num_threads(cfg.runtime.num_threads)
    device = runtime_device(cfg.runtime.device)  # exit 2 for cuda without a GPU, before loading anything
    dtype = model_dtype(cfg.runtime.precision)
    announce = announcer(run, s.model_name, s.mode)

    # ---- load the model and serve it
    model_path = required(cfg.inputs.reward_model, "inputs.reward_model")
    tokenizer = load_tokenizer(model_path)
    if s.mode == "reward":
        model = load_reward_model(model_path, device=device, dtype=dtype)
        max_length = min(s.max_length, model_positions(model.config) or s.max_length)
        scorer = scorer_from_reward_model(model, tokenizer, max_length)
        code = run_forever_until_signal(
            scorer,
            http_settings(s, token),
            batching_of(s),
            model_name=s.model_name,
            on_ready=announce,
            max_request_tokens=s.max_request_tokens,
        )
    else:
        from nemotron.models.checkpoint import load_policy
        from nemotron.reward.chat_server import HFChatModel, serve_chat

        lm = load_policy(model_path, device=device, dtype=dtype)
        chat = HFChatModel(lm, tokenizer, model_positions(lm.config) or s.max_length)
        handle = serve_chat(chat, http_settings(s, token), model_name=s.model_name, max_queue=s.max_queue)
        announce(handle)
        code = run_until_signal(handle)
    print("server stopped", flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
