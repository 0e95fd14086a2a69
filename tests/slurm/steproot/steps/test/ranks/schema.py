"""Schema of the multi-node ranks test step."""

from typing import Literal

from nemotron.config.stepconfig import Strict


class Outputs(Strict):
    result: str = "ranks_result"


class Config(Strict):
    outputs: Outputs = Outputs()
    rounds: int = 5
    """how many rounds the ranks agree on"""
    sleep_s: float = 0.0
    """pause after each round"""
    fail_at_round: int = 0
    """every rank fails at this round (0: none): a mistake found only once the ranks run"""
    fail_with: Literal["user", "crash"] = "user"
    """how they fail: a UserError (exit 2 from every rank) or a RuntimeError (a crash, exit 1)"""
