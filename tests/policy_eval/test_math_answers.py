"""math-verify scoring against hand-written cases: equivalent forms agree, wrong answers and unparseable output
score 0 (and are told apart by `parsed`)."""

from __future__ import annotations

import pytest

from nemotron.policy_eval.math_answers import verify_answer


@pytest.mark.parametrize(
    ("response", "reference"),
    [
        ("The answer is \\boxed{0.5}", "1/2"),
        ("so x = 1/2", "\\frac{1}{2}"),
        ("$\\frac{1}{2}$", "0.5"),
        ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}"),  # not reduced
        ("The total is $4$.", "4"),
        ("\\boxed{\\sqrt{4}}", "2"),
        ("x = \\boxed{2x+2}", "2(x+1)"),  # expanded vs factored
    ],
)
def test_equivalent_forms_are_correct(response: str, reference: str) -> None:
    assert verify_answer(response, reference).correct


@pytest.mark.parametrize(
    ("response", "reference"),
    [("The answer is \\boxed{0.25}", "1/2"), ("$3$", "4"), ("\\boxed{2x+1}", "2(x+1)")],
)
def test_wrong_answers_parse_and_are_wrong(response: str, reference: str) -> None:
    verdict = verify_answer(response, reference)
    assert verdict.parsed and not verdict.correct


@pytest.mark.parametrize("response", ["I don't know", "", "the movie was great ."])
def test_unparseable_output_is_wrong_and_counted_apart(response: str) -> None:
    verdict = verify_answer(response, "1/2")
    assert not verdict.parsed and not verdict.correct
