"""The generative judge: ask a chat model (OpenAI-compatible endpoint) to score responses, parse its JSON verdict.

Parsing tolerates prose around the verdict: a fenced ```json block wins, else the last {...} that holds the
score. An unparseable answer is retried, then replaced by a default score; both are counted in `metrics()`.
Pairwise mode compares responses two at a time, in the style of NeMo-Gym's genrm_compare.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from nemotron.reward.client import RetryingHTTPClient

logger = logging.getLogger(__name__)

DEFAULT_PROMPT_TEMPLATE = (
    "Rate how positive and well written the response is, from 0 (worst) to 10 (best).\n"
    "Prompt: {prompt}\n"
    "Response: {response}\n"
    'Answer with JSON only, like {"score": 7}.'
)
DEFAULT_PAIRWISE_TEMPLATE = (
    "Compare two responses to the same prompt. Score each from 1 to 5 and rank them from 1 "
    "(response 1 much better) to 6 (response 2 much better).\n"
    "Prompt: {prompt}\n"
    "Response 1: {response_1}\n"
    "Response 2: {response_2}\n"
    'Answer with JSON only, like {"score_1": 4, "score_2": 3, "ranking": 2}.'
)
_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)
_PLACEHOLDER = re.compile(r"\{(prompt|response|response_1|response_2)\}")


def fill_template(template: str, **values: str) -> str:
    """Replace {prompt}, {response}, ... in one pass; other braces (JSON examples) stay as written."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)] if m.group(1) in values else m.group(0), template)


def _as_number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def _objects_from_end(text: str) -> list[dict[str, Any]]:
    """Every JSON object that starts at some '{' in `text`, the last-starting first."""
    decoder = json.JSONDecoder()
    found = []
    for start in (m.start() for m in reversed(list(re.finditer(r"\{", text)))):
        try:
            value, _ = decoder.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(value, dict):
            found.append(value)
    return found


def parse_judge_json(text: str, keys: Sequence[str]) -> dict[str, float] | None:
    """The judge's verdict {key: number} for all `keys`, or None.

    Fenced ```json blocks are tried first (the last one wins), then the last {...} in the whole text.
    Numbers may be JSON numbers or numeric strings; NaN/inf and booleans are rejected.
    """
    candidates: list[dict[str, Any]] = []
    for block in reversed(_FENCE.findall(text)):
        candidates += _objects_from_end(block)
    candidates += _objects_from_end(text)
    for candidate in candidates:
        numbers = {k: _as_number(candidate.get(k)) for k in keys}
        if all(v is not None for v in numbers.values()):
            return {k: float(v) for k, v in numbers.items() if v is not None}
    return None


def parse_judge_score(
    text: str, key: str = "score", low: float | None = None, high: float | None = None
) -> float | None:
    """The score in the judge's answer, or None if there is none or it lies outside [low, high]."""
    verdict = parse_judge_json(text, [key])
    if verdict is None:
        return None
    score = verdict[key]
    if (low is not None and score < low) or (high is not None and score > high):
        return None
    return score


def parse_pairwise_verdict(text: str) -> tuple[float, float, float | None] | None:
    """(score_1, score_2, ranking or None) from a pairwise verdict, or None."""
    full = parse_judge_json(text, ["score_1", "score_2", "ranking"])
    if full is not None:
        return full["score_1"], full["score_2"], full["ranking"]
    scores = parse_judge_json(text, ["score_1", "score_2"])
    return None if scores is None else (scores["score_1"], scores["score_2"], None)


def score_choices(low: int, high: int, key: str = "score") -> list[str]:
    """Every valid verdict as text, for servers that support `guided_choice` (vLLM, our chat server)."""
    return [json.dumps({key: s}) for s in range(low, high + 1)]


def comparison_pairs(count: int, strategy: str) -> list[tuple[int, int]]:
    """Which responses to compare: 'circular' (i, i+1 mod N: N pairs) or 'all_pairs' (N(N-1)/2 pairs)."""
    if count < 2:
        return []
    if strategy == "all_pairs":
        return [(i, j) for i in range(count) for j in range(i + 1, count)]
    if strategy == "circular":
        return [(i, (i + 1) % count) for i in range(count if count > 2 else 1)]
    raise ValueError(f"unknown comparison strategy {strategy!r}; use 'circular' or 'all_pairs'")


def aggregate_pairwise(
    count: int, results: Sequence[tuple[int, int, float, float, float | None]], default: float
) -> list[float]:
    """Per-response reward: the mean of its pairwise scores; a tie is broken by the ranking (1..6).

    A ranking r moves (3.5 - r) / 5 points from one side to the other: r=1 gives +0.5 to response 1
    and -0.5 to response 2, r=6 the reverse. A response never compared gets `default`.
    """
    totals = [0.0] * count
    seen = [0] * count
    for i, j, score_i, score_j, ranking in results:
        if score_i == score_j and ranking is not None:
            shift = (3.5 - ranking) / 5
            score_i, score_j = score_i + shift, score_j - shift
        totals[i] += score_i
        totals[j] += score_j
        seen[i] += 1
        seen[j] += 1
    return [t / n if n else default for t, n in zip(totals, seen, strict=True)]


@dataclass
class JudgeStats:
    requests: int = 0
    parse_failures: int = 0
    fallbacks: int = 0


