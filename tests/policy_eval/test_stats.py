"""The eval report's statistics, checked against hand-worked values: the bootstrap interval (and its coverage on
synthetic scores), the pairwise win-rate with position bias, and distinct-n."""

from __future__ import annotations

import random

import numpy as np
import pytest

from nemotron.policy_eval.report import summarise
from nemotron.policy_eval.stats import (
    bootstrap_interval,
    corpus_distinct_n,
    distinct_n,
    pairwise_win,
    preference_from_scores,
)


def test_identical_scores_give_a_zero_width_interval_at_their_mean() -> None:
    i = bootstrap_interval([0.25, 0.25, 0.25])
    assert (i.mean, i.low, i.high, i.n) == (0.25, 0.25, 0.25, 3)


def test_two_scores_by_hand() -> None:
    """Resampling [0, 1] twice gives means 0, 0.5, 1 with chances 1/4, 1/2, 1/4: the 2.5% and 97.5% quantiles of
    1000 such means are 0 and 1 (each end has ~250 of them)."""
    i = bootstrap_interval([0.0, 1.0], resamples=1000, seed=3)
    assert (i.mean, i.low, i.high) == (0.5, 0.0, 1.0)


def test_the_interval_is_a_function_of_its_seed() -> None:
    rng = random.Random(1)
    scores = [rng.random() for _ in range(30)]
    assert bootstrap_interval(scores, seed=5) == bootstrap_interval(scores, seed=5)
    assert bootstrap_interval(scores, seed=5) != bootstrap_interval(scores, seed=6)


def test_no_scores_is_an_error() -> None:
    with pytest.raises(ValueError, match="no scores"):
        bootstrap_interval([])


@pytest.mark.parametrize(("level", "band"), [(0.95, (0.89, 0.99)), (0.5, (0.38, 0.62))])
def test_the_interval_covers_the_true_mean_at_about_its_nominal_rate(
    level: float, band: tuple[float, float]
) -> None:
    """200 synthetic score sets of 40 draws from a skewed distribution (exponential, true mean 2): the share
    whose interval holds 2 is within about 3 binomial standard deviations of `level` (sd = 0.015 at 95%, 0.035
    at 50%; the percentile bootstrap runs a little narrow at n=40, so the 95% band reaches lower). The 50%
    case shows the interval is not merely wide."""
    rng = np.random.default_rng(0)
    covered = 0
    for trial in range(200):
        scores = rng.exponential(2.0, size=40).tolist()
        i = bootstrap_interval(scores, level=level, resamples=1000, seed=trial)
        covered += i.low <= 2.0 <= i.high
    assert band[0] <= covered / 200 <= band[1], covered / 200


# ---------------------------------------------------------------- pairwise win-rate


def first_always(prompt: str, first: str, second: str) -> float:
    return 1.0


def second_always(prompt: str, first: str, second: str) -> float:
    return 0.0


@pytest.mark.parametrize("judge", [first_always, second_always, lambda p, a, b: 0.5])
def test_a_policy_against_itself_is_exactly_one_half(judge: object) -> None:
    assert pairwise_win("p", "same text", "same text", judge) == 0.5  # type: ignore[arg-type]


def test_position_bias_cancels() -> None:
    """A judge that always prefers whichever response is shown first (or second) calls no winner."""
    assert pairwise_win("p", "good", "bad", first_always) == 0.5
    assert pairwise_win("p", "good", "bad", second_always) == 0.5


def test_a_hand_built_preference_table() -> None:
    """(prompt, first shown, second shown) -> preference for the first. Per prompt, by hand:
    p1: prefers the policy in both orders: (1 + (1 - 0)) / 2 = 1
    p2: prefers the baseline in both orders: (0 + (1 - 1)) / 2 = 0
    p3: prefers whatever comes first: (1 + (1 - 1)) / 2 = 0.5
    p4: a tie one way, the baseline the other: (0.5 + (1 - 1)) / 2 = 0.25
    mean: 1.75 / 4 = 0.4375"""
    table = {
        ("p1", "A", "B"): 1.0, ("p1", "B", "A"): 0.0,
        ("p2", "A", "B"): 0.0, ("p2", "B", "A"): 1.0,
        ("p3", "A", "B"): 1.0, ("p3", "B", "A"): 1.0,
        ("p4", "A", "B"): 0.5, ("p4", "B", "A"): 1.0,
    }  # fmt: skip

    def judge(prompt: str, first: str, second: str) -> float:
        return table[(prompt, first, second)]

    wins = [pairwise_win(p, "A", "B", judge) for p in ("p1", "p2", "p3", "p4")]
    assert wins == [1.0, 0.0, 0.5, 0.25]
    assert sum(wins) / len(wins) == 0.4375


def test_a_verdicts_scores_become_a_preference_and_equal_scores_a_tie() -> None:
    assert preference_from_scores(4, 2) == 1.0
    assert preference_from_scores(2, 4) == 0.0
    assert preference_from_scores(3, 3) == 0.5


def test_a_preference_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        pairwise_win("p", "a", "b", lambda p, x, y: 2.0)


# ---------------------------------------------------------------- distinct-n


def test_distinct_n_by_hand() -> None:
    assert distinct_n("a b a b", 1) == 2 / 4  # a, b of a b a b
    assert distinct_n("a b a b", 2) == 2 / 3  # (a b), (b a) of (a b), (b a), (a b)
    assert distinct_n("a b a b", 3) == 1.0  # (a b a), (b a b)
    assert distinct_n("a", 2) == 0.0  # no bigram at all


def test_corpus_distinct_n_sees_repeats_across_responses() -> None:
    assert distinct_n("a b", 1) == 1.0
    assert corpus_distinct_n(["a b", "a b"], 1) == 2 / 4
    assert corpus_distinct_n(["a b", "a b"], 2) == 1 / 2
    assert corpus_distinct_n(["a b", "c d"], 2) == 1.0


def test_summarise_skips_rows_without_a_metric() -> None:
    rows = [{"x": 1.0, "y": 2.0}, {"x": 3.0}, {"x": 2.0, "y": None}]
    out = summarise(rows, ["x", "y", "z"], resamples=200, level=0.95, seed=0)
    assert out["x"]["mean"] == 2.0 and out["x"]["n"] == 3
    assert out["y"] == {"mean": 2.0, "low": 2.0, "high": 2.0, "n": 1}
    assert "z" not in out
