"""An OpenAI-compatible chat-completions server around a causal LM on CPU (`chat_model.py`): the generative
judge's endpoint.

On GPUs vLLM serves the same API. Like vLLM, a request may carry `structured_outputs: {"choice": [...]}` (vLLM's
current name; its older top-level `guided_choice` is accepted too), a list of strings:
the model then answers with the choice it finds most likely (or samples one by sequence probability),
which makes a small or untrained judge emit parseable output.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from nemotron.reward.chat_model import ChatModel as ChatModel
from nemotron.reward.chat_model import ChatRequest as ChatRequest
from nemotron.reward.chat_model import Completion as Completion
from nemotron.reward.chat_model import HFChatModel as HFChatModel
from nemotron.reward.chat_model import StreamingChatModel
from nemotron.reward.chat_model import render_messages as render_messages
from nemotron.reward.messages import (
    BodyStream,
    HTTPError,
    Request,
    Response,
    error_from,
    error_response,
    json_response,
    parse_json_body,
)
from nemotron.reward.metrics import LATENCY_BUCKETS_S
from nemotron.reward.server_options import load_for_serving, run_server_command, server_command_line
from nemotron.reward.transport import Deferred, HTTPSettings, Route, ServerHandle, health_answer

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")
MAX_CHOICES = 64


def _number(payload: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = payload.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
        raise HTTPError(400, f"'{key}' must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def parse_chat_request(payload: object, max_tokens_limit: int = 1024) -> ChatRequest:
    """The JSON body of POST /v1/chat/completions -> ChatRequest, or HTTP 400 naming the bad field."""
    if not isinstance(payload, dict):
        raise HTTPError(400, "the body must be a JSON object")
    stream = payload.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise HTTPError(400, "'stream' must be true or false", param="stream")
    stream_options = payload.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise HTTPError(400, "'stream_options' must be an object", param="stream_options")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise HTTPError(400, "'messages' must be a non-empty list")
    parsed = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise HTTPError(400, f"messages[{i}] needs a 'role' in {list(ROLES)}")
        if not isinstance(message.get("content"), str):
            raise HTTPError(400, f"messages[{i}].content must be a string")
        parsed.append((str(message["role"]), str(message["content"])))
    max_tokens = payload.get("max_completion_tokens", payload.get("max_tokens", 64))
    if (
        not isinstance(max_tokens, int)
        or isinstance(max_tokens, bool)
        or not 1 <= max_tokens <= max_tokens_limit
    ):
        raise HTTPError(400, f"'max_tokens' must be an integer in [1, {max_tokens_limit}]")
    n = payload.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 8:
        raise HTTPError(400, "'n' must be an integer in [1, 8]")
    seed = payload.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise HTTPError(400, "'seed' must be an integer")
    stop = payload.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise HTTPError(400, "'stop' must be a string or a list of non-empty strings")
    structured = payload.get("structured_outputs")
    if structured is not None and (not isinstance(structured, dict) or set(structured) != {"choice"}):
        raise HTTPError(400, "'structured_outputs' supports only {'choice': [...]} here")
    choices = structured["choice"] if structured is not None else payload.get("guided_choice")
    if choices is not None and (
        not isinstance(choices, list)
        or not 1 <= len(choices) <= MAX_CHOICES
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise HTTPError(400, f"'guided_choice' must be a list of 1 to {MAX_CHOICES} non-empty strings")
    response_format = payload.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise HTTPError(
            400, "only response_format {'type': 'text'} is supported; use 'guided_choice' to constrain"
        )
    return ChatRequest(
        messages=tuple(parsed),
        max_tokens=max_tokens,
        temperature=_number(payload, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(payload, "top_p", 1.0, 1e-6, 1.0),
        n=n,
        seed=seed,
        stop=tuple(stop),
        guided_choice=tuple(choices) if choices is not None else None,
        stream=bool(stream),
        include_usage=bool(stream_options.get("include_usage")),
    )


class ChatApp:
    """Routes of the judge server: POST /v1/chat/completions, GET /v1/models, GET /health (/v2/health/*).

    Generation runs on one thread of its own (one model, one generation at a time); at most `max_queue`
    requests wait for it or run, and one more gets 503 with Retry-After, so a burst is refused early instead
    of answered a minute late.
    """

    def __init__(
        self,
        model: ChatModel,
        registry: CollectorRegistry,
        model_name: str,
        max_tokens_limit: int,
        max_queue: int = 64,
    ) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.model, self.model_name, self.max_tokens_limit = model, model_name, max_tokens_limit
        self.max_queue = max_queue
        self.completions = Counter(
            "nemotron_judge_completions_total", "Chat completions returned.", registry=registry
        )
        self.tokens = Counter(
            "nemotron_judge_completion_tokens_total", "Tokens generated.", registry=registry
        )
        self.seconds = Histogram(
            "nemotron_judge_generation_seconds",
            "Time to answer one chat request.",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.queued = Gauge(
            "nemotron_judge_queued_requests",
            "Chat requests waiting for the model or running.",
            registry=registry,
        )
        self.closing = False
        self.waiting = 0
        self._lock = threading.Lock()
        self._generator = ThreadPoolExecutor(1, thread_name_prefix="judge-generation")
        health = Route("health", self._health, inline=True)
        self._routes = {
            "/v1/chat/completions": ("POST", Route("chat_completions", submit=self._chat)),
            "/v1/models": ("GET", Route("models", self._models, inline=True)),
            # The reward server's health paths too, so `wait_ready` and one launcher serve both servers.
            "/health": ("GET", health),
            "/v2/health/ready": ("GET", health),
            "/v2/health/live": ("GET", health),
        }

    def close(self, timeout: float) -> None:
        self.closing = True
        self._generator.shutdown(wait=False, cancel_futures=True)

    def route(self, method: str, path: str) -> Route | None:
        if path not in self._routes:
            return None
        allowed, route = self._routes[path]
        if method != allowed:
            raise HTTPError(405, f"use {allowed} {path}")
        return route

    def _health(self, _: Request) -> Response:
        return health_answer(self.closing)

    def _models(self, _: Request) -> Response:
        return json_response(
            {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "nemotron"}]}
        )

    def _chat(self, request: Request) -> Deferred:
        """Check the request on the event loop, then queue it for the generation thread (or 503 now)."""
        payload = parse_json_body(request)
        chat = parse_chat_request(payload, self.max_tokens_limit)
        model = payload.get("model")
        if model is not None and model != self.model_name:
            raise HTTPError(
                404,
                f"The model `{model}` does not exist; this server has `{self.model_name}`.",
                code="model_not_found",
                param="model",
            )
        with self._lock:
            if self.waiting >= self.max_queue:
                raise HTTPError(
                    503,
                    f"{self.waiting} chat requests are already queued (max_queue); retry shortly",
                    {"Retry-After": "1"},
                )
            self.waiting += 1
            self.queued.set(self.waiting)
        # Token by token when the model can; else (n > 1 too) the chunks of the finished answer.
        body = (
            BodyStream()
            if chat.stream and chat.n == 1 and isinstance(self.model, StreamingChatModel)
            else None
        )
        try:
            if body is not None:
                future: Future[Any] = self._generator.submit(self._stream, chat, body)
            else:
                future = self._generator.submit(self._complete, chat)
        except RuntimeError as exc:  # the generator has shut down
            self._dequeue()
            raise HTTPError(503, "the server is shutting down") from exc
        future.add_done_callback(lambda _: self._dequeue())
        if body is None:
            return Deferred(future, partial(self._respond, chat))
        headers_now: Future[None] = Future()  # the headers leave at once; the events as they are generated
        headers_now.set_result(None)
        stream = body
        return Deferred(
            headers_now,
            lambda _: Response(200, b"", "text/event-stream", {"Cache-Control": "no-cache"}, stream=stream),
        )

    def _stream(self, chat: ChatRequest, body: BodyStream) -> None:
        """Generate `chat` (n = 1) on the generation thread, writing its chunks to `body` as they come."""
        assert isinstance(self.model, StreamingChatModel)
        common = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": self.model_name}

        def send(payload: dict[str, Any]) -> None:
            body.write(f"data: {json.dumps(payload)}\n\n".encode())

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> None:
            send({**common, "object": "chat.completion.chunk", "choices": choices, **extra})

        def emit(text: str) -> None:
            if body.cancelled.is_set():
                raise _ClientGone
            if text:
                chunk([{"index": 0, "delta": {"content": text}, "finish_reason": None}])

        try:
            if body.cancelled.is_set():
                return  # the client left while the request waited
            chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
            started = time.perf_counter()
            completion = self.model.complete_streaming(chat, emit)
            self.seconds.observe(time.perf_counter() - started)
            self.completions.inc()
            self.tokens.inc(completion.completion_tokens)
            chunk([{"index": 0, "delta": {}, "finish_reason": completion.finish_reason}])
            if chat.include_usage:
                total = completion.prompt_tokens + completion.completion_tokens
                usage = {
                    "prompt_tokens": completion.prompt_tokens,
                    "completion_tokens": completion.completion_tokens,
                }
                chunk([], usage={**usage, "total_tokens": total})
        except _ClientGone:
            return
        except HTTPError as exc:  # the status line has left: the error goes in the stream, as OpenAI sends it
            send(json.loads(error_from(exc, "openai").body))
        except Exception as exc:
            logger.error("streaming a chat completion failed", exc_info=exc)
            send(
                json.loads(error_response(500, f"internal error: {type(exc).__name__}", style="openai").body)
            )
        finally:
            body.write(b"data: [DONE]\n\n")
            body.end()

    def _dequeue(self) -> None:
        with self._lock:
            self.waiting -= 1
            self.queued.set(self.waiting)

    def _complete(self, chat: ChatRequest) -> list[Completion]:
        started = time.perf_counter()
        completions = []
        for i in range(chat.n):
            seeded = chat if chat.seed is None else replace(chat, seed=chat.seed + i)
            completions.append(self.model.complete(seeded))
        self.seconds.observe(time.perf_counter() - started)
        self.completions.inc(len(completions))
        self.tokens.inc(sum(c.completion_tokens for c in completions))
        return completions

    def _respond(self, chat: ChatRequest, done: Future[list[Completion]]) -> Response:
        completions = done.result()
        prompt_tokens = completions[0].prompt_tokens
        generated = sum(c.completion_tokens for c in completions)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": generated,
            "total_tokens": prompt_tokens + generated,
        }
        common = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": self.model_name}
        if chat.stream:
            return _event_stream(common, completions, usage if chat.include_usage else None)
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": c.text},
                "finish_reason": c.finish_reason,
            }
            for i, c in enumerate(completions)
        ]
        return json_response({**common, "object": "chat.completion", "choices": choices, "usage": usage})


class _ClientGone(Exception):
    """Raised into a generation whose client has disconnected, to stop it."""


def _event_stream(
    common: dict[str, Any], completions: list[Completion], usage: dict[str, int] | None
) -> Response:
    """A finished answer as OpenAI streams it: per choice a role chunk, a content chunk and a finish chunk,
    then the usage chunk when asked for, then `data: [DONE]`. (Generation is not incremental here: the
    chunks leave together once the model is done.)"""

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        return (
            "data: "
            + json.dumps({**common, "object": "chat.completion.chunk", "choices": choices, **extra})
            + "\n\n"
        )

    events = []
    for i, c in enumerate(completions):
        events.append(
            chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        )
        if c.text:
            events.append(chunk([{"index": i, "delta": {"content": c.text}, "finish_reason": None}]))
        events.append(chunk([{"index": i, "delta": {}, "finish_reason": c.finish_reason}]))
    if usage is not None:
        events.append(chunk([], usage=usage))
    events.append("data: [DONE]\n\n")
    return Response(200, "".join(events).encode("utf-8"), "text/event-stream", {"Cache-Control": "no-cache"})


def serve_chat(
    model: ChatModel,
    http: HTTPSettings | None = None,
    *,
    model_name: str = "judge",
    max_tokens_limit: int = 1024,
    max_queue: int = 64,
) -> ServerHandle:
    """Start the chat-completions server in background threads; `http` unset: 127.0.0.1 on a free port, bodies
    up to 4 MiB. Errors are OpenAI's error objects, so the openai client raises its own exceptions
    (NotFoundError, ...)."""
    registry = CollectorRegistry()
    app = ChatApp(model, registry, model_name, max_tokens_limit, max_queue)
    settings = replace(
        http or HTTPSettings(max_body_bytes=4 * 1024 * 1024),
        metric_prefix="nemotron_judge",
        error_style="openai",
    )
    return ServerHandle(app, settings, registry)


def main(argv: Sequence[str] | None = None) -> int:
    """The same command line as `python -m nemotron.reward.server`, so one launcher starts either."""
    parser = server_command_line(
        "python -m nemotron.reward.chat_server", __doc__, "HF causal-LM directory (safetensors)", "judge"
    )
    parser.add_argument(
        "--max-queue", type=int, default=64, help="chat requests queued or running; more: 503"
    )
    return run_server_command(parser, argv, _start)


def _start(args: argparse.Namespace, http: HTTPSettings) -> ServerHandle:
    from nemotron.models.checkpoint import load_policy

    model, tokenizer = load_for_serving(args, load_policy)
    return serve_chat(
        HFChatModel(model, tokenizer, args.max_length),  # capped at the model's positions
        http,
        model_name=args.model_name,
        max_queue=args.max_queue,
    )


if __name__ == "__main__":
    from nemotron.reward.server_options import exit_code_of

    sys.exit(exit_code_of(main))
