"""The generative judge: score parsing on hand-written answers, and the client against a real chat server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from nemotron.models.tiny import tiny_model
from nemotron.reward.chat_server import ChatRequest, Completion, HFChatModel, render_messages, serve_chat
from nemotron.reward.client import RewardServerError
from nemotron.reward.judge import (
    DEFAULT_PROMPT_TEMPLATE,
    JudgeClient,
    aggregate_pairwise,
    comparison_pairs,
    fill_template,
    parse_judge_json,
    parse_judge_score,
    parse_pairwise_verdict,
    score_choices,
)
from nemotron.reward.metrics import parse_samples
from nemotron.reward.transport import HTTPSettings, ServerHandle

from .test_server import http_call

# ---- parsing, on answers written by hand ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"score": 7}', 7.0),
        ('The response is upbeat. {"score": 8.5}', 8.5),
        ('Thinking... {"score": 2} no wait, final: {"score": 9}', 9.0),  # the last object wins
        (
            'Verdict:\n```json\n{"score": 6}\n```\nI also considered {"score": 1}.',
            6.0,
        ),  # a fence beats loose JSON
        ('```\n{"score": 4}\n```', 4.0),  # an unlabelled fence
        ('{"reasoning": "fine {mostly}", "score": "5"}', 5.0),  # braces in strings, numeric string
        ('{"verdict": {"score": 3}}', 3.0),  # the inner object holds the score
        ('{"score": 7} }} trailing', 7.0),
        ("I would give it a seven.", None),
        ('{"score": "high"}', None),
        ('{"score": true}', None),
        ('{"score": NaN}', None),
        ('{"grade": 7}', None),
        ('{"score": 11}', None),  # outside [0, 10]
        ('{"score": -1}', None),
        ("{" * 3000, None),
        ("", None),
    ],
)
def test_parse_judge_score(text: str, expected: float | None) -> None:
    assert parse_judge_score(text, "score", 0, 10) == expected


def test_parse_pairwise_verdict() -> None:
    assert parse_pairwise_verdict('ok ```json\n{"score_1": 4, "score_2": 3, "ranking": 2}\n```') == (
        4.0,
        3.0,
        2.0,
    )
    assert parse_pairwise_verdict('{"score_1": 4, "score_2": 3}') == (4.0, 3.0, None)
    assert parse_pairwise_verdict('{"score_1": 4}') is None
    assert parse_judge_json('{"a": 1, "b": "2"}', ["a", "b"]) == {"a": 1.0, "b": 2.0}


def test_fill_template_keeps_json_braces_and_does_not_resubstitute() -> None:
    filled = fill_template('P={prompt} R={response} {"score": 7}', prompt="say {response}", response="hi")
    assert filled == 'P=say {response} R=hi {"score": 7}'


def test_comparison_pairs() -> None:
    assert comparison_pairs(4, "circular") == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert comparison_pairs(2, "circular") == [(0, 1)]  # (1, 0) would repeat the same comparison
    assert comparison_pairs(4, "all_pairs") == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert comparison_pairs(1, "all_pairs") == []
    with pytest.raises(ValueError, match="unknown comparison strategy"):
        comparison_pairs(3, "swiss")


def test_aggregate_pairwise_by_hand() -> None:
    # Pair (0,1): 4 vs 2. Pair (1,2): tie 3 vs 3 with ranking 1 -> shift (3.5-1)/5 = +0.5 to response 1:
    # 3.5 vs 2.5. Response 0: 4. Response 1: (2 + 3.5)/2 = 2.75. Response 2: 2.5. Response 3: never compared.
    results = [(0, 1, 4.0, 2.0, 5.0), (1, 2, 3.0, 3.0, 1.0)]
    assert aggregate_pairwise(4, results, default=-1.0) == [4.0, 2.75, 2.5, -1.0]


def test_score_choices() -> None:
    assert score_choices(0, 2) == ['{"score": 0}', '{"score": 1}', '{"score": 2}']


# ---- the client against a real chat server with a scripted model ----------------------------------


class ScriptedModel:
    """A chat model that answers from a script, so the parse/retry/fallback path runs over real HTTP."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = list(answers)
        self.requests: list[ChatRequest] = []
        self.lock = threading.Lock()

    def complete(self, request: ChatRequest) -> Completion:
        with self.lock:
            self.requests.append(request)
            text = self.answers.pop(0) if self.answers else "no verdict"
        return Completion(text, "stop", prompt_tokens=10, completion_tokens=len(text.split()))


@pytest.fixture
def scripted() -> ScriptedModel:
    return ScriptedModel([])


@pytest.fixture
def scripted_server(scripted: ScriptedModel) -> Iterator[ServerHandle]:
    with serve_chat(scripted, HTTPSettings(token="judge-token")) as handle:
        yield handle


