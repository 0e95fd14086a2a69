"""Checks several test files share (imported as `tests.assertions`): a command refused as the user sees it, and a
text pinned by its golden file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

UPDATE_GOLDENS = "NEMOTRON_UPDATE_GOLDENS"


def refused(r: Any, says: str, *, lines: int = 2) -> list[str]:
    """`r` (the `cli` helper's result) is a refusal: exit 2, no traceback, `says` on stderr in at most `lines`
    lines (the error, and its hint or its one problem beneath). Returns stderr's non-blank lines."""
    assert r.code == 2, (r.out, r.err[-2000:])
    assert "Traceback" not in r.err, r.err
    shown = [ln for ln in r.err.splitlines() if ln.strip()]
    assert len(shown) <= lines and says in r.err, r.err
    return shown


def matches_golden(text: str, golden: Path) -> None:
    """`text` is the golden file's, to the byte; NEMOTRON_UPDATE_GOLDENS=1 rewrites the file first (review the
    diff)."""
    if os.environ.get(UPDATE_GOLDENS) == "1":
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.is_file(), f"no golden file {golden.name}: run with {UPDATE_GOLDENS}=1 and review it"
    assert text == golden.read_text(), f"{golden.name} changed: rerun with {UPDATE_GOLDENS}=1 if intended"


class CodeRunningPickle:
    """Planted in a pickle: unpickling it runs a shell command that creates `marker` (so a test sees whether a
    loader ran it)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))
