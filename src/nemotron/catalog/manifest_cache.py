"""The catalog's cache of validated manifests: what makes `nemotron steps list` start without pydantic.

Validating a manifest needs pydantic and its schema, which cost about as much as importing typer; parsing the TOML
costs a millisecond a file (docs/benchmarks.md, "CLI latency"). The cache holds each file's manifest as it was
validated, keyed by the file's path, mtime and size, under the mtime and size of the module that defines what a
valid manifest is (the package's __init__.py): an edited manifest or another nemotron release validates anew. A manifest that does
not validate is never cached, so its problems are reported on every call. An unreadable or unwritable cache is
simply not used.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# the catalog package's __init__.py defines the manifest types; its (mtime, size) stands for their version.
SCHEMA_MODULE = Path(__file__).resolve().parent / "__init__.py"


def cache_dir() -> Path:
    """$NEMOTRON_CACHE_DIR, else $XDG_CACHE_HOME/nemotron, else ~/.cache/nemotron."""
    explicit = os.environ.get("NEMOTRON_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "nemotron"


def _key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_mtime_ns, st.st_size]


class ManifestCache:
    """Validated manifests (as `dataclasses.asdict` gives them) keyed by path, mtime and size, in one JSON file."""

    VERSION = 2  # 1 held the parsed TOML, which every load validated again

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_dir() / "manifests.json"
        self.entries: dict[str, dict[str, Any]] = {}
        self.used: set[str] = set()
        self.changed = False
        try:
            self.schema = _key(SCHEMA_MODULE)
        except OSError:  # no source file (a zipped install): nothing can tell a stale entry, so cache nothing
            self.schema = []
        try:
            data = json.loads(self.path.read_text())
            if (
                isinstance(data, dict)
                and data.get("version") == self.VERSION
                and self.schema
                and data.get("schema") == self.schema
            ):
                self.entries = data["entries"]
        except (OSError, ValueError, KeyError, TypeError):
            pass

    def get(self, path: Path) -> Any:
        """What was validated from `path` when it had its current mtime and size, else None."""
        entry = self.entries.get(str(path))
        try:
            if entry is None or entry.get("key") != _key(path):
                return None
        except OSError:
            return None
        self.used.add(str(path))
        return entry["validated"]

    def put(self, path: Path, validated: Any) -> None:
        """Keep what `path` validated to; a value JSON cannot hold as it is (a TOML date) is not cached."""
        if not self.schema:
            return
        try:
            json.dumps(validated)
            self.entries[str(path)] = {"key": _key(path), "validated": validated}
        except (OSError, TypeError, ValueError):
            return
        self.used.add(str(path))
        self.changed = True

    def save(self) -> None:
        """Write the cache if anything was validated anew, keeping only the files this catalog read (a removed step
        drops out). Atomic: concurrent writers leave one whole file."""
        if not self.changed and len(self.used) == len(self.entries):
            return
        from nemotron.core.atomic import write_atomic  # here, not at start-up: most calls write nothing

        keep = {p: e for p, e in self.entries.items() if p in self.used}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(
                self.path, json.dumps({"version": self.VERSION, "schema": self.schema, "entries": keep})
            )
        except OSError:
            return
