"""Config schema of the example step rl/rloo_lite: the shared RL groups (nemotron.config.stepconfig.RLConfig:
inputs, trainer, generation, reward, checkpoint, eval, runtime, plan) plus its own."""

from pydantic import Field

from nemotron.config.stepconfig import RLConfig, Strict
from nemotron.config.workload import Workload


class Outputs(Strict):
    policy: str = "rloo_lite_policy"
    """artifact name of the trained policy"""


class Rloo(Strict):
    """The baseline's group."""

    num_rollouts_per_prompt: int = Field(4, ge=2)
    """responses per prompt (a leave-one-out baseline needs at least 2)"""


class Config(RLConfig):
    outputs: Outputs = Outputs()
    rloo: Rloo = Rloo()

    def workload(self) -> Workload:
        """What the resource plan sizes: the rollouts of one step."""
        return self.rollouts(self.rloo.num_rollouts_per_prompt)
