"""The step catalog: load and validate manifests and the artifact type graph, find steps and presets.

The manifest types are NamedTuples, validated by pydantic (a TypeAdapter) when a manifest is read anew; the catalog
keeps what it validated in ManifestCache, so listing or showing steps builds no pydantic schema (for these eleven
types that cost about as much as importing typer). NamedTuples, not dataclasses: a frozen dataclass takes ten times
as long to define (docs/benchmarks.md, "CLI latency"). Their list and dict defaults are shared between records made
in Python without them: records are never mutated. json.dumps would write a record as a list: use `plain`."""

# ruff: noqa: RUF012  (the list and dict defaults below are NamedTuple fields' defaults, not class attributes)
from __future__ import annotations

import importlib.util
import os
import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar

from nemotron.catalog.manifest_cache import ManifestCache, cache_dir
from nemotron.core.paths import step_roots
from nemotron.errors import NotFound, UserError, did_you_mean, moved_import

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = [
    "ArtifactType",
    "Catalog",
    "InvalidManifest",
    "Manifest",
    "ManifestCache",
    "Model",
    "Step",
    "cache_dir",
    "load_schema",
    "plain",
]


class StepInfo(NamedTuple):
    id: str
    name: str
    description: str
    category: str
    tags: list[str] = []
    entry: str = "step.py"
    schema: str = "schema.py"  # the file defining the step's pydantic Config
    # python: one process; torchrun: one launcher per node, ranks under it; server: one process per node
    launch: Literal["python", "torchrun", "server"] = "python"
    # Steps this one needs running beside it (e.g. the reward server). Executors read this, never the step id.
    services: list[str] = []
    # The names the step logs to metrics.jsonl: the one list docs are checked against
    # (tests/catalog/test_metric_names.py).
    metrics: list[str] = []
    # The engines that can run the step (its config's `backend` values): engine -> the engine's own recipe for it
    # (nemo_rl = "grpo"; the built-in engine's is the step's own step.py). Engines look up their per-step
    # compilers, plan groups and preflight rules by recipe. Empty: undeclared, and `steps list --engine` reads the
    # schema's `backend` field instead (catalog_query.engines_of), which costs a pydantic import.
    engines: dict[str, str] = {}


class TypeWhen(NamedTuple):
    """An input's type under some settings: `type` (an is_a of the input's own) where every `when` key holds."""

    type: str
    when: dict[str, Any]


class Consumes(NamedTuple):
    name: str
    type: str
    required: bool = True
    description: str = ""
    key: str = ""  # config key holding the reference; default inputs.<name>
    # backend -> the type that backend reads instead (nemo_aligner: .nemo)
    backend_types: dict[str, str] = {}
    # Another input whose token ids this model is given (the policy's, for a reward model): compile refuses the
    # pair when their tokenizers differ (models.tokenizer_match).
    reads_token_ids_of: str = ""
    # Config key -> value under which this input is given decoded text instead, scored with its own tokenizer.
    text_when: dict[str, Any] = {}
    # Narrower types this input must have under some settings (rl/rlhf's judge: a reward_model_hf when judge.kind
    # is reward_model): the compiler binds it against the first whose `when` holds.
    types_when: list[TypeWhen] = []

    @property
    def config_key(self) -> str:
        return self.key or f"inputs.{self.name}"

    def type_on(self, backend: str) -> str:
        return self.backend_types.get(backend, self.type)

    def type_text(self) -> str:
        """Its type, then each narrower one with when it applies (`steps show`, the step reference)."""
        narrower = [
            f"{w.type} when {', '.join(f'{k}={v}' for k, v in w.when.items())}" for w in self.types_when
        ]
        return "; ".join([self.type, *narrower])


class Model(NamedTuple):
    """A model the step runs: the resource plan sizes it and the preflight checks it, from what is declared here."""

    # what the model is to the step: the plan names its memory and reads a `plan.models.<role>` hint by it
    role: Literal["policy", "reward_model", "judge", "critic"]
    # the [[consumes]] input whose checkpoint it loads (its config key holds the reference)
    input: str
    # trained (weights, gradients, optimizer state) or frozen (weights only)
    trained: bool = False
    # a frozen copy of it is kept as the reference policy (the KL term's)
    reference: bool = False
    # served by a server beside the trainer instead of held in the trainer's process
    served: bool = False
    # config key -> value under which it is served; unset: `served` alone decides
    served_when: dict[str, Any] = {}
    # config key -> value under which the step runs this model at all (one input, two roles: a judge's kind)
    when: dict[str, Any] = {}
    # config key of the architecture (nemotron.config.stepconfig.ModelArch) it is built from when `input` is unset
    built_from: str = ""


