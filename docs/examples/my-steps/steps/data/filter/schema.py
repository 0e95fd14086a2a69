"""Config schema of the example step data/filter."""

from pydantic import Field

from nemotron.config.stepconfig import Strict


class Inputs(Strict):
    prompts: str | None = None
    """the prompts to filter (prompt_jsonl)"""


class Outputs(Strict):
    prompts: str = "short_prompts"
    """artifact name of the kept prompts"""


class Filter(Strict):
    """Which prompts are kept."""

    max_words: int = Field(8, ge=1)
    """keep prompts of at most this many words"""


class Config(Strict):
    inputs: Inputs = Inputs()
    outputs: Outputs = Outputs()
    filter: Filter = Filter()
