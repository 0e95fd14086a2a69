"""`pip install -e '.[dev]'` (DESIGN.md's first line) is enough to collect every test module: each third-party
module a test module imports at its top level comes with the package or its `dev` extra (issue 42: two Lepton test
modules imported psutil, which only another extra brought, and pytest failed to collect them). The extras' closure
is read from pyproject.toml and the installed packages' own requirements."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
# run in their own venv (scripts/test-vllm.sh), with vLLM's own pins
OWN_VENV = ("tests/vllm/",)


def _closure(requirements: list[str], extras: set[str]) -> set[str]:
    """Normalised names of the distributions the requirements bring, transitively, with `extras` on the root."""
    seen: set[str] = set()
    todo = [(Requirement(r), extras) for r in requirements]
    while todo:
        req, active = todo.pop()
        env = [{"extra": e} for e in active] or [{"extra": ""}]
        if req.marker is not None and not any(req.marker.evaluate(e) for e in env):
            continue
        name = req.name.lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            for sub in metadata.requires(req.name) or []:
                todo.append((Requirement(sub), set(req.extras)))
        except metadata.PackageNotFoundError:
            continue
    return seen


def _top_level_imports(path: Path) -> set[str]:
    """Modules a file imports at module level, outside try blocks (an ImportError there fails collection)."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_every_test_module_imports_only_what_a_dev_install_brings() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    brought = _closure([*project["dependencies"], *project["optional-dependencies"]["dev"]], set())
    providers = metadata.packages_distributions()
    # the repo's own modules, which tests import from beside them (fixtures' fakes, scripts/), and its top-level
    # folders, which import as namespace packages (`tests.processes`); never what a venv inside the checkout holds,
    # which a fresh clone or a worktree has not
    ours = [p for p in REPO.rglob("*.py") if not p.relative_to(REPO).parts[0].startswith(".")]
    local = {p.stem for p in ours} | {p.parent.name for p in ours if p.name == "__init__.py"}
    local |= {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}
    missing = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        where = path.relative_to(REPO).as_posix()
        if where.startswith(OWN_VENV):
            continue
        for module in sorted(_top_level_imports(path)):
            if module in sys.stdlib_module_names or module in local or module == "__future__":
                continue
            dists = {d.lower().replace("_", "-") for d in providers.get(module, [])}
            if not dists & brought:
                missing.append(f"{where}: {module} ({', '.join(sorted(dists)) or 'not installed'})")
    assert missing == [], "test modules import what `pip install -e '.[dev]'` does not bring:\n" + "\n".join(
        missing
    )