class JudgeClient:
    """Scores (prompt, response) pairs by asking a judge model behind /v1/chat/completions."""

    def __init__(
        self,
        url: str,
        prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
        *,
        model: str = "judge",
        token: str | None = None,
        timeout: float = 60.0,
        http_retries: int = 3,
        backoff: float = 0.5,
        parse_retries: int = 2,
        default_score: float = 0.0,
        score_range: tuple[int, int] = (0, 10),
        max_tokens: int = 64,
        temperature: float = 0.0,
        retry_temperature: float = 0.7,
        system_prompt: str | None = None,
        guided_choice: bool = False,
        pairwise_template: str = DEFAULT_PAIRWISE_TEMPLATE,
        concurrency: int = 4,
    ) -> None:
        for placeholder in ("{prompt}", "{response}"):
            if placeholder not in prompt_template:
                raise ValueError(f"the judge prompt template has no {placeholder} placeholder")
        self.http = RetryingHTTPClient(url, token, timeout, http_retries, backoff, service="judge server")
        self.prompt_template, self.pairwise_template = prompt_template, pairwise_template
        self.model, self.system_prompt = model, system_prompt
        self.parse_retries, self.default_score, self.score_range = parse_retries, default_score, score_range
        self.max_tokens, self.temperature, self.retry_temperature = max_tokens, temperature, retry_temperature
        self.guided_choice, self.concurrency = guided_choice, concurrency
        self.stats = JudgeStats()
        self._lock = threading.Lock()

    def _count(self, **increments: int) -> None:
        with self._lock:
            for name, amount in increments.items():
                setattr(self.stats, name, getattr(self.stats, name) + amount)

    def chat(self, content: str, temperature: float, choices: Sequence[str] | None = None) -> str:
        """One chat completion; the assistant's text. Transport failures raise RewardServerError."""
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": content})
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": temperature,
        }
        if choices is not None:  # vLLM's structured outputs (its older `guided_choice` is ignored since 0.1x)
            payload["structured_outputs"] = {"choice": list(choices)}
        self._count(requests=1)
        _, body = self.http.request(
            "POST", "/v1/chat/completions", json.dumps(payload).encode(), {"Content-Type": "application/json"}
        )
        try:
            text = json.loads(body)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise self.http.error(f"not a chat completion: {body[:200]!r}") from exc
        return str(text or "")

    def _ask(self, content: str, parse: Callable[[str], Any], choices: Sequence[str] | None) -> Any:
        """Ask, parse; on a parse failure ask again (sampling); None once the retries are spent."""
        for attempt in range(self.parse_retries + 1):
            temperature = self.temperature if attempt == 0 else max(self.temperature, self.retry_temperature)
            text = self.chat(content, temperature, choices)
            verdict = parse(text)
            if verdict is not None:
                return verdict
            self._count(parse_failures=1)
            logger.debug("unparseable judge answer (attempt %d): %.200r", attempt + 1, text)
        self._count(fallbacks=1)
        return None

    def score(self, prompt: str, response: str) -> float:
        """The judge's score for one response, or `default_score` if no attempt parsed."""
        low, high = self.score_range
        choices = score_choices(low, high) if self.guided_choice else None
        content = fill_template(self.prompt_template, prompt=prompt, response=response)
        score = self._ask(content, lambda text: parse_judge_score(text, "score", low, high), choices)
        return self.default_score if score is None else float(score)

    def score_many(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        """Scores for aligned lists of prompts and responses, `concurrency` requests at a time."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            return list(pool.map(self.score, prompts, responses))

    def compare(self, prompt: str, responses: Sequence[str], strategy: str = "circular") -> list[float]:
        """Per-response rewards from pairwise verdicts {"score_1", "score_2", "ranking"}."""
        pairs = comparison_pairs(len(responses), strategy)

        def judge_pair(pair: tuple[int, int]) -> tuple[int, int, float, float, float | None] | None:
            i, j = pair
            content = fill_template(
                self.pairwise_template, prompt=prompt, response_1=responses[i], response_2=responses[j]
            )
            verdict = self._ask(content, parse_pairwise_verdict, None)
            return None if verdict is None else (i, j, *verdict)

        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            results = [r for r in pool.map(judge_pair, pairs) if r is not None]
        return aggregate_pairwise(len(responses), results, self.default_score)

    def verdict(self, prompt: str, response_1: str, response_2: str) -> tuple[float, float] | None:
        """The pairwise template's (score_1, score_2) for one ordered pair, or None once the parse retries are
        spent. With guided_choice the judge picks among the 25 verdicts of scores 1..5."""
        content = fill_template(
            self.pairwise_template, prompt=prompt, response_1=response_1, response_2=response_2
        )
        choices = [json.dumps({"score_1": a, "score_2": b}) for a in range(1, 6) for b in range(1, 6)]
        verdict = self._ask(content, parse_pairwise_verdict, choices if self.guided_choice else None)
        return None if verdict is None else (verdict[0], verdict[1])

    def score_groups(
        self, prompts: Sequence[str], responses: Sequence[str], strategy: str = "circular"
    ) -> list[float]:
        """Pairwise rewards for aligned lists where each prompt's responses sit next to each other (as GRPO's
        groups do): every run of two or more responses to the same prompt is compared with `compare`; a prompt
        with a single response (e.g. an evaluation sample) has nothing to be compared with and gets `score`."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        rewards: list[float] = []
        start = 0
        while start < len(prompts):
            end = start + 1
            while end < len(prompts) and prompts[end] == prompts[start]:
                end += 1
            group = list(responses[start:end])
            if len(group) == 1:
                rewards.append(self.score(prompts[start], group[0]))
            else:
                rewards.extend(self.compare(prompts[start], group, strategy))
            start = end
        return rewards

    def metrics(self) -> dict[str, float]:
        """Counters for the step's metrics log (parse failures are the number to watch)."""
        with self._lock:
            stats = JudgeStats(**self.stats.__dict__)
        return {
            "judge/requests": float(stats.requests),
            "judge/parse_failures": float(stats.parse_failures),
            "judge/fallbacks": float(stats.fallbacks),
            "judge/parse_failure_rate": stats.parse_failures / stats.requests if stats.requests else 0.0,
        }
