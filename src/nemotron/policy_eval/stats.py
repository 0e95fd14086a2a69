"""The report's statistics: a mean with a percentile-bootstrap interval, the pairwise win-rate, distinct-n.

All pure and deterministic: the bootstrap draws from a seeded generator, so one set of scores always gives the
same interval (the report is compared byte for byte across runs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    """A metric's mean over the prompts and its bootstrap interval."""

    mean: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n}


def bootstrap_interval(
    scores: Sequence[float], *, resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> Interval:
    """The mean of `scores` and its percentile-bootstrap interval: resample the scores with replacement
    `resamples` times, take each resample's mean, and report the (1-level)/2 and (1+level)/2 quantiles of those
    means. One score (or identical scores) gives a zero-width interval at the mean."""
    if not scores:
        raise ValueError("no scores to summarise")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), not {level}")
    values = np.asarray(scores, dtype=np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(values), size=(resamples, len(values)))
    means = values[picks].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return Interval(float(values.mean()), float(low), float(high), len(values))


def unpaired_difference_interval(
    reference: Sequence[float],
    other: Sequence[float],
    *,
    resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """mean(other) - mean(reference) and its percentile-bootstrap interval when the two sets of scores are not
    paired (different prompts): each resample draws both sets anew, independently, and takes the difference of
    their means. `n` is the smaller set's size. (Scores of the same prompts are paired: bootstrap_interval of the
    per-prompt differences is the sharper test there.)"""
    if not reference or not other:
        raise ValueError("no scores to compare")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), not {level}")
    a = np.asarray(reference, dtype=np.float64)
    b = np.asarray(other, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means_a = a[rng.integers(0, len(a), size=(resamples, len(a)))].mean(axis=1)
    means_b = b[rng.integers(0, len(b), size=(resamples, len(b)))].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means_b - means_a, [tail, 1 - tail])
    return Interval(float(b.mean() - a.mean()), float(low), float(high), min(len(a), len(b)))


# A judge's preference for the first of two responses: 1.0 first better, 0.0 second better, 0.5 a tie.
Prefer = Callable[[str, str, str], float]


def pairwise_win(prompt: str, response: str, baseline: str, prefer: Prefer) -> float:
    """How much `response` beats `baseline` on one prompt, in [0, 1]: the judge sees the pair in both orders
    and the two verdicts are averaged, so a judge that always prefers the first (or the second) position
    scores every pair 0.5. A tie counts as half a win. The same text on both sides is exactly 0.5 whatever the
    judge says (x + (1 - x) over 2)."""
    first = prefer(prompt, response, baseline)
    second = prefer(prompt, baseline, response)
    for verdict in (first, second):
        if not 0.0 <= verdict <= 1.0:
            raise ValueError(f"a preference is in [0, 1], not {verdict}")
    return (first + (1.0 - second)) / 2


def preference_from_scores(score_1: float, score_2: float) -> float:
    """A pairwise verdict's scores as a preference for response 1: higher wins, equal is a tie (0.5)."""
    if score_1 > score_2:
        return 1.0
    if score_1 < score_2:
        return 0.0
    return 0.5


def ngrams(words: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def distinct_n(response: str, n: int) -> float:
    """Distinct-n of one response (Li et al., 2016): its distinct word n-grams over all its word n-grams; a
    response shorter than n words has none and scores 0."""
    grams = ngrams(response.split(), n)
    return len(set(grams)) / len(grams) if grams else 0.0


def corpus_distinct_n(responses: Sequence[str], n: int) -> float:
    """Distinct-n over all responses together: repeating the same answer to every prompt lowers it even when each
    response alone has no repeats."""
    grams = [g for r in responses for g in ngrams(r.split(), n)]
    return len(set(grams)) / len(grams) if grams else 0.0
