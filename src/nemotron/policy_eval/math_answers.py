"""Verifiable math answers through the `math-verify` library, the way NeMo-RL's math environment reads them:
the reference is parsed as LaTeX (wrapped in \\boxed{} so a bare `1/2` parses), the response by both its LaTeX
and its plain-expression extractors, and the two are compared symbolically (`1/2`, `0.5` and `\\frac{1}{2}` agree).

A response with no answer that parses scores 0, as a wrong one does; the report counts those apart
(`math_parsed`), since "the policy never answered" and "answered wrong" call for different fixes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass


@dataclass(frozen=True)
class MathVerdict:
    correct: bool
    parsed: bool  # the response held an answer math-verify could extract


def verify_answer(response: str, reference: str, timeout_s: int = 5) -> MathVerdict:
    """Whether `response`'s final answer equals `reference` (math-verify's parse + verify)."""
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # it logs every unparseable answer
    gold = parse("\\boxed{" + reference + "}", extraction_config=(LatexExtractionConfig(),))
    if not gold:  # a reference that is not LaTeX (`0.5`, `x+1`): read it as an expression
        gold = parse(reference, extraction_config=(ExprExtractionConfig(),))
    try:
        answer = parse(
            response,
            extraction_config=(LatexExtractionConfig(), ExprExtractionConfig()),
            parsing_timeout=timeout_s,
        )
        if not answer:
            return MathVerdict(correct=False, parsed=False)
        return MathVerdict(correct=bool(verify(gold, answer, timeout_seconds=timeout_s)), parsed=True)
    except (
        TimeoutException
    ):  # a pathological expression: wrong, not a crash (math-verify raises BaseException)
        return MathVerdict(correct=False, parsed=False)
