"""Binding a step's inputs: each [[consumes]] reference in the config resolved to an artifact and type-checked,
one function per kind of reference (store, path, hub, package), each returning a Binding or the Problem that
stops one. `bind_inputs` reports every problem at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, NamedTuple

from nemotron.artifacts.refs import ArtifactRef, parse_ref
from nemotron.artifacts.store import ArtifactStore
from nemotron.artifacts.typecheck import conforms, detect_type, validate_records
from nemotron.catalog import ArtifactType, Catalog, Consumes, Step
from nemotron.config.configtree import get_dotted
from nemotron.config.stepconfig import engine_name
from nemotron.config.workload import holds
from nemotron.errors import NotFound, UserError
from nemotron.models.layout import CONFIG_FILE, describe


class Binding(NamedTuple):
    """One [[consumes]] entry bound to a concrete artifact."""

    name: str
    expected_type: str
    ref: str
    kind: Literal["store", "path", "hub"]  # a package input is bound as the path it names
    path: str | None = None
    actual_type: str | None = None
    artifact_id: int | None = None
    artifact: str | None = None  # name:vN for store artifacts
    model: str | None = (
        None  # a local HF checkpoint's family, classes and parameter count (models.layout.describe)
    )


class Problem(NamedTuple):
    """Why one input cannot be bound: one line of the error that lists them all."""

    line: str


class Wanted(NamedTuple):
    """One input being bound: its [[consumes]] name and the type the config's backend reads."""

    name: str
    expected: str


def bind_inputs(
    catalog: Catalog, step: Step, config: dict[str, Any], store: ArtifactStore, remote: bool = False
) -> list[Binding]:
    """Resolve every [[consumes]] reference and check its type (is_a counts), all problems at once. The type is
    the one the config's backend reads (`backend_types` in the manifest: NeMo-Aligner reads .nemo files).

    With a remote executor, a path that does not exist here is taken to live on the cluster: bound, type unchecked."""
    bindings: list[Binding] = []
    problems: list[str] = []
    backend = engine_name(config)
    for c in step.manifest.consumes:
        want = Wanted(c.name, expected_type(catalog, c, backend, config))
        ref_text = get_dotted(config, c.config_key)
        if ref_text in (None, ""):
            if c.required:
                makers = catalog.producers_of(want.expected)
                how = f"; produce one with: nemotron steps run {makers[0]} -c tiny" if makers else ""
                problems.append(
                    f"input '{c.name}' ({want.expected}) is not set: pass {c.config_key}=REF{how}"
                )
            continue
        ref = parse_ref(str(ref_text))
        match ref.kind:
            case "store":
                bound = bind_store(catalog, store, want, ref)
            case "path":
                bound = bind_path(catalog, want, ref, remote)
            case "package":
                bound = bind_package(catalog, want, ref)
            case "hub":
                bound = bind_hub(catalog, want, ref, remote)
        if isinstance(bound, Problem):
            problems.append(bound.line)
        else:
            bindings.append(bound)
    if problems:
        raise UserError(f"cannot bind the inputs of '{step.id}':", problems)
    return bindings


def expected_type(catalog: Catalog, c: Consumes, backend: str, config: dict[str, Any]) -> str:
    """The type input `c` must have under `config`: the one its backend reads, narrowed by the first of its
    `types_when` whose settings hold and which is a kind of it (a .nemo an engine reads is not narrowed to an HF
    reward model). A narrower type that is unknown, or no kind of the input's own, is the manifest's error."""
    expected = c.type_on(backend)
    for narrower in c.types_when:
        if not catalog.is_a(narrower.type, c.type) or narrower.type not in catalog.types:
            raise UserError(
                f"input '{c.name}': types_when names {narrower.type!r}, which is no kind of its type {c.type!r} "
                f"(manifests/types.toml: {', '.join(sorted(catalog.types))})"
            )
        if catalog.is_a(narrower.type, expected) and holds(narrower.when, config):
            return narrower.type
    return expected


def bind_hub(catalog: Catalog, want: Wanted, ref: ArtifactRef, remote: bool) -> Binding | Problem:
    """A hub id (org/name) for a model: the engine downloads it, so nothing here can be checked. A file type (a
    .jsonl, a .nemo) is never a Hugging Face repository: `data/prompts.jsonl` that does not exist is a path that
    does not exist (bound as a path, with its checks), and `hf://org/name` for one is refused."""
    suffix = _file_suffix(catalog, want.expected)
    if not suffix:
        return Binding(want.name, want.expected, ref.text, "hub", path=None, actual_type=None)
    if ref.text.startswith("hf://"):
        return Problem(
            f"input '{want.name}' ({ref.text}): a {want.expected} is a file whose name ends in {suffix}, "
            "not a Hugging Face repository; give its path"
        )
    return bind_path(catalog, want, ArtifactRef("path", ref.text, path=Path(ref.text).expanduser()), remote)


