"""Schema of the multi-node ranks test step."""

from nemotron.config.stepconfig import Strict


class Outputs(Strict):
    result: str = "ranks_result"


class Config(Strict):
    outputs: Outputs = Outputs()
    rounds: int = 5
    """how many rounds the ranks agree on"""
    sleep_s: float = 0.0
    """pause after each round"""
