"""Artifact references as users write them: `name:v3`, `name:latest`, `art://name:v3`, a path, or a hub id."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nemotron.errors import UserError
from nemotron.paths import shipped_root

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.\-]*"  # an artifact name: what `name:vN` references can reach
_STORE_REF = re.compile(rf"^(?:art://)?(?P<name>{NAME_PATTERN}):(?P<version>latest|v\d+)$")
_NAME = re.compile(rf"^{NAME_PATTERN}$")


def check_artifact_name(name: str) -> str | None:
    """Why `name` cannot be an artifact name (None if it can): letters, digits, `_`, `.` and `-`, starting with a
    letter or digit, at most 128 characters."""
    if len(name) > 128:
        return f"'{name[:40]}...' is longer than 128 characters"
    if not _NAME.match(name):
        return f"'{name}' is not an artifact name (letters, digits, _ . -, starting with a letter or digit)"
    return None


_HUB_ID = re.compile(r"^(?:hf://)?[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


@dataclass(frozen=True)
class ArtifactRef:
    kind: Literal["store", "path", "hub", "package"]
    text: str
    name: str = ""
    version: str = ""  # "latest" or "vN"
    path: Path | None = None


def parse_ref(text: str, base_dir: Path | None = None) -> ArtifactRef:
    """Classify a reference. An existing path always wins over the other readings."""
    text = text.strip()
    if not text:
        raise UserError("empty artifact reference")
    if text.startswith("pkg://"):
        # Artifacts shipped inside the package (the tiny task's), so `-c tiny` works on an empty $NEMOTRON_HOME.
        return ArtifactRef("package", text, path=shipped_root() / text.removeprefix("pkg://"))
    candidate = Path(text).expanduser()
    if not candidate.is_absolute() and base_dir is not None:
        candidate = base_dir / candidate
    if candidate.exists():
        return ArtifactRef("path", text, path=candidate.resolve())
    m = _STORE_REF.match(text)
    if m:
        return ArtifactRef("store", text, name=m["name"], version=m["version"])
    if text.startswith("art://"):
        raise UserError(f"bad artifact reference '{text}': expected art://NAME:vN or art://NAME:latest")
    if _HUB_ID.match(text) and not text.startswith((".", "/")):
        return ArtifactRef("hub", text, name=text.removeprefix("hf://"))
    return ArtifactRef("path", text, path=candidate)
