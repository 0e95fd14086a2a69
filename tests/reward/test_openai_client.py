"""The judge server through the real `openai` client: completions, streaming, and errors the client recognises
(an unknown model is NotFoundError with code model_not_found; a full queue is 503 with Retry-After)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch

from nemotron.reward.chat_server import ChatRequest, Completion, HFChatModel, serve_chat
from nemotron.reward.metrics import parse_samples
from nemotron.reward.transport import HTTPSettings, ServerHandle

TOKEN = "judge-openai-token"


class GatedChat:
    """Answers "score: 7" once `gate` is set (set from the start unless a test clears it)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Semaphore(0)

    def complete(self, request: ChatRequest) -> Completion:
        self.started.release()
        assert self.gate.wait(10)
        return Completion("score: 7", "stop", 5, 3)


@pytest.fixture
def chat() -> GatedChat:
    return GatedChat()


@pytest.fixture
def server(chat: GatedChat) -> Iterator[ServerHandle]:
    with serve_chat(chat, HTTPSettings(token=TOKEN), model_name="judge", max_queue=2) as handle:
        yield handle
        chat.gate.set()


def queued(handle: ServerHandle) -> float:
    metrics = httpx.get(handle.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).text
    return parse_samples(metrics)["nemotron_judge_queued_requests"]


def client(handle: ServerHandle, api_key: str = TOKEN) -> openai.OpenAI:
    return openai.OpenAI(base_url=handle.url + "/v1", api_key=api_key, max_retries=0, timeout=10)


MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "rate this"}]


def test_a_completion(server: ServerHandle) -> None:
    answer = client(server).chat.completions.create(model="judge", messages=MESSAGES, n=2)
    assert [c.message.content for c in answer.choices] == ["score: 7", "score: 7"]
    assert answer.usage is not None and answer.usage.completion_tokens == 6
    assert [m.id for m in client(server).models.list()] == ["judge"]


def test_streaming(server: ServerHandle) -> None:
    stream = client(server).chat.completions.create(
        model="judge", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "score: 7"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 8


def test_an_unknown_model_is_not_found(server: ServerHandle) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client(server).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert caught.value.code == "model_not_found" and "gpt-4o" in caught.value.message


def test_a_bad_request_and_a_wrong_key_say_why(server: ServerHandle) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(server).chat.completions.create(model="judge", messages=MESSAGES, temperature=9)
    assert "'temperature' must be a number" in caught.value.message
    with pytest.raises(openai.AuthenticationError):
        client(server, api_key="wrong").chat.completions.create(model="judge", messages=MESSAGES)


def test_past_max_queue_a_request_gets_503_with_retry_after(server: ServerHandle, chat: GatedChat) -> None:
    chat.gate.clear()
    body = {"model": "judge", "messages": MESSAGES}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with ThreadPoolExecutor(2) as pool:
        waiting = [
            pool.submit(
                httpx.post, server.url + "/v1/chat/completions", json=body, headers=headers, timeout=20
            )
            for _ in range(2)
        ]
        assert chat.started.acquire(timeout=10)  # one generates
        deadline = time.monotonic() + 10
        while queued(server) < 2:  # and one waits: the queue of 2 is full
            assert time.monotonic() < deadline
            time.sleep(0.02)
        refused = httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers, timeout=10)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == "server_error"
        with pytest.raises(openai.InternalServerError):
            client(server).chat.completions.create(model="judge", messages=MESSAGES)
        chat.gate.set()
        assert [f.result().status_code for f in waiting] == [200, 200]
    assert client(server).chat.completions.create(model="judge", messages=MESSAGES).choices


class StreamingScript:
    """Emits "score", then waits for `gate`, then emits ": 7": a stream must show the first piece before the
    second exists."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def complete(self, request: ChatRequest) -> Completion:
        return Completion("score: 7", "stop", 5, 3)

    def complete_streaming(self, request: ChatRequest, emit: Callable[[str], None]) -> Completion:
        emit("score")
        assert self.gate.wait(10)
        emit(": 7")
        return Completion("score: 7", "stop", 5, 3)


def test_a_streaming_model_is_streamed_as_it_generates() -> None:
    model = StreamingScript()
    with serve_chat(model, HTTPSettings(token=TOKEN)) as handle:
        try:
            stream = client(handle).chat.completions.create(model="judge", messages=MESSAGES, stream=True)
            chunks = iter(stream)
            pieces = []
            while not pieces:  # the role chunk, then the first piece: before the model is done
                chunk = next(chunks)
                pieces += [c.delta.content for c in chunk.choices if c.delta.content]
            assert pieces == ["score"] and not model.gate.is_set()
            model.gate.set()
            rest = list(chunks)
            pieces += [c.delta.content for chunk in rest for c in chunk.choices if c.delta.content]
            assert "".join(pieces) == "score: 7"
            assert [c.finish_reason for chunk in rest for c in chunk.choices][-1] == "stop"
        finally:
            model.gate.set()


def test_a_real_lm_streams_the_text_it_answers_without_streaming() -> None:
    from tests.reward.conftest import build_tokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=2, n_head=2, eos_token_id=2
    )
    with serve_chat(
        HFChatModel(GPT2LMHeadModel(config).eval(), tokenizer, max_context=64), HTTPSettings(token=TOKEN)
    ) as handle:
        # Sampled with a seed, so both calls draw the same tokens (a random model's greedy answer is empty).
        ask = {"model": "judge", "messages": MESSAGES, "max_tokens": 12, "temperature": 1.0, "seed": 3}
        whole = client(handle).chat.completions.create(**ask).choices[0].message.content
        stream = client(handle).chat.completions.create(**ask, stream=True)
        pieces = [c.delta.content for chunk in stream for c in chunk.choices if c.delta.content]
    assert whole and len(pieces) > 1  # token by token, not one piece at the end
    assert "".join(pieces) == whole


def test_a_client_that_leaves_mid_stream_frees_its_place() -> None:
    model = StreamingScript()
    with serve_chat(model, HTTPSettings(token=TOKEN), max_queue=1) as handle:
        try:
            stream = client(handle).chat.completions.create(model="judge", messages=MESSAGES, stream=True)
            next(iter(stream))
            stream.close()  # gone before the model is done
            model.gate.set()
            deadline = time.monotonic() + 10
            while queued(handle) > 0:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            answer = client(handle).chat.completions.create(model="judge", messages=MESSAGES)
            assert answer.choices[0].message.content == "score: 7"
        finally:
            model.gate.set()
