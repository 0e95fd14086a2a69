"""What a valid artifact of each type contains (types.toml), checked on files before anything is submitted."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from nemotron.catalog import ArtifactType, Catalog
from nemotron.catalog.manifest_cache import cache_dir

if TYPE_CHECKING:
    from nemotron.artifacts.validated_files import ValidatedFiles


def conforms(path: Path, spec: ArtifactType) -> str | None:
    """None if `path` looks like a valid artifact of this type, else the reason it does not."""
    if spec.kind == "file":
        if not path.is_file():
            return f"{path} is not a file"
        if spec.suffix and not path.name.endswith(spec.suffix):
            return f"{path.name} does not end in {spec.suffix}"
        if spec.fields:
            first = _first_record(path)
            if first is None:
                return f"{path} has no records"
            missing = [f for f in spec.fields if f not in first]
            if missing:
                return f"its records lack {missing} (they have {sorted(first)})"
        return None
    if not path.is_dir():
        return f"{path} is not a directory"
    for pattern in spec.files:
        if not any(path.glob(pattern)):
            return f"{path} has no {pattern}"
    if spec.architecture_suffix:
        arch = _architecture(path)
        if not arch.endswith(spec.architecture_suffix):
            return f"its architecture is {arch or 'unknown'}, not *{spec.architecture_suffix}"
    return None


def validate_records(path: Path, spec: ArtifactType) -> None:
    """Read every line against the type's record schema; raises DataError naming file, line and field. A file
    whose content validated as this record type before is not read again (artifacts.validated_files)."""
    if not spec.record or not path.is_file():
        return
    import importlib

    from nemotron.artifacts.validated_files import ValidatedFiles

    seen = _validated_files(cache_dir())
    key = ValidatedFiles.key(path, spec.record)
    if key is not None and key in seen:
        return
    from nemotron.data.jsonl import read_jsonl

    module, _, name = spec.record.partition(":")
    read_jsonl(path, getattr(importlib.import_module(module), name))
    if key is not None:
        seen.add(key)


@cache
def _validated_files(where: Path) -> ValidatedFiles:
    """One cache per process and cache directory: a job binds several inputs."""
    from nemotron.artifacts.validated_files import ValidatedFiles

    return ValidatedFiles(where / "validated_records.json")


def detect_type(path: Path, catalog: Catalog) -> str | None:
    """The most specific type whose rules the path satisfies (most is_a ancestors, then most fields)."""
    fits = [
        name
        for name, spec in catalog.types.items()
        if (spec.fields or spec.files or spec.suffix) and conforms(path, spec) is None
    ]
    if not fits:
        return None
    return max(fits, key=lambda t: (len(catalog.ancestors(t)), len(catalog.types[t].fields)))


def _first_record(path: Path) -> dict[str, object] | None:
    try:
        with path.open("rb") as f:
            for raw in f:
                if raw.strip():
                    value = json.loads(raw)
                    return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}
    return None


def _architecture(path: Path) -> str:
    try:
        archs = json.loads((path / "config.json").read_text()).get("architectures") or [""]
        return str(archs[0])
    except (OSError, ValueError, AttributeError):
        return ""
