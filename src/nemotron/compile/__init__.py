"""The ONE place of config precedence: schema defaults < preset chain < profile < CLI dotlist.

`compile_job` composes the config, records where each key came from, validates it strictly against the step's
schema (every error at once, with did-you-mean), binds and type-checks the inputs (`artifacts.binding`), and returns
a frozen Job.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Generic, Literal

import yaml
from pydantic import BaseModel, ValidationError
from typing_extensions import TypeVar

from nemotron.artifacts.binding import Binding, bind_inputs
from nemotron.artifacts.refs import check_artifact_name
from nemotron.artifacts.store import ArtifactStore, open_store
from nemotron.catalog import Catalog, Resources, Step
from nemotron.compile import preflight
from nemotron.config.configtree import (
    deep_merge,
    flatten,
    get_dotted,
    resolve_interpolations,
    unflatten,
)
from nemotron.config.profiles import AnyProfile, implicit_profile, load_profile, runs_here
from nemotron.config.stepconfig import engine_name
from nemotron.config.workload import JobModel, job_models
from nemotron.core.paths import artifacts_dir
from nemotron.core.redact import MASK, is_secret_name, redact_url_passwords
from nemotron.errors import NotFound, UserError, did_you_mean
from nemotron.models.tokenizer_match import check_token_ids_meet
from nemotron.reward.bind import refuse_open_servers
from nemotron.runtime.resume import choose_resume

# The profile class a Job runs on: each executor takes Job[its own profile class], which its registry
# (nemotron.launch.executor) hands it; a bare `Job` is any profile's. (typing_extensions: TypeVar's default before 3.13)
ProfileT = TypeVar("ProfileT", bound=AnyProfile, default=AnyProfile, covariant=True)


@dataclass(frozen=True)
class Job(Generic[ProfileT]):
    """A step compiled for a profile: its config validated once, its inputs bound, its outputs named; what the
    engine, the plan and the executor read. (A docstring of its own: without one, defining the class builds its
    signature for `__doc__`, on the CLI's start-up path.)"""

    job_id: str
    step_id: str
    preset: str
    entry: str
    launch: str
    # the step's config as its schema validated it, once, at compile (inputs as the user wrote them): every later
    # stage reads it, or a form derived from it below, and none validates it again
    config: BaseModel
    backend: str  # the engine that runs the job: config's `backend`, builtin for steps without one
    sources: dict[str, str]  # dotted key -> "preset:tiny" | "profile:NAME" | "cli" (defaults omitted)
    bindings: tuple[Binding, ...]
    input_keys: dict[
        str, str
    ]  # input name -> the config key holding its reference (the manifest's [[consumes]])
    outputs: dict[str, tuple[str, str]]  # output name -> (artifact name, type)
    profile: ProfileT
    resources: Resources
    mode: Literal["attached", "batch"]
    # the artifact store the inputs were bound in: their ids are its own, so submit holds them there
    store: ArtifactStore = field(repr=False, compare=False)
    # the catalog the job was compiled against: the plan and the executors read its types and manifest from it,
    # never from a catalog read again
    catalog: Catalog = field(repr=False, compare=False)
    passthrough: tuple[str, ...] = ()
    force_squash: bool = False
    services: tuple[str, ...] = ()
    models: tuple[JobModel, ...] = ()  # what the manifest's [[models]] declare, under this job's config
    argv: tuple[str, ...] = field(default_factory=tuple)
    warnings: tuple[
        str, ...
    ] = ()  # what a dry-run let through that a submit would refuse (absent input paths)
    notes: tuple[
        str, ...
    ] = ()  # what compile chose for the user that they must hear of (an automatic resume)

    @cached_property
    def config_tree(self) -> dict[str, Any]:
        """`config` as plain JSON data, inputs as written: what the job record, the hash and a dry run show."""
        return self.config.model_dump(mode="json")

    @cached_property
    def step_model(self) -> BaseModel:
        """`config` with each bound input's reference replaced by its resolved path: what the step and the
        external engines read. Copied field by field from the validated config, not validated again."""
        return with_inputs(self.config, self.input_keys, self.bindings)

    @cached_property
    def step_config(self) -> dict[str, Any]:
        """`step_model` as plain JSON data: the config.yaml the step reads."""
        return self.step_model.model_dump(mode="json")

    @property
    def config_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.config_tree, sort_keys=True, default=str).encode()).hexdigest()[
            :16
        ]


