"""The step catalog: load and validate manifests and the artifact type graph, find steps and presets."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from nemotron.errors import NotFound, UserError, did_you_mean
from nemotron.paths import step_roots


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StepInfo(_Strict):
    id: str
    name: str
    description: str
    category: str
    tags: list[str] = []
    entry: str = "step.py"
    schema_file: str = Field("schema.py", alias="schema")
    # python: one process; torchrun: one launcher per node, ranks under it; server: one process per node
    launch: Literal["python", "torchrun", "server"] = "python"
    # Steps this one needs running beside it (e.g. the reward server). Executors read this, never the step id.
    services: list[str] = []
    # The names the step logs to metrics.jsonl: the one list docs are checked against (tests/foundation).
    metrics: list[str] = []


class Consumes(_Strict):
    name: str
    type: str
    required: bool = True
    description: str = ""
    key: str = ""  # config key holding the reference; default inputs.<name>

    @property
    def config_key(self) -> str:
        return self.key or f"inputs.{self.name}"


class Produces(_Strict):
    name: str
    type: str
    description: str = ""

    @property
    def config_key(self) -> str:
        return f"outputs.{self.name}"


class Parameter(_Strict):
    key: str
    default: Any = None
    description: str = ""
    choices: list[Any] = []


class Strategy(_Strict):
    when: str
    then: str


class KnownError(_Strict):
    name: str
    recovery: str
    match: str = ""  # a substring of the failure's message that identifies it
    cause: str = ""  # why it happens (docs/troubleshooting.md shows it beside the recovery)


class Resources(_Strict):
    nodes: int = 1
    gpus_per_node: int = 0
    cpus: int = 2
    time: str = "01:00:00"


class Manifest(_Strict):
    step: StepInfo
    consumes: list[Consumes] = []
    produces: list[Produces] = []
    parameters: list[Parameter] = []
    strategies: list[Strategy] = []
    errors: list[KnownError] = []
    resources: dict[str, Resources] = {}

    @field_validator("consumes", "produces")
    @classmethod
    def _unique_names(cls, v: list[Any]) -> list[Any]:
        names = [x.name for x in v]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate names {sorted(dupes)}")
        return v


class ArtifactType(_Strict):
    description: str = ""
    is_a: list[str] = []
    convert_to: dict[str, str] = {}  # target type -> how (a step id or a command)
    kind: Literal["file", "dir"] = "dir"
    suffix: str = ""  # for files
    fields: list[str] = []  # JSONL: keys every record has
    files: list[str] = []  # dirs: files that must exist (globs allowed)
    architecture_suffix: str = ""  # HF checkpoints: config.json architectures[0] ends with this
    record: str = ""  # JSONL: "module:Class", the pydantic schema every line must satisfy


@dataclass(frozen=True)
class Step:
    """A manifest plus where its code lives."""

    manifest: Manifest
    manifest_path: Path
    step_dir: Path

    @property
    def id(self) -> str:
        return self.manifest.step.id

    @property
    def entry_path(self) -> Path:
        return self.step_dir / self.manifest.step.entry

    @property
    def schema_path(self) -> Path:
        return self.step_dir / self.manifest.step.schema_file

    @property
    def config_dir(self) -> Path:
        return self.step_dir / "config"

    def presets(self) -> list[str]:
        if not self.config_dir.is_dir():
            return []
        return sorted(p.stem for p in self.config_dir.glob("*.yaml"))

    def config_schema(self) -> type[BaseModel]:
        """Import the step's pydantic Config class from its schema.py (no torch: schemas are plain pydantic)."""
        return _load_schema(self.schema_path)


@cache
def _load_schema(path: Path) -> type[BaseModel]:
    module_name = "nemotron_step_schema_" + "_".join(path.parent.parts[-3:]).replace("-", "_")
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"cannot load step schema {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    config = getattr(module, "Config", None)
    if not (isinstance(config, type) and issubclass(config, BaseModel)):
        raise UserError(f"{path}: defines no pydantic `Config` class")
    return config


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: not valid TOML: {e}") from None


def _validation_problems(e: ValidationError) -> list[str]:
    return [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]


class Catalog:
    """Every step found on the search path, plus the artifact type graph."""

    def __init__(self, roots: list[Path] | None = None) -> None:
        self.roots = roots if roots is not None else step_roots()
        self.steps: dict[str, Step] = {}
        self.types: dict[str, ArtifactType] = {}
        problems: list[str] = []
        for root in reversed(self.roots):  # earlier roots win: user steps shadow bundled ones
            types_file = root / "manifests" / "types.toml"
            if types_file.is_file():
                for name, raw in _read_toml(types_file).items():
                    try:
                        self.types[name] = ArtifactType.model_validate(raw)
                    except ValidationError as e:
                        problems += [f"{types_file} [{name}] {p}" for p in _validation_problems(e)]
            for path in sorted((root / "manifests").glob("**/*.toml")):
                if path.name == "types.toml" or "pipelines" in path.relative_to(root / "manifests").parts:
                    continue
                try:
                    manifest = Manifest.model_validate(_read_toml(path))
                except ValidationError as e:
                    problems += [f"{path}: {p}" for p in _validation_problems(e)]
                    continue
                self.steps[manifest.step.id] = Step(manifest, path, root / "steps" / manifest.step.id)
        if problems:
            raise UserError("invalid manifests:", problems)

    def get(self, step_id: str) -> Step:
        try:
            return self.steps[step_id]
        except KeyError:
            raise NotFound(
                f"unknown step '{step_id}'{did_you_mean(step_id, self.steps)}",
                hint="List the steps with: nemotron steps list",
            ) from None

    def ancestors(self, type_name: str) -> list[str]:
        """The type itself and everything it `is_a`, transitively (breadth first)."""
        seen: list[str] = []
        frontier = [type_name]
        while frontier:
            t = frontier.pop(0)
            if t in seen:
                continue
            seen.append(t)
            if t in self.types:
                frontier += self.types[t].is_a
        return seen

    def is_a(self, actual: str, expected: str) -> bool:
        return expected in self.ancestors(actual)

    def producers_of(self, type_name: str) -> list[str]:
        """Steps whose outputs satisfy this type: exact producers first, then those closest to the data."""
        makers = [
            s for s in self.steps.values() if any(self.is_a(p.type, type_name) for p in s.manifest.produces)
        ]
        makers.sort(
            key=lambda s: (
                all(p.type != type_name for p in s.manifest.produces),
                len(s.manifest.consumes),
                s.id,
            )
        )
        return [s.id for s in makers]
