"""Catalog queries (nemotron.catalog.query): the type rule of --consumes/--produces on a hand-made type graph, the
engines a step runs on (declared, or read from its schema), and the flow tree when steps feed each other."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from nemotron.catalog import Catalog, ManifestCache
from nemotron.catalog.query import FlowNode, Query, check, engines_of, flow, select
from nemotron.core.paths import bundled_root
from nemotron.errors import UserError

SHIPPED = Catalog([bundled_root()])

# base <- special (special is_a base); other stands apart.
TYPES = """
[base]
[special]
is_a = ["base"]
[other]
"""


def _step(root: Path, sid: str, body: str, schema: str = "class Config(Strict):\n    pass\n") -> None:
    (root / "manifests" / f"{sid}.toml").write_text(
        f'[step]\nid = "{sid}"\nname = "{sid}"\ndescription = "d"\ncategory = "c"\n' + textwrap.dedent(body)
    )
    (root / "steps" / sid).mkdir(parents=True)
    (root / "steps" / sid / "schema.py").write_text(
        "from typing import Literal\n\nfrom nemotron.config.stepconfig import Strict\n\n\n" + schema
    )


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    """reads_base takes any base (special too), reads_special only a special; makes_* make one of each."""
    root = tmp_path / "root"
    (root / "manifests").mkdir(parents=True)
    (root / "manifests" / "types.toml").write_text(TYPES)
    _step(root, "reads_base", '[[consumes]]\nname = "x"\ntype = "base"\n')
    _step(root, "reads_special", '[[consumes]]\nname = "x"\ntype = "special"\n')
    _step(root, "makes_base", '[[produces]]\nname = "y"\ntype = "base"\n')
    _step(root, "makes_special", '[[produces]]\nname = "y"\ntype = "special"\n')
    # on engine "far" this step reads an `other` instead; its schema's backend field names the engines
    _step(root, "reads_other_far", '[[consumes]]\nname = "x"\ntype = "base"\nbackend_types = { far = "other" }\n',
          'class Config(Strict):\n    backend: Literal["builtin", "far"] = "builtin"\n')  # fmt: skip
    return Catalog([root], ManifestCache(tmp_path / "cache.json"))


def _ids(catalog: Catalog, **query: str) -> list[str]:
    q = Query(**query)
    check(catalog, q)
    return [s.id for s in select(catalog, q)]


def test_consumes_lists_the_inputs_that_would_accept_the_type(catalog: Catalog) -> None:
    # a special is accepted where a base is read; a base is not where a special must be
    assert _ids(catalog, consumes="special") == ["reads_base", "reads_other_far", "reads_special"]
    assert _ids(catalog, consumes="base") == ["reads_base", "reads_other_far"]


def test_produces_lists_the_outputs_usable_as_the_type(catalog: Catalog) -> None:
    assert _ids(catalog, produces="base") == ["makes_base", "makes_special"]
    assert _ids(catalog, produces="special") == ["makes_special"]


def test_an_engines_own_type_counts_on_that_engine_only(catalog: Catalog) -> None:
    assert _ids(catalog, consumes="other") == ["reads_other_far"]  # on some engine it reads an `other`
    assert _ids(catalog, consumes="other", engine="far") == ["reads_other_far"]
    assert _ids(catalog, consumes="other", engine="builtin") == []
    assert _ids(catalog, consumes="base", engine="far") == []  # there it reads an `other`, and reads_base
    assert _ids(catalog, consumes="base", engine="builtin") == [
        "reads_base",
        "reads_other_far",
    ]  # runs nowhere else


def test_engines_come_from_the_schema_when_the_manifest_declares_none(catalog: Catalog) -> None:
    assert engines_of(catalog.get("reads_other_far")) == ("builtin", "far")  # the backend field's Literal
    assert engines_of(catalog.get("reads_base")) == (
        "builtin",
    )  # no backend field: the schema refuses any other
    assert _ids(catalog, engine="far") == ["reads_other_far"]


@pytest.mark.parametrize("step_id", sorted(SHIPPED.steps))
def test_a_shipped_manifests_engines_are_the_backends_its_schema_accepts(step_id: str) -> None:
    """The declaration (read by `steps list` without pydantic) cannot drift from what compile accepts, and names
    only registered engines."""
    from nemotron.engines.base import ENGINES

    step = SHIPPED.get(step_id)
    declared = engines_of(step)
    assert declared, f"{step_id} declares no engines"
    undeclared = step._replace(manifest=step.manifest._replace(step=step.manifest.step._replace(engines=[])))
    assert engines_of(undeclared) == declared
    assert set(declared) <= set(ENGINES)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (Query(category="cc"), "unknown category 'cc' (did you mean 'c'?)"),
        (Query(tag="x"), "unknown tag 'x'; known: "),
        (Query(consumes="specal"), "unknown artifact type 'specal' (did you mean 'special'?)"),
        (Query(produces="nope"), "unknown artifact type 'nope'; known: base, other, special"),
        (Query(engine="fra"), "no step runs on engine 'fra' (did you mean 'far'?); engines: builtin, far"),
    ],
)
def test_an_unknown_value_is_one_line_with_what_exists(catalog: Catalog, query: Query, message: str) -> None:
    with pytest.raises(UserError) as e:
        check(catalog, query)
    assert message in str(e.value) and "\n" not in str(e.value)


def _tree(nodes: list[FlowNode], depth: int = 0) -> list[tuple[int, str, str]]:
    out = []
    for n in nodes:
        out.append((depth, n.step.id, n.via.source if n.via else ""))
        out += _tree(n.children, depth + 1)
    return out


def test_the_flow_places_each_step_once_at_its_earliest_stage(catalog: Catalog) -> None:
    steps = select(catalog, Query())
    # makes_special is preferred for reads_special (the exact type); reads_base takes the exact maker too
    assert _tree(flow(catalog, steps)) == [
        (0, "makes_base", ""),
        (1, "reads_base", "makes_base"),
        (1, "reads_other_far", "makes_base"),
        (0, "makes_special", ""),
        (1, "reads_special", "makes_special"),
    ]


def test_steps_that_feed_each_other_stand_once(tmp_path: Path) -> None:
    """Two steps each reading what the other makes (as rl/* do): the first by id starts the tree, its input given."""
    root = tmp_path / "root"
    (root / "manifests").mkdir(parents=True)
    (root / "manifests" / "types.toml").write_text(TYPES)
    loop = '[[consumes]]\nname = "x"\ntype = "base"\n[[produces]]\nname = "y"\ntype = "base"\n'
    for sid in ("a", "b", "c"):
        _step(root, sid, loop)
    catalog = Catalog([root], ManifestCache(tmp_path / "cache.json"))
    nodes = flow(catalog, select(catalog, Query()))
    assert _tree(nodes) == [(0, "a", ""), (1, "b", "a"), (1, "c", "a")]
    assert [(f.input, f.type, f.source) for f in nodes[0].also] == [("x", "base", "")]
