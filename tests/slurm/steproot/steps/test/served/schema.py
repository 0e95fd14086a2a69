"""Schema of the reward-server client test step."""

from pydantic import Field

from nemotron.config.stepconfig import Strict


class Inputs(Strict):
    reward_model: str | None = None


class Outputs(Strict):
    scores: str = "served_scores"


class Config(Strict):
    inputs: Inputs = Inputs()
    outputs: Outputs = Outputs()
    sentences: list[str] = Field(default_factory=lambda: ["the movie was great", "the plot was awful"])