def test_judge_retries_a_bad_answer_then_parses(
    scripted: ScriptedModel, scripted_server: ServerHandle
) -> None:
    scripted.answers = ["I think it is nice.", 'Fine:\n```json\n{"score": 8}\n```']
    judge = JudgeClient(scripted_server.url, token="judge-token", parse_retries=2, temperature=0.0)
    assert judge.score("Write a review", "great fun film") == 8.0
    assert judge.metrics() == {
        "judge/requests": 2.0,
        "judge/parse_failures": 1.0,
        "judge/fallbacks": 0.0,
        "judge/parse_failure_rate": 0.5,
    }
    first, retry = scripted.requests
    assert first.temperature == 0.0 and retry.temperature == 0.7  # the retry samples instead of repeating
    assert "great fun film" in first.messages[-1][1] and "Write a review" in first.messages[-1][1]


def test_judge_falls_back_to_the_default_score(
    scripted: ScriptedModel, scripted_server: ServerHandle
) -> None:
    scripted.answers = ["nope", '{"score": 99}', "still nothing"]
    judge = JudgeClient(scripted_server.url, token="judge-token", parse_retries=2, default_score=-5.0)
    assert judge.score("p", "r") == -5.0
    metrics = judge.metrics()
    assert (metrics["judge/requests"], metrics["judge/parse_failures"], metrics["judge/fallbacks"]) == (
        3,
        3,
        1,
    )


def test_judge_pairwise_compare(scripted: ScriptedModel, scripted_server: ServerHandle) -> None:
    scripted.answers = [
        '{"score_1": 5, "score_2": 2, "ranking": 1}',  # (0, 1)
        '{"score_1": 3, "score_2": 3, "ranking": 6}',  # (1, 2): tie, response 2 much better -> 2.5 vs 3.5
        '```json\n{"score_1": 1, "score_2": 4}\n```',  # (2, 0)
    ]
    judge = JudgeClient(scripted_server.url, token="judge-token", concurrency=1)
    rewards = judge.compare("prompt", ["r0", "r1", "r2"], strategy="circular")
    # r0: (5 + 4)/2 = 4.5; r1: (2 + 2.5)/2 = 2.25; r2: (3.5 + 1)/2 = 2.25
    assert rewards == [4.5, 2.25, 2.25]
    assert "Response 1: r1" in scripted.requests[1].messages[-1][1]


def test_score_groups_compares_each_prompts_run_and_scores_singletons(
    scripted: ScriptedModel, scripted_server: ServerHandle
) -> None:
    scripted.answers = [
        '{"score_1": 4, "score_2": 1}',  # prompt a: its 2 responses, one circular pair
        '{"score": 7}',  # prompt b: one response, nothing to compare with -> scored alone
        '{"score_1": 2, "score_2": 2, "ranking": 1}',  # prompt c: a tie broken by ranking 1 -> +-0.5
    ]
    judge = JudgeClient(scripted_server.url, token="judge-token", concurrency=1)
    rewards = judge.score_groups(["a", "a", "b", "c", "c"], ["a0", "a1", "b0", "c0", "c1"])
    # a: [4, 1]; b: 7; c: 2 + (3.5 - 1)/5 = 2.5 and 2 - 0.5 = 1.5
    assert rewards == [4.0, 1.0, 7.0, 2.5, 1.5]
    assert len(scripted.requests) == 3 and "Response 2: c1" in scripted.requests[2].messages[-1][1]


def test_judge_score_many_and_server_down(scripted: ScriptedModel, scripted_server: ServerHandle) -> None:
    scripted.answers = ['{"score": 1}', '{"score": 2}', '{"score": 3}']
    judge = JudgeClient(scripted_server.url, token="judge-token", concurrency=1)
    assert judge.score_many(["a", "b", "c"], ["x", "y", "z"]) == [1.0, 2.0, 3.0]
    with pytest.raises(RewardServerError, match=r"judge server at .* HTTP 401"):
        JudgeClient(scripted_server.url, token="wrong").score("a", "x")
    scripted_server.stop()
    with pytest.raises(RewardServerError, match="cannot connect"):
        JudgeClient(scripted_server.url, http_retries=1, backoff=0.01).score("a", "x")


def test_template_must_have_placeholders() -> None:
    with pytest.raises(ValueError, match=r"\{response\}"):
        JudgeClient("http://127.0.0.1:1", "Rate {prompt}")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "'role'"),
        ({"messages": [{"role": "user", "content": 3}]}, "content must be a string"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 9}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "guided_choice": []}, "guided_choice"),
        (
            {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}},
            "guided_choice",
        ),
    ],
)
def test_chat_server_rejects_bad_requests(
    scripted_server: ServerHandle, payload: object, message: str
) -> None:
    headers = {"Authorization": "Bearer judge-token"}
    status, _, body = http_call(
        scripted_server.url, "/v1/chat/completions", json.dumps(payload).encode(), headers
    )
    error = json.loads(body)["error"]  # OpenAI's error object
    assert status == 400 and message in error["message"] and error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "param", "code"}
    assert http_call(scripted_server.url, "/health")[0] == 200


# ---- the client against a real chat server serving a real (random, tiny) causal LM ----------------


