"""docs/writing-a-step.md shows the example step docs/examples/my-steps as it is: every file of the example stands
on the page, byte for byte, in a block that writes it (`file=my-steps/...`, so the page's runnable blocks run the
code the page shows), and the example keeps the rules the page states."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemotron.catalog import Catalog, ManifestCache
from nemotron.catalog.query import engines_of
from nemotron.config.configtree import get_dotted
from nemotron.core.paths import bundled_root
from nemotron.docs.blocks import parse_blocks

ROOT = bundled_root()
PAGE = ROOT / "docs" / "writing-a-step.md"
EXAMPLE = ROOT / "docs" / "examples" / "my-steps"


def shown(page: Path) -> dict[str, str]:
    """The files a page writes under my-steps/: path below my-steps -> the text shown."""
    return {
        b.file.removeprefix("my-steps/"): b.text
        for b in parse_blocks(page)
        if b.file is not None and b.file.startswith("my-steps/")
    }


# The step the page walks through, file by file; the example's rl/rloo_lite (a step that loads models) is shown in
# excerpts in the page's section 5 and checked by tests/plan/test_user_step_models.py.
WALKED_THROUGH = ("manifests/data/filter.toml", "steps/data/filter/")


def example_files() -> dict[str, str]:
    return {
        name: p.read_text()
        for p in sorted(EXAMPLE.rglob("*"))
        if p.is_file()
        and "__pycache__" not in p.parts
        and (name := p.relative_to(EXAMPLE).as_posix()).startswith(WALKED_THROUGH)
    }


def test_the_page_shows_every_file_of_the_example_as_it_is() -> None:
    page, files = shown(PAGE), example_files()
    assert sorted(page) == sorted(files), "the page and docs/examples/my-steps show different files"
    for name, text in files.items():
        assert page[name] == text, f"docs/writing-a-step.md shows {name} otherwise than the example has it"


def test_a_drifted_file_is_caught(tmp_path: Path) -> None:
    """The comparison above sees one changed character: a page whose manifest says max_words 9 differs."""
    page = tmp_path / "p.md"
    page.write_text(PAGE.read_text().replace("default = 8", "default = 9", 1))
    assert shown(page)["manifests/data/filter.toml"] != example_files()["manifests/data/filter.toml"]


@pytest.fixture(scope="module")
def example() -> Catalog:
    return Catalog([EXAMPLE, ROOT], ManifestCache(Path("/nonexistent/cache.json")))


def test_the_examples_parameters_have_the_schemas_defaults(example: Catalog) -> None:
    """What the page asks of every step: a [[parameters]] default equals the schema's (`steps show` prints it)."""
    step = example.get("data/filter")
    defaults = step.config_schema()().model_dump(mode="json")
    assert step.manifest.parameters, "the example shows no parameter"
    for p in step.manifest.parameters:
        assert get_dotted(defaults, p.key) == p.default, p.key


def test_the_examples_engines_are_what_its_schema_accepts(example: Catalog) -> None:
    step = example.get("data/filter")
    assert step.manifest.step.engines == {"builtin": "step.py"}
    undeclared = step.manifest._replace(step=step.manifest.step._replace(engines={}))
    assert engines_of(type(step)(undeclared, step.manifest_path, step.step_dir)) == ("builtin",)


def test_the_page_names_every_step_field_it_should() -> None:
    """The manifest fields a step author meets, each explained on the page."""
    from nemotron.catalog import Consumes, StepInfo

    text = PAGE.read_text()
    for name in (*StepInfo._fields, *Consumes._fields):
        assert f"`{name}`" in text, f"docs/writing-a-step.md never names `{name}`"
    assert "[resources." in text and "`plan`" in text and "must equal the schema's default" in text
