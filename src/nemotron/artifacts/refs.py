"""Artifact references as users write them: `name:v3`, `name:latest`, `name@best` (an alias), `art://name:v3`, a
path, or a hub id."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, NamedTuple

from nemotron.core.paths import shipped_root
from nemotron.errors import UserError

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.\-]*"  # an artifact name: what `name:vN` references can reach
# An alias is written NAME@ALIAS: `@` is in no artifact name, so the reference cannot be read as a name, a version
# or a hub id; and since an alias may not look like a version (vN, latest), `name@x` and `name:x` never mean the
# same artifact by accident.
ALIAS_PATTERN = r"[A-Za-z][A-Za-z0-9_\-]*"
_STORE_REF = re.compile(
    rf"^(?:art://)?(?P<name>{NAME_PATTERN})(?::(?P<version>latest|v\d+)|@(?P<alias>[^@:/]+))$"
)
_NAME = re.compile(NAME_PATTERN)  # fullmatch: `$` would let a trailing newline through
_ALIAS = re.compile(ALIAS_PATTERN)
_VERSION_LIKE = re.compile(r"latest|v\d+", re.IGNORECASE)


def check_artifact_name(name: str) -> str | None:
    """Why `name` cannot be an artifact name (None if it can): letters, digits, `_`, `.` and `-`, starting with a
    letter or digit, at most 128 characters."""
    if len(name) > 128:
        return f"{name[:40] + '...'!r} is longer than 128 characters"
    if not _NAME.fullmatch(name):
        return f"{name!r} is not an artifact name (letters, digits, _ . -, starting with a letter or digit)"
    return None


def check_alias_name(alias: str) -> str | None:
    """Why `alias` cannot be an alias (None if it can): letters, digits, `_` and `-`, starting with a letter, at
    most 64 characters, and nothing a version is written as (`latest` is every name's implicit alias, `v3` a
    version)."""
    if _VERSION_LIKE.fullmatch(alias):
        return f"{alias!r} is reserved: `latest` and vN name versions, not aliases"
    if len(alias) > 64:
        return f"alias {alias[:40] + '...'!r} is longer than 64 characters"
    if not _ALIAS.fullmatch(alias):
        return f"{alias!r} is not an alias name (letters, digits, _ -, starting with a letter)"
    return None


_HUB_ID = re.compile(r"^(?:hf://)?[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


class ArtifactRef(NamedTuple):
    """An input as the user referred to it: a store name and version, a path, a hub id or a shipped pkg:// one."""

    kind: Literal["store", "path", "hub", "package"]
    text: str
    name: str = ""
    version: str = ""  # which version of `name`: "latest", "vN", or "@ALIAS" (the one its alias points at)
    path: Path | None = None

    @property
    def alias(self) -> str:
        """The alias a `NAME@ALIAS` reference goes through ("" for any other reference)."""
        return self.version.removeprefix("@") if self.version.startswith("@") else ""


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
    if m and m["alias"] is not None:
        if m["alias"] == "latest":  # every name's implicit alias
            return ArtifactRef("store", text, name=m["name"], version="latest")
        if re.fullmatch(r"v\d+", m["alias"]):
            raise UserError(f"bad artifact reference {text!r}: a version is written {m['name']}:{m['alias']}")
        why = check_alias_name(m["alias"])
        if why is not None:
            raise UserError(f"bad artifact reference {text!r}: {why}")
        return ArtifactRef("store", text, name=m["name"], version="@" + m["alias"])
    if m:
        return ArtifactRef("store", text, name=m["name"], version=m["version"])
    if text.startswith("art://"):
        raise UserError(
            f"bad artifact reference {text!r}: expected art://NAME:vN, art://NAME:latest or art://NAME@ALIAS"
        )
    if _HUB_ID.match(text) and not text.startswith((".", "/")):
        return ArtifactRef("hub", text, name=text.removeprefix("hf://"))
    return ArtifactRef("path", text, path=candidate)


def store_ref(text: str) -> ArtifactRef:
    """A reference as the `artifacts` commands take it: NAME:vN, NAME:latest, NAME@ALIAS, art://..., or a bare NAME
    for its latest version. Anything else (a path, a hub id) is refused."""
    bare = ":" not in text and "@" not in text and not text.startswith("art://")
    ref = parse_ref(f"{text}:latest" if bare else text)
    if ref.kind != "store":
        raise UserError(
            f"{text!r} is not an artifact reference (NAME:vN, NAME:latest, NAME@ALIAS or art://NAME:vN)"
        )
    return ref