class Produces(NamedTuple):
    name: str
    type: str
    description: str = ""
    backend_types: dict[str, str] = {}  # backend -> the type that backend writes instead

    @property
    def config_key(self) -> str:
        return f"outputs.{self.name}"

    def type_on(self, backend: str) -> str:
        return self.backend_types.get(backend, self.type)


class Parameter(NamedTuple):
    key: str
    default: Any = None
    description: str = ""
    choices: list[Any] = []


class Strategy(NamedTuple):
    when: str
    then: str


class KnownError(NamedTuple):
    name: str
    recovery: str
    match: str = ""  # a substring of the failure's message that identifies it
    cause: str = ""  # why it happens (docs/troubleshooting.md shows it beside the recovery)


class Resources(NamedTuple):
    nodes: int = 1
    gpus_per_node: int = 0
    cpus: int = 2
    time: str = "01:00:00"


class Manifest(NamedTuple):
    step: StepInfo
    consumes: list[Consumes] = []
    produces: list[Produces] = []
    parameters: list[Parameter] = []
    strategies: list[Strategy] = []
    errors: list[KnownError] = []
    resources: dict[str, Resources] = {}
    models: list[Model] = []

    def problems(self) -> list[str]:
        """What no single field shows: names used twice, a token-id source that is no other input."""
        found = []
        for group in ("consumes", "produces"):
            names = [x.name for x in getattr(self, group)]
            dupes = {n for n in names if names.count(n) > 1}
            if dupes:
                found.append(f"{group}: Value error, duplicate names {sorted(dupes)}")
        inputs = {c.name for c in self.consumes}
        for c in self.consumes:
            if c.reads_token_ids_of and c.reads_token_ids_of not in inputs - {c.name}:
                found.append(
                    f"consumes: Value error, {c.name}: reads_token_ids_of names no other input: "
                    f"{c.reads_token_ids_of!r}"
                )
        for m in self.models:
            if m.input not in inputs:
                found.append(f"models: Value error, {m.role}: input names no [[consumes]] entry: {m.input!r}")
        return found

    @classmethod
    def from_validated(cls, data: dict[str, Any]) -> Manifest:
        """The manifest `plain` gave for one that validated (ManifestCache holds these): no validation again."""
        return cls(
            step=StepInfo(**data["step"]),
            consumes=[
                Consumes(**{**c, "types_when": [TypeWhen(**w) for w in c.get("types_when", [])]})
                for c in data["consumes"]
            ],
            produces=[Produces(**p) for p in data["produces"]],
            parameters=[Parameter(**p) for p in data["parameters"]],
            strategies=[Strategy(**s) for s in data["strategies"]],
            errors=[KnownError(**e) for e in data["errors"]],
            resources={k: Resources(**r) for k, r in data["resources"].items()},
            models=[Model(**m) for m in data["models"]],
        )


class ArtifactType(NamedTuple):
    description: str = ""
    is_a: list[str] = []
    # target type -> how (a step id or a command)
    convert_to: dict[str, str] = {}
    kind: Literal["file", "dir"] = "dir"
    suffix: str = ""  # for files
    fields: list[str] = []  # JSONL: keys every record has
    files: list[str] = []  # dirs: files that must exist (globs allowed)
    architecture_suffix: str = ""  # HF checkpoints: config.json architectures[0] ends with this
    record: str = ""  # JSONL: "module:Class", the pydantic schema every line must satisfy


class InvalidManifest(ValueError):
    """What is wrong with a manifest or a type, one `field.path: message` per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


T = TypeVar("T")


def validate(kind: type[T], raw: Any) -> T:
    """`raw` (parsed TOML) as a `kind`, checked and coerced by pydantic; InvalidManifest lists every problem. Only
    a manifest read anew gets here, so pydantic is imported here, not at start-up."""
    from pydantic import ValidationError

    try:
        value: T = _adapter(kind).validate_python(raw)
    except ValidationError as e:
        raise InvalidManifest([_problem(err) for err in e.errors()]) from None
    found = value.problems() if isinstance(value, Manifest) else []
    if found:
        raise InvalidManifest(found)
    return value


_ADAPTERS: dict[
    type[Any], Any
] = {}  # kind -> its pydantic TypeAdapter, built on the first manifest read anew


def _adapter(kind: type[Any]) -> Any:
    if kind not in _ADAPTERS:
        from pydantic import TypeAdapter

        _ADAPTERS[kind] = TypeAdapter(kind)
    return _ADAPTERS[kind]


def _problem(err: Any) -> str:
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"


def plain(value: Any) -> Any:
    """A manifest, a type or a part of one as JSON holds it: records as dicts, recursively (json.dumps alone would
    write a record as a list)."""
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


class Step(NamedTuple):
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
        return self.step_dir / self.manifest.step.schema

    @property
    def config_dir(self) -> Path:
        return self.step_dir / "config"

    def presets(self) -> list[str]:
        try:
            names = os.listdir(
                self.config_dir
            )  # not Path.glob: 10x faster, and `steps list` calls this per step
        except OSError:
            return []
        return sorted(n[:-5] for n in names if n.endswith(".yaml"))

    def config_schema(self) -> type[BaseModel]:
        """Import the step's pydantic Config class from its schema.py (no torch: schemas are plain pydantic)."""
        return load_schema(self.schema_path)