def with_inputs(config: BaseModel, input_keys: Mapping[str, str], bindings: Sequence[Binding]) -> BaseModel:
    """`config` with the value at each binding's config key replaced by its path (its reference when it has
    none): nested models are copied (`model_copy`, which does not validate), nested mappings rebuilt."""
    for b in bindings:
        config = _replaced(config, input_keys[b.name].split("."), b.path or b.ref)
    return config


def _replaced(node: Any, path: list[str], value: Any) -> Any:
    head, rest = path[0], path[1:]
    if isinstance(node, BaseModel):
        child = getattr(node, head)
        return node.model_copy(update={head: _replaced(child, rest, value) if rest else value})
    tree = dict(node) if isinstance(node, Mapping) else {}  # a mapping, or a key set under an absent one
    tree[head] = _replaced(tree.get(head), rest, value) if rest else value
    return tree


def new_job_id(step_id: str) -> str:
    return f"{step_id.replace('/', '-')}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


# ----------------------------------------------------------------------------- presets


# libyaml's parser where PyYAML has it (the same safe constructor and resolver, in C): a preset parses in a tenth of
# the time. A file it refuses is parsed again by PyYAML's own parser, whose line, column and problem are the message.
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# How many values a preset may hold once its aliases are expanded (a few MB): `*a` repeated nine times a level
# for nine levels is a few hundred bytes of YAML and a billion values, which merging the config would expand.
MAX_YAML_VALUES = 100_000


def _unique_keys(loader: type[Any]) -> type[Any]:
    """`loader` that refuses a key given twice in one mapping (YAML would keep the last silently): the error names
    the line of both. Keys merged in with `<<` may repeat, as YAML means them to."""

    class UniqueKeys(loader):  # type: ignore[misc]
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, str | int | float | bool) and key in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"key {key!r} given twice (first on line {seen[key]})",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line + 1
            return dict(super().construct_mapping(node, deep=deep))

    return UniqueKeys


_LOADERS = (_unique_keys(_FAST_LOADER), _unique_keys(yaml.SafeLoader))


def _expanded_values(data: Any, limit: int) -> int:
    """How many values `data` holds with every alias expanded, counting up to just past `limit` (shared objects are
    counted once per use, without walking them again)."""
    sizes: dict[int, int] = {}

    def size(obj: Any) -> int:
        if id(obj) in sizes:
            return sizes[id(obj)]
        children = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else ()
        total = 1
        for child in children:
            total += size(child)
            if total > limit:
                break
        sizes[id(obj)] = total
        return total

    return size(data)


def _yaml_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
        try:
            data = yaml.load(text, Loader=_LOADERS[0])
        except yaml.YAMLError:
            data = yaml.load(text, Loader=_LOADERS[1])  # a SafeLoader
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise UserError(f"{path}{where}: malformed YAML: {e.problem}") from None
    except yaml.YAMLError as e:
        raise UserError(f"{path}: malformed YAML: {e}") from None
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: a preset must be a mapping of config keys, got {type(data).__name__}")
    if _expanded_values(data, MAX_YAML_VALUES) > MAX_YAML_VALUES:
        raise UserError(
            f"{path}: its aliases expand to more than {MAX_YAML_VALUES:,} values; a preset is a few keys"
        )
    return data


def preset_path(step: Step, preset: str) -> Path:
    """`-c` takes a preset name (config/NAME.yaml beside the step) or a path to a YAML file."""
    if preset.endswith((".yaml", ".yml")) or "/" in preset:
        p = Path(preset).expanduser()
        if p.is_dir():
            raise UserError(
                f"-c {preset}: {p} is a directory; -c takes a preset name ({', '.join(step.presets())}) or a YAML file"
            )
        if not p.is_file():
            raise NotFound(f"preset file {p} does not exist")
        return p.resolve()
    p = step.config_dir / f"{preset}.yaml"
    if not p.is_file():
        raise NotFound(
            f"step '{step.id}' has no preset '{preset}'{did_you_mean(preset, step.presets())}; presets: {', '.join(step.presets()) or 'none'}"
        )
    return p


