"""Config schema of data/prep: generate a tiny task's prompt, SFT and preference JSONL from shipped
material."""

from typing import Literal

from pydantic import Field

from nemotron.config.stepconfig import DataRuntime, Strict


class Task(Strict):
    """Which tiny task to generate, and how many records of each file."""

    name: Literal["sentiment", "reverse"] = "sentiment"
    """sentiment: continue a review positively (VADER ground truth); reverse: reverse digits"""
    num_prompts: int = Field(512, ge=1)
    """lines of the RL training prompt JSONL"""
    num_validation_prompts: int = Field(64, ge=1)
    """lines of the held-out prompt JSONL (a separate seed)"""
    num_sft: int = Field(4000, ge=1)
    """{prompt, response} lines of the SFT JSONL"""
    num_preferences: int = Field(4000, ge=1)
    """{prompt, chosen, rejected} lines of the preference JSONL"""


class Outputs(Strict):
    """Names the four JSONL files are registered under in the artifact store."""

    prompts: str = "tiny_prompts"
    """artifact name of the training prompts (prompt_jsonl)"""
    validation_prompts: str = "tiny_validation_prompts"
    """artifact name of the held-out prompts (prompt_jsonl)"""
    sft: str = "tiny_sft_data"
    """artifact name of the SFT data (sft_jsonl)"""
    preferences: str = "tiny_preferences"
    """artifact name of the preference pairs (preference_jsonl)"""


class Config(Strict):
    """data/prep: the tiny task's prompt, SFT and preference JSONL, generated from shipped word lists."""

    task: Task = Field(default_factory=Task)
    outputs: Outputs = Field(default_factory=Outputs)
    runtime: DataRuntime = Field(default_factory=DataRuntime)
