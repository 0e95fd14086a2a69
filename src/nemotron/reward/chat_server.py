"""An OpenAI-compatible chat-completions server around a causal LM on CPU: the generative judge's endpoint.

On GPUs vLLM serves the same API. Like vLLM, a request may carry `structured_outputs: {"choice": [...]}` (vLLM's
current name; its older top-level `guided_choice` is accepted too), a list of strings:
the model then answers with the choice it finds most likely (or samples one by sequence probability),
which makes a small or untrained judge emit parseable output.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from nemotron.reward.prometheus import LATENCY_BUCKETS_S, Registry
from nemotron.reward.transport import (
    HTTPError,
    HTTPSettings,
    Request,
    Response,
    Route,
    ServerHandle,
    bearer_token,
    json_response,
    parse_json_body,
    run_until_signal,
    server_command_line,
    write_ready_file,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")
MAX_CHOICES = 64


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[tuple[str, str], ...]  # (role, content)
    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    guided_choice: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int


class ChatModel(Protocol):
    """Anything that answers a chat: an HF causal LM, or a scripted stand-in in tests."""

    def complete(self, request: ChatRequest) -> Completion: ...


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
    if payload.get("stream"):
        raise HTTPError(400, "'stream' is not supported")
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
    )


def render_messages(messages: Sequence[tuple[str, str]]) -> str:
    """A plain chat layout for tokenizers without a chat template: 'role: content' lines, then 'assistant:'."""
    return "".join(f"{role}: {content}\n" for role, content in messages) + "assistant:"


class HFChatModel:
    """Serves a `transformers` causal LM. Calls are serialized: one model, one generation at a time."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, max_context: int = 512
    ) -> None:
        positions = getattr(model.config, "n_positions", None) or getattr(
            model.config, "max_position_embeddings", None
        )
        self.model, self.tokenizer = model, tokenizer
        self.max_context = min(max_context, positions) if positions else max_context
        self.model.eval()  # type: ignore[no-untyped-call]
        self._lock = threading.Lock()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_id is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token")

    def prompt_ids(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        if getattr(self.tokenizer, "chat_template", None):
            conversation = [{"role": r, "content": c} for r, c in messages]
            encoded: Any = self.tokenizer.apply_chat_template(
                conversation, add_generation_prompt=True, tokenize=True
            )
            ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
        else:
            ids = self.tokenizer(render_messages(messages), add_special_tokens=False)["input_ids"]
        return [int(i) for i in ids]

    def complete(self, request: ChatRequest) -> Completion:
        import torch

        prompt = self.prompt_ids(request.messages)
        if not prompt:
            raise HTTPError(400, "the messages encode to no tokens")
        with self._lock, torch.inference_mode():
            if request.seed is not None:
                torch.manual_seed(request.seed)
            if request.guided_choice is not None:
                return self._choose(prompt, request)
            return self._generate(prompt, request)

    def _choose(self, prompt: list[int], request: ChatRequest) -> Completion:
        """Score each choice by the sum of its token logprobs given the prompt; take the best (or sample)."""
        import torch

        choices = [
            self.tokenizer(c, add_special_tokens=False)["input_ids"] for c in request.guided_choice or ()
        ]
        if any(len(c) == 0 for c in choices):
            raise HTTPError(400, "a guided choice encodes to no tokens")
        prompt = prompt[-max(1, self.max_context - max(len(c) for c in choices)) :]
        rows = [prompt + list(c) for c in choices]
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)  # [C, T]
        mask = torch.zeros_like(input_ids)  # [C, T]
        for i, row in enumerate(rows):
            input_ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        input_ids, mask = input_ids.to(self.model.device), mask.to(self.model.device)
        logprobs = torch.log_softmax(
            self.model(input_ids=input_ids, attention_mask=mask).logits.float(), -1
        )  # [C, T, V]
        # The token at position t is predicted by the logits at t - 1.
        totals = torch.stack(
            [
                logprobs[i, len(prompt) - 1 + torch.arange(len(c)), torch.tensor(c, dtype=torch.long)]
                .sum()
                .cpu()
                for i, c in enumerate(choices)
            ]
        )  # [C]
        if request.temperature == 0:
            pick = int(totals.argmax())
        else:
            pick = int(torch.multinomial(torch.softmax(totals / request.temperature, -1), 1))
        text = (request.guided_choice or ())[pick]
        return Completion(text, "stop", len(prompt), len(choices[pick]))

    def _generate(self, prompt: list[int], request: ChatRequest) -> Completion:
        import torch

        # Prompt plus answer must fit the model's positions: keep at least half the context for the prompt.
        max_new = min(request.max_tokens, self.max_context // 2)
        prompt = prompt[-(self.max_context - max_new) :]
        input_ids = torch.tensor([prompt], dtype=torch.long, device=self.model.device)  # [1, T]
        sampling: dict[str, Any] = (
            {"do_sample": True, "temperature": request.temperature, "top_p": request.top_p}
            if request.temperature > 0
            else {"do_sample": False}
        )
        output = self.model.generate(  # type: ignore[operator]
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new,
            pad_token_id=self.pad_id,
            eos_token_id=self.tokenizer.eos_token_id,
            **sampling,
        )
        new = [int(t) for t in output[0, len(prompt) :]]
        eos = self.tokenizer.eos_token_id
        stopped = eos is not None and eos in new
        if stopped:
            new = new[: new.index(eos)]
        text = str(self.tokenizer.decode(new, skip_special_tokens=True))
        for stop in request.stop:
            if stop in text:
                text, stopped = text[: text.index(stop)], True
        return Completion(text, "stop" if stopped else "length", len(prompt), len(new))


class ChatApp:
    """Routes of the judge server: POST /v1/chat/completions, GET /v1/models, GET /health (/v2/health/*)."""

    def __init__(self, model: ChatModel, registry: Registry, model_name: str, max_tokens_limit: int) -> None:
        self.model, self.model_name, self.max_tokens_limit = model, model_name, max_tokens_limit
        self.completions = registry.counter("nemotron_judge_completions_total", "Chat completions returned.")
        self.tokens = registry.counter("nemotron_judge_completion_tokens_total", "Tokens generated.")
        self.seconds = registry.histogram(
            "nemotron_judge_generation_seconds", "Time to answer one chat request.", LATENCY_BUCKETS_S
        )
        self.closing = False
        health = Route("health", self._health, public=True, inline=True)
        # Generation blocks for as long as the model takes: the transport runs it in its thread pool.
        self._routes = {
            "/v1/chat/completions": ("POST", Route("chat_completions", self._chat)),
            "/v1/models": ("GET", Route("models", self._models, inline=True)),
            # The reward server's health paths too, so `wait_ready` and one launcher serve both servers.
            "/health": ("GET", health),
            "/v2/health/ready": ("GET", health),
            "/v2/health/live": ("GET", health),
        }

    def close(self, timeout: float) -> None:
        self.closing = True

    def route(self, method: str, path: str) -> Route | None:
        if path not in self._routes:
            return None
        allowed, route = self._routes[path]
        if method != allowed:
            raise HTTPError(405, f"use {allowed} {path}")
        return route

    def _health(self, _: Request) -> Response:
        if self.closing:
            raise HTTPError(503, "the server is shutting down")
        return json_response({"ready": True})

    def _models(self, _: Request) -> Response:
        return json_response(
            {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "nemotron"}]}
        )

    def _chat(self, request: Request) -> Response:
        chat = parse_chat_request(parse_json_body(request), self.max_tokens_limit)
        started = time.perf_counter()
        completions = []
        for i in range(chat.n):
            seeded = chat if chat.seed is None else replace(chat, seed=chat.seed + i)
            completions.append(self.model.complete(seeded))
        self.seconds.observe(time.perf_counter() - started)
        self.completions.inc(len(completions))
        generated = sum(c.completion_tokens for c in completions)
        self.tokens.inc(generated)
        prompt_tokens = completions[0].prompt_tokens
        return json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model_name,
                "choices": [
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": c.text},
                        "finish_reason": c.finish_reason,
                    }
                    for i, c in enumerate(completions)
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": generated,
                    "total_tokens": prompt_tokens + generated,
                },
            }
        )


