"""What the server commands and rm/serve share: the command line, where the bearer token comes from (an environment
variable or a 0600 file, never argv: a command line is visible in `ps`), the refusal to serve a non-loopback
address without one, and a command's way from its arguments to a model served until SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemotron.errors import UserError
from nemotron.reward.bind import check_bind as check_bind
from nemotron.reward.bind import find_token as find_token
from nemotron.reward.bind import is_loopback as is_loopback
from nemotron.reward.bind import read_token_file
from nemotron.reward.transport import (
    TOKEN_ENV,
    HTTPSettings,
    ServerHandle,
    run_until_signal,
    write_ready_file,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast


def token_from_file(path: str | None) -> str | None:
    """A client's token: the one in the 0600 file `path` (a step's `token_file` key), None when unset (the client
    then falls back to $NEMOTRON_REWARD_TOKEN)."""
    return read_token_file(Path(path)) if path else None


class _RefuseTokenOnCommandLine(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        parser.error(
            f"--token is refused: a command line is visible in ps; set ${TOKEN_ENV} or use --token-file"
        )


def command_line(
    prog: str, description: str | None, model_help: str, model_type: Callable[[str], object] = Path
) -> argparse.ArgumentParser:
    """What every server command takes (vllm_serve's too): the model, where to listen, where the bearer token
    comes from, and the ready file. `parse_checked` parses them and finds the token."""
    parser = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False)
    parser.add_argument("--model", type=model_type, required=True, help=model_help)
    parser.add_argument("--host", default="127.0.0.1", help="bind address; a non-loopback one needs a token")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument(
        "--token-env", default=TOKEN_ENV, help="environment variable holding the bearer token"
    )
    parser.add_argument("--token-file", type=Path, help="file (mode 0600) holding the bearer token")
    parser.add_argument("--token", nargs="?", action=_RefuseTokenOnCommandLine, help=argparse.SUPPRESS)
    parser.add_argument("--ready-file", type=Path, help='write {"url", "pid"} here once serving')
    return parser


def server_command_line(
    prog: str, description: str | None, model_help: str, model_name: str
) -> argparse.ArgumentParser:
    """The options both of our server commands (reward and chat) share, so one launcher starts either."""
    parser = command_line(prog, description, model_help)
    parser.add_argument(
        "--model-name",
        default=model_name,
        help="the name clients use (/v2/models/<name>/infer; a chat request's model)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: the GPU of LOCAL_RANK when present",
    )
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="weight dtype")
    parser.add_argument(
        "--max-length", type=int, default=512, help="tokens per sequence, capped at the model's"
    )
    parser.add_argument("--max-body-bytes", type=int, default=8 << 20, help="larger request bodies get 413")
    parser.add_argument(
        "--read-timeout-s", type=float, default=30.0, help="a connection silent this long is closed"
    )
    parser.add_argument(
        "--request-deadline-s",
        type=float,
        default=60.0,
        help="a request's head and body must arrive within this from its first byte (slowloris)",
    )
    parser.add_argument(
        "--max-connections", type=int, default=None, help="open connections; default: under the file limit"
    )
    return parser


def load_for_serving(
    args: argparse.Namespace, load: Callable[..., PreTrainedModel]
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A server command's --model by `load` (load_policy or load_reward_model) on its --device in its --precision,
    torch using --threads, and the model's tokenizer."""
    import torch  # not at the top: vllm_serve and the steps import this module without needing torch

    from nemotron.models.checkpoint import load_tokenizer
    from nemotron.runtime.devices import model_dtype, runtime_device

    torch.set_num_threads(args.threads)
    model = load(args.model, device=runtime_device(args.device), dtype=model_dtype(args.precision))
    return model, load_tokenizer(args.model)


HTTP_LIMITS = ("max_body_bytes", "read_timeout_s", "request_deadline_s", "max_connections")


def http_settings(source: Any, token: str | None) -> HTTPSettings:
    """Where a server listens and its connection limits, read from a server command's parsed arguments or from
    rm/serve's `server` group (the same names)."""
    limits = {name: getattr(source, name) for name in HTTP_LIMITS}
    return HTTPSettings(host=source.host, port=source.port, token=token, **limits)


def parse_checked(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> tuple[argparse.Namespace, str | None]:
    """A server command's arguments and bearer token, with logging set up. A wide bind without a token (or a bad
    token file) raises UserError before any model loads: `exit_code_of` makes it exit 2 in one line."""
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token = find_token(args.token_env, args.token_file)
    check_bind(args.host, token, args.token_env)
    return args, token


def run_server_command(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    start: Callable[[argparse.Namespace, HTTPSettings], ServerHandle],
) -> int:
    """A server command from its arguments to its exit code: parse them and find the token (`parse_checked`, before
    any model loads), `start` the server (it loads the model), write the ready file once it serves, then serve
    until SIGTERM or Ctrl-C."""
    args, token = parse_checked(parser, argv)
    handle = start(args, http_settings(args, token))
    if args.ready_file is not None:
        write_ready_file(args.ready_file, handle)
    return run_until_signal(handle)


def exit_code_of(main: Callable[[], int]) -> int:
    """Run a server command's main: a UserError found once the model is loaded (a port in use) is exit 2 and one
    line, like those found before it."""
    try:
        return main()
    except UserError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        return 2