@pytest.fixture(scope="module")
def judge_lm() -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    corpus = [DEFAULT_PROMPT_TEMPLATE, "user: assistant: great fun boring film", *score_choices(0, 10)] * 5
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    core.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>")
    return tiny_model(len(tokenizer), n_positions=256, eos_token_id=1), tokenizer


@pytest.fixture
def lm_server(judge_lm: tuple[PreTrainedModel, PreTrainedTokenizerFast]) -> Iterator[ServerHandle]:
    model, tokenizer = judge_lm
    with serve_chat(HFChatModel(model, tokenizer, max_context=256)) as handle:
        yield handle


def _choice_logprob(model: PreTrainedModel, prompt: list[int], choice: list[int]) -> float:
    """log p(choice | prompt), one unpadded sequence at a time (independent of the server's batching)."""
    ids = torch.tensor([prompt + choice])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0], -1)  # [T, V]
    return sum(float(logprobs[len(prompt) - 1 + k, token]) for k, token in enumerate(choice))


def test_judge_with_guided_choice_on_a_real_lm(
    lm_server: ServerHandle, judge_lm: tuple[PreTrainedModel, PreTrainedTokenizerFast]
) -> None:
    model, tokenizer = judge_lm
    judge = JudgeClient(lm_server.url, guided_choice=True, temperature=0.0)
    score = judge.score("Write a movie review.", "great fun film")
    assert score in [float(s) for s in range(11)]
    assert judge.metrics()["judge/parse_failures"] == 0

    # The server's pick is the choice the LM finds most likely, computed here without padding or batching.
    content = fill_template(
        DEFAULT_PROMPT_TEMPLATE, prompt="Write a movie review.", response="great fun film"
    )
    prompt = tokenizer(render_messages([("user", content)]), add_special_tokens=False)["input_ids"]
    choices = score_choices(0, 10)
    logprobs = [
        _choice_logprob(model, prompt, tokenizer(c, add_special_tokens=False)["input_ids"]) for c in choices
    ]
    assert max(logprobs) - min(logprobs) > 1.0  # the choices really differ for this LM
    assert logprobs[int(score)] >= max(logprobs) - 1e-4  # a near-tie may go either way under padding


def test_free_generation_on_a_real_lm_is_openai_shaped_and_falls_back(lm_server: ServerHandle) -> None:
    body = json.dumps(
        {
            "model": "judge",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "temperature": 0.8,
            "seed": 3,
            "n": 2,
        }
    ).encode()
    status, _, response = http_call(lm_server.url, "/v1/chat/completions", body)
    assert status == 200
    payload = json.loads(response)
    assert payload["object"] == "chat.completion" and len(payload["choices"]) == 2
    for choice in payload["choices"]:
        assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
        assert choice["finish_reason"] in ("stop", "length")
    usage = payload["usage"]
    assert (
        0 < usage["completion_tokens"] <= 10
        and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    )

    # A random LM writes no JSON: every attempt fails to parse and the default score comes back, counted.
    judge = JudgeClient(lm_server.url, parse_retries=1, default_score=0.5, max_tokens=8)
    assert judge.score("p", "r") == 0.5
    assert judge.metrics()["judge/fallbacks"] == 1 and judge.metrics()["judge/parse_failures"] == 2
    samples = parse_samples(http_call(lm_server.url, "/metrics")[2].decode())
    assert samples["nemotron_judge_completions_total"] == 4  # 2 (n=2) + 2 judge attempts


def test_prompts_longer_than_the_context_are_cut_not_crashed(lm_server: ServerHandle) -> None:
    long_response = "great fun film " * 200  # far beyond the model's 256 positions
    judge = JudgeClient(lm_server.url, guided_choice=True, max_tokens=200)
    assert 0.0 <= judge.score("p", long_response) <= 10.0
    free = JudgeClient(lm_server.url, parse_retries=0, max_tokens=400, http_retries=0)
    free.score("p", long_response)  # a 500 would raise RewardServerError here
    assert free.metrics()["judge/requests"] == 1


def test_chat_server_command_line_through_the_sibling_launcher(
    tmp_path: Path, judge_lm: tuple[PreTrainedModel, PreTrainedTokenizerFast]
) -> None:
    """`python -m nemotron.reward.chat_server` takes the reward server's flags, token variable and ready file."""
    from nemotron.reward.sibling import sibling_server

    model, tokenizer = judge_lm
    model.save_pretrained(tmp_path / "judge")
    tokenizer.save_pretrained(tmp_path / "judge")
    log = tmp_path / "judge.log"
    with sibling_server(
        tmp_path / "judge", module="nemotron.reward.chat_server", max_length=256, log_path=log
    ) as (
        url,
        token,
    ):
        judge = JudgeClient(url, token=token, guided_choice=True)
        assert 0.0 <= judge.score("p", "great fun film") <= 10.0
        with pytest.raises(RewardServerError, match="HTTP 401"):
            JudgeClient(url, token="wrong").score("p", "r")
    assert "received SIGTERM" in log.read_text()
