"""The chat models behind the judge server: what a chat request asks and a completion answers, and
`HFChatModel`, a `transformers` causal LM that answers them (greedy, sampled, or constrained to a list of choices).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from nemotron.reward.messages import HTTPError
from nemotron.reward.scorer import longest_token_chars

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


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
    stream: bool = False  # answer as server-sent events of chat.completion.chunk objects
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the token counts


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int


class ChatModel(Protocol):
    """Anything that answers a chat: an HF causal LM, or a scripted stand-in in tests."""

    def complete(self, request: ChatRequest) -> Completion: ...


@runtime_checkable
class StreamingChatModel(Protocol):
    """A chat model that hands out its answer as it generates it: `emit(text)` for each new piece of text, in
    order; the pieces add up to the returned completion's text. The judge server streams such a model's answer
    to `stream=True` requests token by token; any other model's answer leaves in one piece at its end."""

    def complete(self, request: ChatRequest) -> Completion: ...

    def complete_streaming(self, request: ChatRequest, emit: Callable[[str], None]) -> Completion: ...


def keep_last_chars(
    messages: Sequence[tuple[str, str]], budget: int, per_message: int
) -> list[tuple[str, str]]:
    """The conversation's end, within `budget` characters: the latest messages whole, the one that straddles
    the budget without its start, the earlier ones dropped. Each message is also charged `per_message`, the
    characters of one token (its role and the template's marks around it are at least that), so a flood of
    empty messages is cut too."""
    kept: list[tuple[str, str]] = []
    left = budget
    for role, content in reversed(messages):
        if left <= 0:
            break
        content = content[-left:] if len(content) > left else content
        kept.append((role, content))
        left -= len(content) + per_message
    return kept[::-1]


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
        self.model.eval()
        self._lock = threading.Lock()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_id is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token")
        # Only the prompt's last max_context tokens are used: the text of more than those can span is cut before
        # it is tokenised, so a 3 MB message costs its tail, not ~600 MB of token objects (docs/reward-server.md).
        self.token_chars = longest_token_chars(tokenizer)
        self.prompt_chars = (self.max_context + 1) * self.token_chars

    def prompt_ids(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        """The prompt's token ids; at least its last max_context tokens are those of the whole conversation."""
        messages = keep_last_chars(messages, self.prompt_chars, self.token_chars)
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

    def complete_streaming(self, request: ChatRequest, emit: Callable[[str], None]) -> Completion:
        """`complete`, emitting the text as tokens come. A guided choice, or an answer that a stop string may
        cut, is emitted whole at the end (a piece once sent cannot be taken back)."""
        import torch

        if request.guided_choice is not None or request.stop:
            completion = self.complete(request)
            emit(completion.text)
            return completion
        prompt = self.prompt_ids(request.messages)
        if not prompt:
            raise HTTPError(400, "the messages encode to no tokens")
        emitter = _text_emitter(self.tokenizer, emit)
        with self._lock, torch.inference_mode():
            if request.seed is not None:
                torch.manual_seed(request.seed)
            completion = self._generate(prompt, request, emitter)
        if completion.text.startswith(emitter.sent):  # what decoding the whole answer adds at its end
            emit(completion.text[len(emitter.sent) :])
        return completion

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

    def _generate(self, prompt: list[int], request: ChatRequest, streamer: Any = None) -> Completion:
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
        output = self.model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new,
            pad_token_id=self.pad_id,
            eos_token_id=self.tokenizer.eos_token_id,
            streamer=streamer,
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


def _text_emitter(tokenizer: PreTrainedTokenizerBase, emit: Callable[[str], None]) -> Any:
    """A `transformers` streamer that emits the answer's new text after each generated token: what decoding
    the answer so far adds to what was sent, held back while the decoded text ends in half a character."""
    from transformers.generation.streamers import BaseStreamer

    class TextEmitter(BaseStreamer):  # type: ignore[misc]  # transformers is Any to mypy (pyproject)
        def __init__(self) -> None:
            self.ids: list[int] = []
            self.sent = ""
            self.prompt_seen = False
            self.ended = False

        def put(self, value: Any) -> None:
            if not self.prompt_seen:  # generate() first passes the prompt
                self.prompt_seen = True
                return
            for token in value.reshape(-1).tolist():
                if self.ended or token == tokenizer.eos_token_id:
                    self.ended = True
                    return
                self.ids.append(int(token))
            text = str(tokenizer.decode(self.ids, skip_special_tokens=True))
            if text.endswith("\ufffd") or not text.startswith(self.sent):
                return
            piece, self.sent = text[len(self.sent) :], text
            if piece:
                emit(piece)

        def end(self) -> None:
            pass

    return TextEmitter()