def _file_suffix(catalog: Catalog, type_name: str) -> str:
    """How a file of this type (or of the type it is a kind of) ends: ".jsonl", ".nemo"; "" for directories."""
    return next((s for t in catalog.ancestors(type_name) if (s := catalog.types[t].suffix)), "")


def bind_store(catalog: Catalog, store: ArtifactStore, want: Wanted, ref: ArtifactRef) -> Binding | Problem:
    """NAME:vN, NAME:latest or NAME@ALIAS: the store knows its type, so only the path it records is checked. The
    binding keeps the version an alias pointed at when the job was bound (job.yaml: ref and artifact)."""
    try:
        art = store.resolve(ref.name, ref.version)
    except NotFound as e:
        return Problem(f"input '{want.name}': {e.message}")
    path = Path(art.path)
    if not path.exists():
        return Problem(f"input '{want.name}': artifact {art.ref} points to {path}, which no longer exists")
    if not catalog.is_a(art.type, want.expected):
        return _wrong_type(catalog, want, ref, art.type, "")
    return _described(
        Binding(want.name, want.expected, ref.text, "store", str(path), art.type, art.id, art.ref)
    )


def bind_path(catalog: Catalog, want: Wanted, ref: ArtifactRef, remote: bool) -> Binding | Problem:
    """A file or directory. One that does not exist here is, with a remote executor, taken to live on the
    cluster: bound as written, type unchecked but for its name, which must end as the type's files do (a .nemo)."""
    assert ref.path is not None
    if ref.path.exists():
        return _bind_local(catalog, want, ref, ref.path)
    if remote:
        suffix = _file_suffix(catalog, want.expected)
        if not ref.path.name.endswith(suffix):
            return Problem(
                f"input '{want.name}' ({ref.text}): a {want.expected} is a file whose name ends in {suffix}; "
                f"give the {suffix} path"
            )
        return Binding(want.name, want.expected, ref.text, "path", ref.text, None)
    return _missing(catalog, want, ref)


def bind_package(catalog: Catalog, want: Wanted, ref: ArtifactRef) -> Binding | Problem:
    """pkg://...: an artifact shipped inside the package, so it is here whatever the executor."""
    assert ref.path is not None
    if ref.path.exists():
        return _bind_local(catalog, want, ref, ref.path)
    return _missing(catalog, want, ref)


def _bind_local(catalog: Catalog, want: Wanted, ref: ArtifactRef, path: Path) -> Binding | Problem:
    """A path here, checked against the expected type's rules and, where the type has a record schema, line by
    line. A path that is recognisably another type (SFT pairs given where prompts go) is refused by type; one that
    is not (wrong fields, or a broader type such as any .nemo) has its records read first, so the error names the
    lines that are wrong rather than just "wrong type"."""
    expected = want.expected
    spec = catalog.types.get(expected)
    reason = conforms(path, spec) if spec else None
    detected = detect_type(path, catalog)
    another = (
        detected is not None and not catalog.is_a(detected, expected) and not catalog.is_a(expected, detected)
    )
    if spec is not None and not another:
        bad_records = _bad_records(want, path, spec)
        if bad_records is not None:
            return bad_records
    if reason is None and another:
        reason = f"its content is that of a {detected}"
    if reason is None:
        actual = detected if detected and catalog.is_a(detected, expected) else expected
    else:
        actual = detected or "unrecognised"
        if not catalog.is_a(actual, expected):
            return _wrong_type(catalog, want, ref, actual, f": {reason}")
    return _described(Binding(want.name, expected, ref.text, "path", str(path), actual))


def _bad_records(want: Wanted, path: Path, spec: ArtifactType) -> Problem | None:
    """The one place records are validated: the file, line and field of the first bad record."""
    try:
        validate_records(path, spec)
    except UserError as e:
        return Problem(f"input '{want.name}': {e.render()}")
    return None


def _missing(catalog: Catalog, want: Wanted, ref: ArtifactRef) -> Problem:
    makers = catalog.producers_of(want.expected)
    how = f" Produce one with: nemotron steps run {makers[0]}" if makers else ""
    return Problem(
        f"input '{want.name}': '{ref.text}' is neither an existing path nor an artifact (NAME:vN, NAME:latest, NAME@ALIAS).{how}"
    )


def _wrong_type(catalog: Catalog, want: Wanted, ref: ArtifactRef, actual: str, reason: str) -> Problem:
    spec = catalog.types.get(actual)
    hint = (
        f" (convert it with: {spec.convert_to[want.expected]})"
        if spec and want.expected in spec.convert_to
        else ""
    )
    return Problem(
        f"input '{want.name}' ({ref.text}): expected type {want.expected}, got {actual}{reason}{hint}"
    )


def _described(binding: Binding) -> Binding:
    """A local HF checkpoint carries its family, classes and size (what --dry-run and the resource plan show)."""
    if binding.path and (Path(binding.path) / CONFIG_FILE).is_file():
        return binding._replace(model=describe(Path(binding.path)))
    return binding
