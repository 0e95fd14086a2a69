"""The refusals of an external engine's compiler: every key of a step config that the engine cannot express,
collected so the user sees them all at once (one UserError, exit 2)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from nemotron.config.backends import READS_NEMO_RL_GROUP
from nemotron.config.configtree import flatten
from nemotron.config.stepconfig import engine_name
from nemotron.errors import UserError


class Refusals:
    """Collects every key `engine` cannot express. `config` and `defaults` are the step config and its schema's
    defaults as JSON trees: a refusal names a key by its dotted path and shows the value the user gave."""

    def __init__(
        self, step_id: str, config: dict[str, Any], defaults: dict[str, Any], *, engine: str, hint: str
    ) -> None:
        self.step_id, self.flat, self.defaults = step_id, dict(flatten(config)), dict(flatten(defaults))
        self.engine, self.hint = engine, hint
        self.problems: list[str] = []

    @classmethod
    def of(cls, step_id: str, config: BaseModel, *, engine: str, hint: str) -> Refusals:
        """The refusals of `engine` over a step config its schema validated (compile's, never validated again):
        the defaults are its own class's."""
        defaults = type(config)().model_dump(mode="json")
        return cls(step_id, config.model_dump(mode="json"), defaults, engine=engine, hint=hint)

    def _known(self, key: str) -> bool:
        return key in self.defaults or any(k.startswith(key + ".") for k in self.defaults)

    def __call__(self, key: str, why: str) -> None:
        # keys are named by their dotted path, which mypy cannot check: a schema rename must fail loudly here
        assert self._known(key), key
        self.problems.append(f"{key}={self.flat.get(key)!r}: {why}")

    def unless_default(self, key: str, why: str) -> None:
        # a key the schema lacks would pass silently, whatever the user set: a schema rename must fail loudly
        assert self._known(key), key
        if self.flat.get(key) != self.defaults.get(key):
            self(key, why)

    def all_unless_default(self, *keys: tuple[str, str]) -> None:
        """`unless_default` for each (key, why)."""
        for key, why in keys:
            self.unless_default(key, why)

    def raise_any(self) -> None:
        if self.problems:
            raise UserError(
                f"{self.step_id}: {self.engine} cannot express these settings", self.problems, hint=self.hint
            )


def builtin_refusals(config: BaseModel, who: str = "the built-in backend") -> list[str]:
    """Problems of a validated step config on a backend other than nemo_rl (`who`): the `nemo_rl.*` keys do
    nothing there, so a non-default value is a mistake. Empty when backend is nemo_rl, the step's schema has no
    nemo_rl group, or the group is untouched."""
    # any step's Config comes here; the RL steps' schemas and eval/policy's have `backend` and a `nemo_rl` group
    # (the RL steps' NemoRL, eval/policy's own smaller one): its defaults are its class's
    nemo = getattr(config, "nemo_rl", None)
    if engine_name(config) in READS_NEMO_RL_GROUP or not isinstance(nemo, BaseModel):
        return []
    given = dict(flatten({"nemo_rl": nemo.model_dump()}))
    default = dict(flatten({"nemo_rl": type(nemo)().model_dump()}))
    return [
        f"{key}={value!r}: only backend=nemo_rl reads it ({who} would ignore it)"
        for key, value in sorted(given.items())
        if default.get(key) != value
    ]