@cache
def load_schema(path: Path) -> type[BaseModel]:
    """The pydantic `Config` a step's schema.py defines (imported once per path; no torch). `Step.config_schema`
    is this for a catalogued step; a running step (`StepRun.start`) reads the one beside its step.py."""
    module_name = "nemotron_step_schema_" + "_".join(path.parent.parts[-3:]).replace("-", "_")
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"cannot load step schema {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except ImportError as e:  # a module the schema imports moved: one line naming the new one
        moved = moved_import(e)
        if moved is None:
            raise
        raise UserError(f"{path}: {moved.render()}") from None
    config = getattr(module, "Config", None)
    from pydantic import BaseModel

    if not (isinstance(config, type) and issubclass(config, BaseModel)):
        raise UserError(f"{path}: defines no pydantic `Config` class")
    return config


def _read_toml(path: Path) -> dict[str, Any]:
    import tomllib  # here, not at start-up: a cached manifest is not parsed

    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: not valid TOML: {e}") from None


def _load_types(path: Path, cache: ManifestCache, problems: list[str]) -> dict[str, ArtifactType]:
    """types.toml's types: as validated before when the file is unchanged, else validated now."""
    hit = cache.get(path)
    if hit is not None:
        return {name: ArtifactType(**spec) for name, spec in hit.items()}
    types, bad = {}, []
    for name, raw in _read_toml(path).items():
        try:
            types[name] = validate(ArtifactType, raw)
        except InvalidManifest as e:
            bad += [f"{path} [{name}] {p}" for p in e.problems]
    if not bad:
        cache.put(path, {name: plain(t) for name, t in types.items()})
    problems += bad
    return types


def _load_manifest(path: Path, cache: ManifestCache) -> Manifest:
    """A step manifest: as validated before when the file is unchanged, else validated now (InvalidManifest)."""
    hit = cache.get(path)
    if hit is not None:
        return Manifest.from_validated(hit)
    manifest = validate(Manifest, _read_toml(path))
    cache.put(path, plain(manifest))
    return manifest


def _manifest_files(manifests: Path) -> list[Path]:
    """Every step manifest under manifests/ (not types.toml, nothing under a pipelines/ dir), sorted. os.walk, not
    Path.glob("**"): a root of 1,000 user steps is listed in milliseconds."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(manifests):
        dirnames[:] = [d for d in dirnames if d != "pipelines"]
        found += [os.path.join(dirpath, f) for f in filenames if f.endswith(".toml") and f != "types.toml"]
    return sorted(Path(p) for p in found)


class Catalog:
    """Every step found on the search path, plus the artifact type graph."""

    def __init__(self, roots: list[Path] | None = None, cache: ManifestCache | None = None) -> None:
        self.roots = roots if roots is not None else step_roots()
        self.steps: dict[str, Step] = {}
        self.types: dict[str, ArtifactType] = {}
        problems: list[str] = []
        cache = cache if cache is not None else ManifestCache()
        for root in reversed(self.roots):  # earlier roots win: user steps shadow bundled ones
            types_file = root / "manifests" / "types.toml"
            if types_file.is_file():
                self.types.update(_load_types(types_file, cache, problems))
            for path in _manifest_files(root / "manifests"):
                try:
                    manifest = _load_manifest(path, cache)
                except InvalidManifest as e:
                    problems += [f"{path}: {p}" for p in e.problems]
                    continue
                self.steps[manifest.step.id] = Step(manifest, path, root / "steps" / manifest.step.id)
        cache.save()
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
                sum(c.required for c in s.manifest.consumes),  # what a user must bring first
                s.id,
            )
        )
        return [s.id for s in makers]
