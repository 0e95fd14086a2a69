"""The reward-model server: KServe v2 inference (Triton/PyTriton compatible) with dynamic batching, and POST /score.

Scoring requests are decoded on the transport's event loop and handed to the batcher, whose Future the
transport answers from: no thread waits per request.

`serve(scorer, ...)` starts it in background threads and returns a `ServerHandle`;
`run_forever_until_signal(scorer, ...)` serves until SIGTERM/Ctrl-C. `python -m nemotron.reward.server --model DIR`
serves a saved HF reward model.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

import nemotron
from nemotron.errors import UserError
from nemotron.reward.batcher import (
    BatcherClosed,
    BatcherMetrics,
    DynamicBatcher,
    QueueFull,
    ScorerFailed,
    UnscorableInput,
)
from nemotron.reward.batching import BatchingConfig
from nemotron.reward.kserve import (
    HEADER_LENGTH,
    Array,
    InferRequest,
    KServeError,
    decode_infer_request,
    encode_infer_response,
)
from nemotron.reward.messages import HTTPError, Request, Response, json_response, parse_json_body
from nemotron.reward.scorer import Scorer
from nemotron.reward.server_options import load_for_serving, run_server_command, server_command_line
from nemotron.reward.transport import TOKEN_ENV as TOKEN_ENV  # launchers import it from here
from nemotron.reward.transport import (
    Deferred,
    HTTPSettings,
    Route,
    ServerHandle,
    health_answer,
    run_until_signal,
)

logger = logging.getLogger(__name__)

MODEL_NAME = "reward_model"
MODEL_VERSION = "1"
# serve()'s default: a batch leaves when full (or when its oldest request has waited max_queue_delay_ms)
FULL_BATCHES = BatchingConfig(max_batch_size=64, preferred_batch_size=64)
# Token ids one request may carry: what 8 MiB of binary INT64 holds. Decoded they cost ~40 bytes each (numpy, then
# Python ints), so one request stays within ~50 MB, and JSON (2 bytes a token) cannot carry 4x as many.
MAX_REQUEST_TOKENS = 1 << 20


def _decode_sentences(array: Array) -> list[str]:
    if array.dtype != object:
        raise HTTPError(400, f"input 'sentences' must be BYTES, got {array.dtype}")
    if array.ndim == 2 and array.shape[1] == 1:  # PyTriton / NeMo-Aligner send [B, 1]
        array = array[:, 0]
    if array.ndim != 1:
        raise HTTPError(400, f"input 'sentences' must have shape [B] or [B, 1], got {list(array.shape)}")
    sentences = []
    for i, raw in enumerate(array.tolist()):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise HTTPError(400, f"sentence {i} is not valid UTF-8") from exc
        if not text:
            raise HTTPError(400, f"sentence {i} is empty")
        sentences.append(text)
    return sentences


def _decode_token_rows(tokens: Array, lengths: Array | None, vocab_size: int | None) -> list[list[int]]:
    if tokens.dtype.kind not in "iu":
        raise HTTPError(400, f"input 'tokens' must be INT64 (or INT32), got {tokens.dtype}")
    if tokens.ndim != 2:
        raise HTTPError(400, f"input 'tokens' must have shape [B, T], got {list(tokens.shape)}")
    if lengths is None:
        raise HTTPError(400, "input 'tokens' needs 'sequence_lengths' beside it")
    if lengths.dtype.kind not in "iu":
        raise HTTPError(400, f"input 'sequence_lengths' must be INT64 (or INT32), got {lengths.dtype}")
    lengths = lengths.reshape(-1) if lengths.ndim == 2 and lengths.shape[1] == 1 else lengths
    if lengths.shape != (tokens.shape[0],):
        raise HTTPError(
            400,
            f"'sequence_lengths' must have shape [{tokens.shape[0]}] to match 'tokens', got {list(lengths.shape)}",
        )
    if tokens.shape[0] and (lengths.min() < 1 or lengths.max() > tokens.shape[1]):
        raise HTTPError(400, f"every sequence length must be in [1, {tokens.shape[1]}]")
    rows = [tokens[i, : int(n)] for i, n in enumerate(lengths)]
    for i, row in enumerate(rows):
        if row.size and (row.min() < 0 or (vocab_size is not None and row.max() >= vocab_size)):
            raise HTTPError(400, f"sequence {i} has a token id outside [0, {vocab_size or 'inf'})")
    return [[int(t) for t in row] for row in rows]


def reward_inputs(inputs: dict[str, Array], scorer: Scorer) -> tuple[str, list[Any]]:
    """KServe input tensors -> ("sentences", [str]) or ("tokens", [[int]]), or HTTP 400 saying what is wrong."""
    unknown = sorted(set(inputs) - {"sentences", "tokens", "sequence_lengths"})
    if unknown:
        raise HTTPError(
            400, f"unknown inputs {unknown}; expected 'sentences', or 'tokens' + 'sequence_lengths'"
        )
    if "sentences" in inputs:
        if "tokens" in inputs or "sequence_lengths" in inputs:
            raise HTTPError(400, "send either 'sentences' or 'tokens' + 'sequence_lengths', not both")
        return "sentences", _decode_sentences(inputs["sentences"])
    if "tokens" in inputs:
        if scorer.score_tokens is None:
            raise HTTPError(400, "this model takes 'sentences' only")
        return "tokens", _decode_token_rows(
            inputs["tokens"], inputs.get("sequence_lengths"), scorer.vocab_size
        )
    raise HTTPError(400, "the request has neither 'sentences' nor 'tokens'")


class RewardApp:
    """Routes of the reward server; all scoring goes through one `DynamicBatcher`."""

    def __init__(
        self,
        scorer: Scorer,
        batching: BatchingConfig,
        registry: CollectorRegistry,
        *,
        model_name: str = MODEL_NAME,
        request_timeout_s: float = 60.0,
        max_request_tokens: int = MAX_REQUEST_TOKENS,
    ) -> None:
        if max_request_tokens < 1:
            raise ValueError(f"max_request_tokens must be >= 1, got {max_request_tokens}")
        self.scorer = scorer
        self.batching = batching
        self.model_name = model_name
        self.request_timeout_s = request_timeout_s
        self.max_request_tokens = max_request_tokens
        functions: dict[str, Callable[[list[Any]], Sequence[float]]] = {"sentences": scorer.score_sentences}
        if scorer.score_tokens is not None:
            functions["tokens"] = scorer.score_tokens
        metrics = BatcherMetrics.register(registry, "nemotron_reward")
        self.batcher = DynamicBatcher(functions, batching, metrics).start()
        self.closing = False
        self._fixed_routes, self._model_routes = self._routes()

    def close(self, timeout: float) -> None:
        self.closing = True
        self.batcher.close(timeout)

    def _routes(self) -> tuple[dict[str, dict[str, Route]], dict[str, dict[str, Route]]]:
        """{path: {method: route}} for fixed paths, and {action: {method: route}} under /v2/models/<name>.

        Health and metadata are cheap and answered on the event loop; scoring goes to the batcher.
        """
        health = Route("health", self._ready, inline=True)
        timeout = self.request_timeout_s
        fixed = {
            "/v2/health/live": {"GET": Route("health", lambda _: json_response({"live": True}), inline=True)},
            "/v2/health/ready": {"GET": health},
            "/health": {"GET": health},
            "/v2": {"GET": Route("server_metadata", self._server_metadata, inline=True)},
            "/score": {"POST": Route("score", submit=self._score_json, timeout_s=timeout)},
        }
        model = {
            "": {"GET": Route("model_metadata", self._model_metadata, inline=True)},
            "ready": {"GET": Route("model_ready", self._ready, inline=True)},
            "config": {"GET": Route("model_config", self._model_config, inline=True)},
            "infer": {"POST": Route("infer", submit=self._infer, timeout_s=timeout)},
        }
        return fixed, model

    def route(self, method: str, path: str) -> Route | None:
        fixed, model = self._fixed_routes, self._model_routes
        if path in fixed:
            methods = fixed[path]
        else:
            parts = path.strip("/").split("/")
            if parts[:2] != ["v2", "models"] or len(parts) < 3:
                return None
            name, rest = parts[2], parts[3:]
            if rest[:1] == ["versions"]:
                if len(rest) < 2 or rest[1] != MODEL_VERSION:
                    raise HTTPError(404, f"model {name!r} has only version {MODEL_VERSION}")
                rest = rest[2:]
            if name != self.model_name:
                raise HTTPError(404, f"unknown model {name!r}; this server has {self.model_name!r}")
            if len(rest) > 1 or (rest[0] if rest else "") not in model:
                return None
            methods = model[rest[0] if rest else ""]
        if method not in methods:
            raise HTTPError(405, f"{method} is not allowed on {path}; use {', '.join(methods)}")
        return methods[method]

    def _ready(self, _: Request) -> Response:
        return health_answer(self.closing)

    def _server_metadata(self, _: Request) -> Response:
        return json_response(
            {
                "name": "nemotron-reward",
                "version": nemotron.__version__,
                "extensions": ["binary_tensor_data", "model_configuration"],
            }
        )

    def _tensor_specs(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        inputs = [{"name": "sentences", "datatype": "BYTES", "shape": [-1]}]
        if self.scorer.score_tokens is not None:
            inputs += [
                {"name": "tokens", "datatype": "INT64", "shape": [-1, -1]},
                {"name": "sequence_lengths", "datatype": "INT64", "shape": [-1]},
            ]
        return inputs, [{"name": "rewards", "datatype": "FP32", "shape": [-1, 1]}]

    def _model_metadata(self, _: Request) -> Response:
        inputs, outputs = self._tensor_specs()
        return json_response(
            {
                "name": self.model_name,
                "versions": [MODEL_VERSION],
                "platform": "nemotron",
                "inputs": inputs,
                "outputs": outputs,
            }
        )

    def _model_config(self, _: Request) -> Response:
        triton_type = {"BYTES": "TYPE_STRING", "INT64": "TYPE_INT64", "FP32": "TYPE_FP32"}
        inputs, outputs = self._tensor_specs()

        def spec(t: dict[str, Any], optional: bool) -> dict[str, Any]:
            return {
                "name": t["name"],
                "data_type": triton_type[t["datatype"]],
                "dims": t["shape"],
                "optional": optional,
            }

        # max_batch_size 0: the shapes above already include the batch dimension; rows are batched
        # across requests by our own batcher.
        return json_response(
            {
                "name": self.model_name,
                "platform": "nemotron",
                "max_batch_size": 0,
                "input": [spec(t, True) for t in inputs],
                "output": [spec(t, False) for t in outputs],
                "dynamic_batching": {
                    "preferred_batch_size": [self.batching.preferred_batch_size],
                    "max_queue_delay_microseconds": int(self.batching.max_queue_delay_ms * 1000),
                },
            }
        )

    def _check_rows(self, rows: int) -> None:
        """413 for more rows than the queue holds: it would never fit, and a 503 would have the client retry in
        vain."""
        limit = self.batching.max_queue_rows
        if rows > limit:
            raise HTTPError(
                413, f"the request has {rows} rows; this server takes at most {limit} (max_queue_rows)"
            )

    def _check_input(self, name: str, datatype: str, shape: tuple[int, ...]) -> None:
        """The per-request budgets, from an input's declared shape before its data is decoded: rows (the first
        dimension) and elements (a 'tokens' input's rows x tokens), so an oversized request costs no memory."""
        self._check_rows(shape[0] if shape else 1)
        elements = math.prod(shape)
        if elements > self.max_request_tokens:
            what = "token ids" if name == "tokens" else "elements"
            raise HTTPError(
                413,
                f"input {name!r} has shape {list(shape)}, {elements} {what}; this server takes at most "
                f"{self.max_request_tokens} per request (max_request_tokens)",
            )

    def _submit(self, kind: str, items: list[Any]) -> Future[list[float]]:
        """Queue `items` for scoring, or HTTPError now (413, 503)."""
        self._check_rows(len(items))
        try:
            return self.batcher.submit(kind, items)
        except (QueueFull, BatcherClosed) as exc:
            raise HTTPError(503, str(exc), {"Retry-After": "1"}) from exc

    def _infer(self, request: Request) -> Deferred:
        header_length = None
        if HEADER_LENGTH.lower() in request.headers:
            try:
                header_length = int(request.headers[HEADER_LENGTH.lower()])
            except ValueError as exc:
                raise HTTPError(400, f"bad {HEADER_LENGTH} header") from exc
        try:
            infer = decode_infer_request(request.body, header_length, self._check_input)
        except KServeError as exc:
            raise HTTPError(400, str(exc)) from exc
        for output in infer.outputs or ():
            if output.name != "rewards":
                raise HTTPError(400, f"unknown output {output.name!r}; this model has 'rewards'")
        kind, items = reward_inputs(infer.inputs, self.scorer)
        return Deferred(self._submit(kind, items), lambda done: self._infer_response(infer, done))

    def _infer_response(self, infer: InferRequest, done: Future[list[float]]) -> Response:
        rewards = np.asarray(_scores(done), dtype=np.float32).reshape(-1, 1)  # [B, 1]
        body, json_length = encode_infer_response(
            model_name=self.model_name,
            model_version=MODEL_VERSION,
            outputs={"rewards": rewards},
            binary={"rewards": infer.wants_binary("rewards")},
            request_id=infer.id,
        )
        if json_length is None:
            return Response(200, body)
        return Response(200, body, "application/octet-stream", {HEADER_LENGTH: str(json_length)})

    def _score_json(self, request: Request) -> Deferred:
        payload = parse_json_body(request)
        if not isinstance(payload, dict) or set(payload) != {"sentences"}:
            raise HTTPError(400, 'expected {"sentences": ["...", ...]}')
        sentences = payload["sentences"]
        if isinstance(sentences, list):
            self._check_rows(len(sentences))
        if not isinstance(sentences, list) or not all(isinstance(s, str) and s for s in sentences):
            raise HTTPError(400, "'sentences' must be a list of non-empty strings")
        for i, sentence in enumerate(sentences):
            try:
                sentence.encode("utf-8")
            except UnicodeEncodeError as exc:  # JSON can spell a lone surrogate ("\ud800"); tokenizers choke
                raise HTTPError(400, f"sentence {i} is not valid Unicode: {exc.reason}") from exc
        return Deferred(
            self._submit("sentences", sentences), lambda done: json_response({"rewards": _scores(done)})
        )


def _scores(done: Future[list[float]]) -> list[float]:
    """The scores of a resolved batcher Future, or the HTTPError for why there are none."""
    try:
        return done.result()
    except UnscorableInput as exc:
        raise HTTPError(400, str(exc)) from exc
    except ScorerFailed as exc:
        raise HTTPError(500, f"scoring failed: {exc}") from exc


def _as_scorer(scorer: Scorer | Callable[[list[str]], Sequence[float]]) -> Scorer:
    return scorer if isinstance(scorer, Scorer) else Scorer(score_sentences=scorer)


def batching_of(source: Any) -> BatchingConfig:
    """The batching of a server command's parsed arguments or of rm/serve's `server` group (the same names);
    an unset preferred_batch_size is max_batch_size. Settings that break the batcher's rules are a UserError (exit
    2): the rm/serve schema refuses them before a job is written, the server command before its model loads."""
    preferred = source.preferred_batch_size
    if preferred is None:
        preferred = source.max_batch_size
    try:
        return BatchingConfig(
            source.max_batch_size, preferred, source.max_queue_delay_ms, source.max_queue_rows
        )
    except ValueError as exc:
        raise UserError(f"batching: {exc}") from None


def serve(
    scorer: Scorer | Callable[[list[str]], Sequence[float]],
    http: HTTPSettings | None = None,
    batching: BatchingConfig = FULL_BATCHES,
    *,
    request_timeout_s: float = 60.0,
    model_name: str = MODEL_NAME,
    max_request_tokens: int = MAX_REQUEST_TOKENS,
) -> ServerHandle:
    """Start the reward server in background threads; `http` unset: 127.0.0.1 on a free port (see `handle.url`).

    A batch goes to the model as soon as `batching.preferred_batch_size` rows wait (by default: a full batch),
    or when its oldest request has waited `batching.max_queue_delay_ms`. A connection is dropped when it sends
    nothing for `http.read_timeout_s`, or when a request has not fully arrived `http.request_deadline_s` after
    its first byte; scoring a request may take `request_timeout_s` (then 504). Past `http.max_connections` open
    connections (default: well under the open-file limit) an idle one is closed, or the newcomer gets 503. A request
    of more than `batching.max_queue_rows` rows, or with an input of more than `max_request_tokens` elements (a
    'tokens' input's rows x tokens), is 413 before its data is decoded.
    """
    registry = CollectorRegistry()
    app = RewardApp(
        _as_scorer(scorer),
        batching,
        registry,
        model_name=model_name,
        request_timeout_s=request_timeout_s,
        max_request_tokens=max_request_tokens,
    )
    settings = replace(http or HTTPSettings(), metric_prefix="nemotron_reward")
    return ServerHandle(app, settings, registry)


def run_forever_until_signal(
    scorer: Scorer | Callable[[list[str]], Sequence[float]],
    http: HTTPSettings | None = None,
    batching: BatchingConfig = FULL_BATCHES,
    *,
    on_ready: Callable[[ServerHandle], None] | None = None,
    **options: Any,
) -> int:
    """Serve until SIGTERM or Ctrl-C, then finish in-flight requests and return 0. Main thread only."""
    handle = serve(scorer, http, batching, **options)
    if on_ready is not None:
        on_ready(handle)
    return run_until_signal(handle)


def main(argv: Sequence[str] | None = None) -> int:
    parser = server_command_line(
        "python -m nemotron.reward.server", __doc__, "HF reward-model directory (safetensors)", MODEL_NAME
    )
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--preferred-batch-size", type=int, default=None, help="default: --max-batch-size")
    parser.add_argument("--max-queue-delay-ms", type=float, default=5.0)
    parser.add_argument(
        "--max-queue-rows",
        type=int,
        default=65536,
        help="rows waiting for the model; more: 503 + Retry-After (a request of more rows: 413)",
    )
    parser.add_argument(
        "--max-request-tokens",
        type=int,
        default=MAX_REQUEST_TOKENS,
        help="token ids (rows x tokens of a 'tokens' input) one request may carry; more: 413",
    )
    from nemotron.runtime import preempt

    preempt.ignore()  # in a Slurm hetjob, the time-limit warning is for the step beside this server
    return run_server_command(parser, argv, _start)


def _start(args: argparse.Namespace, http: HTTPSettings) -> ServerHandle:
    from nemotron.models.checkpoint import load_reward_model
    from nemotron.models.prompts import model_positions
    from nemotron.reward.scorer import scorer_from_reward_model

    batching = batching_of(args)  # its refusal comes before the model's minutes of loading
    model, tokenizer = load_for_serving(args, load_reward_model)
    # Like rm/serve: a --max-length over the model's positions is capped, not an error.
    max_length = min(args.max_length, model_positions(model.config) or args.max_length)
    scorer = scorer_from_reward_model(model, tokenizer, max_length)
    return serve(
        scorer,
        http,
        batching,
        model_name=args.model_name,
        max_request_tokens=args.max_request_tokens,
    )


if __name__ == "__main__":
    from nemotron.reward.server_options import exit_code_of

    sys.exit(exit_code_of(main))
