"""The step catalog: load and validate manifests and the artifact type graph, find steps and presets."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
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
    tags: list[str] = Field(default_factory=list)
    entry: str = "step.py"
    schema_file: str = Field("schema.py", alias="schema")
    # python: one process; torchrun: one launcher per node, ranks under it; server: one process per node
    launch: Literal["python", "torchrun", "server"] = "python"
    # Steps this one needs running beside it (e.g. the reward server). Executors read this, never the step id.
    services: list[str] = Field(default_factory=list)
    # The names the step logs to metrics.jsonl: the one list docs are checked against (tests/foundation).
    metrics: list[str] = Field(default_factory=list)


class Consumes(_Strict):
    name: str
    type: str
    required: bool = True
    description: str = ""
    key: str = ""  # config key holding the reference; default inputs.<name>
    backend_types: dict[str, str] = {}  # backend -> the type that backend reads instead (nemo_aligner: .nemo)
    # Another input whose token ids this model is given (the policy's, for a reward model): compile refuses the
    # pair when their tokenizers differ (models.tokenizer_match).
    reads_token_ids_of: str = ""
    # Config key -> value under which this input is given decoded text instead, scored with its own tokenizer.
    text_when: dict[str, Any] = {}

    @property
    def config_key(self) -> str:
        return self.key or f"inputs.{self.name}"

    def type_on(self, backend: str) -> str:
        return self.backend_types.get(backend, self.type)


class Produces(_Strict):
    name: str
    type: str
    description: str = ""
    backend_types: dict[str, str] = {}  # backend -> the type that backend writes instead

    @property
    def config_key(self) -> str:
        return f"outputs.{self.name}"

    def type_on(self, backend: str) -> str:
        return self.backend_types.get(backend, self.type)


class Parameter(_Strict):
    key: str
    default: Any = None
    description: str = ""
    choices: list[Any] = Field(default_factory=list)


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
    consumes: list[Consumes] = Field(default_factory=list)
    produces: list[Produces] = Field(default_factory=list)
    parameters: list[Parameter] = Field(default_factory=list)
    strategies: list[Strategy] = Field(default_factory=list)
    errors: list[KnownError] = Field(default_factory=list)
    resources: dict[str, Resources] = Field(default_factory=dict)

    @field_validator("consumes", "produces")
    @classmethod
    def _unique_names(cls, v: list[Any]) -> list[Any]:
        names = [x.name for x in v]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate names {sorted(dupes)}")
        return v

    @field_validator("consumes")
    @classmethod
    def _token_ids_from_an_input(cls, v: list[Consumes]) -> list[Consumes]:
        names = {c.name for c in v}
        for c in v:
            if c.reads_token_ids_of and c.reads_token_ids_of not in names - {c.name}:
                raise ValueError(
                    f"{c.name}: reads_token_ids_of names no other input: {c.reads_token_ids_of!r}"
                )
        return v


class ArtifactType(_Strict):
    description: str = ""
    is_a: list[str] = Field(default_factory=list)
    convert_to: dict[str, str] = Field(default_factory=dict)  # target type -> how (a step id or a command)
    kind: Literal["file", "dir"] = "dir"
    suffix: str = ""  # for files
    fields: list[str] = Field(default_factory=list)  # JSONL: keys every record has
    files: list[str] = Field(default_factory=list)  # dirs: files that must exist (globs allowed)
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
        try:
            names = os.listdir(
                self.config_dir
            )  # not Path.glob: 10x faster, and `steps list` calls this per step
        except OSError:
            return []
        return sorted(n[:-5] for n in names if n.endswith(".yaml"))

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


def _read_toml(path: Path, cache: ManifestCache | None = None) -> dict[str, Any]:
    if cache is not None:
        hit = cache.get(path)
        if hit is not None:
            return hit
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: not valid TOML: {e}") from None
    if cache is not None:
        cache.put(path, data)
    return data


def cache_dir() -> Path:
    """$NEMOTRON_CACHE_DIR, else $XDG_CACHE_HOME/nemotron, else ~/.cache/nemotron."""
    explicit = os.environ.get("NEMOTRON_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "nemotron"


class ManifestCache:
    """Parsed manifest TOML keyed by path, mtime and size, in one JSON file: a catalog of 1,000 user steps is read
    without parsing 1,000 TOML files. It holds the parsed TOML, not the validated models, so every load still
    validates against this release's schema; an unreadable or unwritable cache is simply not used."""

    VERSION = 1

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_dir() / "manifests.json"
        self.entries: dict[str, dict[str, Any]] = {}
        self.used: set[str] = set()
        self.changed = False
        try:
            data = json.loads(self.path.read_text())
            if isinstance(data, dict) and data.get("version") == self.VERSION:
                self.entries = data["entries"]
        except (OSError, ValueError, KeyError, TypeError):
            pass

    @staticmethod
    def _key(path: Path) -> list[int]:
        st = path.stat()
        return [st.st_mtime_ns, st.st_size]

    def get(self, path: Path) -> dict[str, Any] | None:
        entry = self.entries.get(str(path))
        try:
            if entry is None or entry.get("key") != self._key(path):
                return None
        except OSError:
            return None
        self.used.add(str(path))
        data: dict[str, Any] = entry["toml"]
        return data

    def put(self, path: Path, data: dict[str, Any]) -> None:
        try:
            self.entries[str(path)] = {"key": self._key(path), "toml": data}
        except OSError:
            return
        self.used.add(str(path))
        self.changed = True

    def save(self) -> None:
        """Write the cache if anything was parsed anew, keeping only the files this catalog read (a removed step
        drops out). Atomic: concurrent writers leave one whole file."""
        if not self.changed and len(self.used) == len(self.entries):
            return
        keep = {p: e for p, e in self.entries.items() if p in self.used}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".manifests.")
            with os.fdopen(fd, "w") as f:
                json.dump({"version": self.VERSION, "entries": keep}, f, default=str)
            os.replace(tmp, self.path)
        except (OSError, TypeError, ValueError):
            return


def _validation_problems(e: ValidationError) -> list[str]:
    return [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]


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
                for name, raw in _read_toml(types_file, cache).items():
                    try:
                        self.types[name] = ArtifactType.model_validate(raw)
                    except ValidationError as e:
                        problems += [f"{types_file} [{name}] {p}" for p in _validation_problems(e)]
            for path in _manifest_files(root / "manifests"):
                try:
                    manifest = Manifest.model_validate(_read_toml(path, cache))
                except ValidationError as e:
                    problems += [f"{path}: {p}" for p in _validation_problems(e)]
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
                len(s.manifest.consumes),
                s.id,
            )
        )
        return [s.id for s in makers]