def load_preset_chain(
    path: Path, chain: tuple[Path, ...] = (), step_presets: Path | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """[(label, tree)] from the deepest `defaults:` ancestor to `path` itself. A parent named in `defaults:` is
    looked up beside the file first, then among the step's shipped presets (`step_presets`), so a user's own
    preset file can extend `tiny` or `default`."""
    if path in chain:
        raise UserError(f"preset `defaults:` cycle: {' -> '.join(p.name for p in (*chain, path))}")
    data = _yaml_file(path)
    parents = data.pop("defaults", []) or []
    if isinstance(parents, str):
        parents = [parents]
    layers: list[tuple[str, dict[str, Any]]] = []
    for parent in parents:
        name = str(parent) if str(parent).endswith((".yaml", ".yml")) else f"{parent}.yaml"
        places = [path.parent / name] + ([step_presets / name] if step_presets is not None else [])
        found = next((p for p in places if p.is_file()), None)
        if found is None:
            raise NotFound(
                f"{path}: `defaults:` names '{parent}', which is in none of: {', '.join(str(p.parent) for p in places)}"
            )
        layers += load_preset_chain(found.resolve(), (*chain, path), step_presets)
    layers.append((f"preset:{path.stem}", unflatten(data)))
    return layers


# ----------------------------------------------------------------------------- validation


def parse_dotlist(items: list[str]) -> dict[str, Any]:
    if not items:
        return {}  # and OmegaConf stays unimported
    bad = [i for i in items if "=" not in i or not i.split("=", 1)[0]]
    if bad:
        raise UserError(
            "overrides must look like key=value:",
            [f"'{b}'" for b in bad],
            hint="Arguments for the step itself go after `--`.",
        )
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    problems = []
    for item in items:  # one at a time, so every malformed value is named
        try:
            OmegaConf.from_dotlist([item])
        except (OmegaConfBaseException, yaml.YAMLError) as e:
            problems.append(f"'{item}': {str(e).splitlines()[0]}")
    if problems:
        raise UserError(
            "cannot parse overrides (values are YAML: quote a string that holds [ ] { } or quotes):", problems
        )
    tree = OmegaConf.to_container(OmegaConf.from_dotlist(items), resolve=False)
    assert isinstance(tree, dict)
    return {str(k): v for k, v in tree.items()}


def validate_config(
    step_id: str, schema: type[BaseModel], tree: dict[str, Any], sources: dict[str, str]
) -> BaseModel:
    try:
        return schema.model_validate(tree)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = [str(p) for p in err["loc"]]
            key = ".".join(loc)
            src = sources.get(key)
            origin = f" [from {src}]" if src else ""
            if err["type"] == "extra_forbidden":
                # here, not at the top: it reads the schema's source, which only a refusal needs
                from nemotron.config.fields import unknown_key_hint

                hint = unknown_key_hint(schema, loc, err["input"])
                shown = (
                    MASK if is_secret_name(loc[-1]) else cut(repr(err["input"]))
                )  # a token typed where none belongs
                problems.append(f"{key}: unknown key (value {shown}){origin}{hint}")
            elif not loc:  # a rule across groups: its message names the keys; the input is the whole config
                problems.append(str(err["msg"]).removeprefix("Value error, "))
            elif err["type"] == "value_error" and isinstance(err["input"], dict):
                # a rule across one group's keys: its message names them; the input is the whole group
                problems.append(f"{key}: {str(err['msg']).removeprefix('Value error, ')}{origin}")
            else:
                value = (
                    ""
                    if err["type"] == "missing"
                    # `key=` on the command line is YAML's null, not an empty string: say what the user typed
                    else f" (got nothing: `{key}=` with no value)"
                    if err["input"] is None and src == "cli"
                    else f" (got {cut(redact_url_passwords(repr(err['input'])))})"
                )
                problems.append(f"{key}: {err['msg']}{value}{origin}")
        raise UserError(f"invalid config for step '{step_id}':", problems) from None


def cut(text: str, most: int = 200) -> str:
    """A value as an error message shows it: its first `most` characters and how many more there are."""
    return text if len(text) <= most else f"{text[:most]}... ({len(text) - most:,} more characters)"


# ----------------------------------------------------------------------------- the job


def compose_config(
    step: Step, preset: str, overrides: list[str], profile: AnyProfile | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """Merge schema defaults < preset chain < profile < CLI, resolve interpolations, validate strictly.
    Returns the validated config (plain data) and the source of every key not left at its default."""
    _, config, sources = _compose(step, preset, overrides, profile)
    return config, sources


def _groups_innermost_first(model: Any, seen: set[type[BaseModel]]) -> typing.Iterator[type[BaseModel]]:
    """The config groups (pydantic models) in a field's type, each after the groups it holds. Built in this order,
    pydantic (defer_build) makes each group's schema once and reuses it in its holder; built from the top, each was
    made again when its default was first made (about a third of a dry run's validation)."""
    for arg in typing.get_args(model):
        yield from _groups_innermost_first(arg, seen)
    if isinstance(model, type) and issubclass(model, BaseModel) and model not in seen:
        seen.add(model)
        for f in model.model_fields.values():
            yield from _groups_innermost_first(f.annotation, seen)
        yield model


def _compose(
    step: Step, preset: str, overrides: list[str], profile: AnyProfile | None
) -> tuple[BaseModel, dict[str, Any], dict[str, str]]:
    """compose_config, with the validated config object itself first."""
    schema = step.config_schema()
    for group in _groups_innermost_first(schema, set()):
        group.model_rebuild(raise_errors=False)
    layers: list[tuple[str, dict[str, Any]]] = [("default", schema().model_dump(mode="json"))]
    layers += load_preset_chain(preset_path(step, preset), step_presets=step.config_dir)
    if profile is not None and profile.config:
        layers.append((f"profile:{profile.name}", profile.config))
    cli = parse_dotlist(overrides)
    if cli:
        layers.append(("cli", cli))

    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    touched: dict[str, str] = {}  # every prefix of a set key -> the last layer that set something under it
    for label, tree in layers:
        merged = deep_merge(merged, tree)
        if label != "default":
            for key, _ in flatten(tree):
                sources[key] = label
                parts = key.split(".")
                touched.update({".".join(parts[:i]): label for i in range(1, len(parts) + 1)})
    resolved = resolve_interpolations(merged)
    validated = validate_config(step.id, schema, resolved, touched)
    return validated, validated.model_dump(mode="json"), sources


def compile_job(
    catalog: Catalog,
    step_id: str,
    preset: str,
    overrides: list[str] | None = None,
    profile_name: str | None = None,
    mode: Literal["attached", "batch"] = "attached",
    passthrough: list[str] | None = None,
    force_squash: bool = False,
    argv: list[str] | None = None,
    store: ArtifactStore | None = None,
    dry_run: bool = False,
) -> Job:
    """The job for `step_id`. A dry-run binds input paths that do not exist here (as a remote profile does) and
    lists them in `Job.warnings`, since a dry-run is how a user looks at a job before copying its data."""
    step = catalog.get(step_id)
    profile = load_profile(profile_name) if profile_name else implicit_profile()
    validated, config, sources = _compose(step, preset, overrides or [], profile)
    store = store or open_store(
        Path(profile.artifacts_root).expanduser() if profile.artifacts_root else artifacts_dir()
    )
    here = runs_here(profile)  # remote profiles' paths live on their cluster
    refuse_open_servers(
        step.config_schema(), config, env_vars=profile.env_vars, here=here, profile=profile.name
    )
    bindings = bind_inputs(catalog, step, config, store, remote=not here or dry_run)
    preflight.check(catalog, step.manifest, validated, profile, bindings)  # parallelism, loadable inputs
    warnings = tuple(
        f"input '{b.name}': {b.ref} does not exist here; running this job would refuse it"
        for b in bindings
        if here and b.kind == "path" and b.path and not Path(b.path).exists()
    )
    input_keys = {c.name: c.config_key for c in step.manifest.consumes}
    step_config = with_inputs(validated, input_keys, bindings).model_dump(mode="json")
    check_token_ids_meet(step.manifest.consumes, config, bindings)
    notes = choose_resume(step.id, validated, config, sources, bindings, here)
    backend = engine_name(config)
    outputs = {
        # a step whose config has no such key registers the output under its own name; an empty one is refused below
        p.name: (
            str(p.name if (named := get_dotted(config, p.config_key)) is None else named),
            p.type_on(backend),
        )
        for p in step.manifest.produces
    }
    bad_names = [
        f"{p.config_key}: {why}"
        for p in step.manifest.produces
        if (why := check_artifact_name(outputs[p.name][0])) is not None
    ]
    if bad_names:
        raise UserError(
            "invalid output names (a name:vN reference must be able to reach each output):", bad_names
        )
    preset_name = Path(preset).stem
    return Job(
        job_id=new_job_id(step.id),
        step_id=step.id,
        preset=preset_name,
        entry=str(step.entry_path),
        launch=step.manifest.step.launch,
        config=validated,
        backend=backend,
        sources=sources,
        bindings=tuple(bindings),
        input_keys=input_keys,
        outputs=outputs,
        profile=profile,
        resources=step.manifest.resources.get(preset_name, Resources()),
        mode=mode,
        store=store,
        catalog=catalog,
        passthrough=tuple(passthrough or ()),
        force_squash=force_squash,
        services=tuple(step.manifest.step.services),
        models=job_models(step.manifest.models, input_keys, step_config),
        argv=tuple(argv or ()),
        warnings=warnings,
        notes=notes,
    )