def serve_chat(
    model: ChatModel,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    *,
    model_name: str = "judge",
    max_tokens_limit: int = 1024,
    max_body_bytes: int = 4 * 1024 * 1024,
    read_timeout_s: float = 30.0,
    drain_timeout_s: float = 30.0,
) -> ServerHandle:
    """Start the chat-completions server in background threads; port 0 picks a free port."""
    registry = Registry()
    app = ChatApp(model, registry, model_name, max_tokens_limit)
    settings = HTTPSettings(
        host=host,
        port=port,
        token=token,
        max_body_bytes=max_body_bytes,
        read_timeout_s=read_timeout_s,
        drain_timeout_s=drain_timeout_s,
        metric_prefix="nemotron_judge",
    )
    return ServerHandle(app, settings, registry)


def main(argv: Sequence[str] | None = None) -> int:
    """The same command line as `python -m nemotron.reward.server`, so one launcher starts either."""
    parser = server_command_line(
        "python -m nemotron.reward.chat_server", __doc__, "HF causal-LM directory (safetensors)"
    )
    parser.add_argument("--model-name", default="judge")
    parser.add_argument("--max-length", type=int, default=512, help="context: prompt + answer tokens")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import torch

    from nemotron.devices import model_dtype, runtime_device
    from nemotron.models.checkpoint import load_policy, load_tokenizer

    torch.set_num_threads(args.threads)
    device = runtime_device(args.device)
    model = load_policy(args.model, device=device, dtype=model_dtype(args.precision))
    tokenizer = load_tokenizer(args.model)
    handle = serve_chat(
        HFChatModel(model, tokenizer, args.max_length),
        args.host,
        args.port,
        bearer_token(args),
        model_name=args.model_name,
    )
    if args.ready_file is not None:
        write_ready_file(args.ready_file, handle)
    return run_until_signal(handle)


if __name__ == "__main__":
    sys.exit(main())
