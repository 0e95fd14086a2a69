"""Record files that validated before, so that binding an input does not read the same packaged dataset line by line
through pydantic on every call (a tiny preset's dry run binds four).

An entry is the file's sha256 with the record type it was read as, under the (mtime, size) of the modules that
define a valid record (the record type's own module and data/jsonl.py, the reader): a changed file or another
nemotron release validates anew. Only files that validated are kept, so a bad file's problems are reported on every
call. The cache lives beside the manifest cache (catalog_cache.cache_dir); an unreadable or unwritable one is simply
not used.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

from nemotron.catalog.manifest_cache import cache_dir

READER = Path(__file__).resolve().parents[1] / "data" / "jsonl.py"
KEEP = (
    256  # entries kept, newest last: enough for every dataset a user binds, small enough to read in no time
)


def _stat(path: Path) -> str:
    st = path.stat()
    return f"{st.st_mtime_ns}:{st.st_size}"


class ValidatedFiles:
    """The keys of files whose every record validated, in one JSON file."""

    VERSION = 1

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_dir() / "validated_records.json"
        self.keys: list[str] = []
        try:
            data = json.loads(self.path.read_text())
            if (
                isinstance(data, dict)
                and data.get("version") == self.VERSION
                and isinstance(data["keys"], list)
            ):
                self.keys = [k for k in data["keys"] if isinstance(k, str)]
        except (OSError, ValueError, KeyError, TypeError):
            pass

    @staticmethod
    def key(file: Path, record: str) -> str | None:
        """What `file` read as `record` ("module:Class") validates to: its content, the record type and the rules'
        versions. None when any of them cannot be read (then nothing is cached)."""
        try:
            spec = importlib.util.find_spec(record.partition(":")[0])
            if spec is None or spec.origin is None:
                return None
            rules = f"{_stat(Path(spec.origin))}/{_stat(READER)}"
            digest = hashlib.sha256()
            with file.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
        except (OSError, ImportError, ValueError):
            return None
        return f"{digest.hexdigest()} {record} {rules}"

    def __contains__(self, key: str) -> bool:
        return key in self.keys

    def add(self, key: str) -> None:
        """Remember `key` (atomically: concurrent writers leave one whole file)."""
        self.keys = [*(k for k in self.keys if k != key), key][-KEEP:]
        from nemotron.core.atomic import write_atomic  # here: most calls find their files already validated

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps({"version": self.VERSION, "keys": self.keys}))
        except OSError:
            return
