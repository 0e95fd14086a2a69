"""Every `nemotron steps list` and `nemotron steps show` command that README.md and docs/ show (the generated
reference too) runs as written and prints something: the catalog's queries cannot drift from their docs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from nemotron.core.paths import bundled_root

ROOT = bundled_root()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def documented() -> list[tuple[str, str]]:
    """(page, command) for each `nemotron steps list|show ...` a page shows, up to a comment or a closing `."""
    found = []
    for page in PAGES:
        for m in re.finditer(r"nemotron (steps (?:list|show)\b[^`#|\n]*)", page.read_text()):
            command = m.group(1).strip()
            words = command.split()
            # placeholders (STEP, <type>, ...) and a benchmark table's row names are no commands to run
            if not any(w.isupper() or "<" in w or "..." in w or "," in w for w in words):
                found.append((page.relative_to(ROOT).as_posix(), command))
    return sorted(set(found))


def test_the_docs_show_each_new_filter() -> None:
    shown = " ".join(c for _, c in documented())
    for flag in ("--category", "--tag", "--consumes", "--produces", "--engine", "--tree", "--json"):
        assert flag in shown, flag


@pytest.mark.parametrize(("page", "command"), documented())
def test_a_documented_listing_runs(page: str, command: str, home: Path, run_cli: Any) -> None:
    # writing-a-step.md's commands name the example step: its root on the search path, as the page sets it
    env = {"NEMOTRON_STEPS_PATH": str(ROOT / "docs" / "examples" / "my-steps")}
    r = run_cli(*shlex.split(command), env=env)
    assert r.code == 0 and r.out.strip(), (page, command, r.err)
