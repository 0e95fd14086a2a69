"""Catalog queries: the steps `nemotron steps list` filters (category, tag, artifact types, engine), the engines a
step runs on, and the flow of artifact types between steps that `steps list --tree` draws. Pure functions of a
Catalog: no rich, and no pydantic unless a step leaves its engines undeclared.

The type rule, the one the compiler applies when it binds an input (`is_a` counts, from the artifact up):
- `--consumes T`: the steps with an input that would accept an artifact of type T, that is an input whose type is T
  or an ancestor of T. A reward_model_hf is accepted where a checkpoint_hf is read, so `--consumes reward_model_hf`
  lists every step reading a checkpoint_hf; `--consumes checkpoint_hf` does not list a step whose only such input
  must be a reward model.
- `--produces T`: the steps with an output usable where T is expected, that is an output whose type is T or one of
  its descendants (rm/train's reward_model_hf is a checkpoint_hf).
An input or output that reads or writes another type on some engine (`backend_types`) matches on any of its types,
or, with `--engine`, on that engine's type only.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable
from dataclasses import dataclass, field

from nemotron.catalog import Catalog, Consumes, Produces, Step
from nemotron.errors import UserError, did_you_mean


def engines_of(step: Step) -> tuple[str, ...]:
    """The engines (config `backend` values) that can run `step`: what its manifest declares (`engines`), else what
    its schema's `backend` field accepts (a Literal), else the built-in engine alone (a step without the field has
    no other: its schema refuses the key). The fallback imports the schema, hence pydantic: declare `engines`."""
    if step.manifest.step.engines:
        return tuple(step.manifest.step.engines)
    # a step still being written: `steps show` lists it, nothing can run it yet
    if not step.schema_path.is_file():
        return ("builtin",)
    backend = step.config_schema().model_fields.get("backend")
    if backend is None:
        return ("builtin",)
    return tuple(str(a) for a in typing.get_args(backend.annotation)) or (str(backend.default),)


@dataclass(frozen=True)
class Query:
    """`steps list`'s filters; None matches everything. Every given filter must match (AND)."""

    category: str | None = None
    tag: str | None = None
    consumes: str | None = None  # an artifact type (see the module's rule)
    produces: str | None = None
    engine: str | None = None


def check(catalog: Catalog, query: Query) -> None:
    """UserError (exit 2, one line with a did-you-mean) for a category, tag, type or engine that no step has."""
    steps = catalog.steps.values()
    known = {
        "category": {s.manifest.step.category for s in steps},
        "tag": {t for s in steps for t in s.manifest.step.tags},
        "artifact type": set(catalog.types),
    }
    asked = [("category", query.category), ("tag", query.tag), ("artifact type", query.consumes),
             ("artifact type", query.produces)]  # fmt: skip
    for what, value in asked:
        if value is not None and value not in known[what]:
            raise UserError(f"unknown {what} '{value}'{did_you_mean(value, known[what])}; "
                            f"known: {', '.join(sorted(known[what]))}")  # fmt: skip
    if query.engine is not None:
        engines = {e for s in steps for e in engines_of(s)}
        if query.engine not in engines:
            raise UserError(f"no step runs on engine '{query.engine}'{did_you_mean(query.engine, engines)}; "
                            f"engines: {', '.join(sorted(engines))}")  # fmt: skip


def types_of(io: Consumes | Produces, engine: str | None) -> set[str]:
    """The artifact types an input or output reads or writes: on `engine`, or on any engine when None."""
    return {io.type_on(engine)} if engine else {io.type, *io.backend_types.values()}


def accepts(catalog: Catalog, c: Consumes, artifact_type: str, engine: str | None = None) -> bool:
    """Input `c` would be bound to an artifact of `artifact_type` (it is_a one of the input's types)."""
    return any(catalog.is_a(artifact_type, t) for t in types_of(c, engine))


def select(catalog: Catalog, query: Query) -> list[Step]:
    """The steps matching every filter of `query`, by id. `check` it first: an unknown value matches nothing."""
    found = []
    for step in sorted(catalog.steps.values(), key=lambda s: s.id):
        m = step.manifest
        if query.category is not None and m.step.category != query.category:
            continue
        if query.tag is not None and query.tag not in m.step.tags:
            continue
        if query.engine is not None and query.engine not in engines_of(step):
            continue
        if query.consumes is not None and not any(accepts(catalog, c, query.consumes, query.engine)
                                                  for c in m.consumes):  # fmt: skip
            continue
        if query.produces is not None and not any(catalog.is_a(t, query.produces)
                                                  for p in m.produces for t in types_of(p, query.engine)):  # fmt: skip
            continue
        found.append(step)
    return found


# ---- the flow of artifacts between steps ---------------------------------------------------------------------


@dataclass(frozen=True)
class Feed:
    """What reaches input `input` of a step: an artifact of `type` from step `source` ("" when no listed step
    makes one: the user brings it)."""

    input: str
    type: str
    source: str = ""


@dataclass
class FlowNode:
    """A step in the flow tree, under the step whose output it waits for last (`via`), with where its other
    required inputs come from (`also`) and the steps that wait on it (`children`)."""

    step: Step
    via: Feed | None = None
    also: list[Feed] = field(default_factory=list)
    children: list[FlowNode] = field(default_factory=list)


def _feeds(
    catalog: Catalog, step: Step, c: Consumes, among: Iterable[Step], engine: str | None
) -> list[Feed]:
    """Every other listed step that makes an artifact input `c` accepts, with the type it makes: the producers of
    the input's own type first, as `Catalog.producers_of` orders them."""
    found = []
    for other in among:
        if other.id == step.id:
            continue
        made = [t for p in other.manifest.produces for t in sorted(types_of(p, engine))
                if accepts(catalog, c, t, engine)]  # fmt: skip
        if made:
            found.append(Feed(c.name, made[0], other.id))
    found.sort(key=lambda f: (f.type not in types_of(c, engine), f.source))
    return found


def _given(c: Consumes, engine: str | None) -> Feed:
    """Input `c` as the user brings it: no listed step makes it."""
    return Feed(c.name, c.type_on(engine) if engine else c.type)


def flow(catalog: Catalog, steps: list[Step], engine: str | None = None) -> list[FlowNode]:
    """`steps` as a forest joined by the artifact types that flow between them. Each step stands once, at the
    earliest stage it can run: when each of its required inputs is made by the earliest listed step that makes it
    (an input no listed step makes is the user's, there from the start). It hangs under the step whose output it
    waits for last. Steps that only feed each other (rl/* make the policy every rl/* reads) start from the first
    of them by id, its inputs taken as given. Optional inputs join nothing: they would make every checkpoint
    reader a child of every checkpoint maker."""
    feeds = {
        s.id: {c.name: _feeds(catalog, s, c, steps, engine) for c in s.manifest.consumes if c.required}
        for s in steps
    }
    stage: dict[str, int] = {}
    nodes: dict[str, FlowNode] = {}
    roots: list[FlowNode] = []
    pending = list(steps)
    while pending:
        done = set(stage)  # a round places only steps fed by earlier rounds: each at its earliest stage
        placed = []
        for s in pending:
            # per required input, in manifest order: (the stage of the step feeding it, or -1: the user's; the feed)
            got: list[tuple[int, Feed]] = []
            for c in (c for c in s.manifest.consumes if c.required):
                makers = feeds[s.id][c.name]
                ready = [f for f in makers if f.source in done]
                if not makers:
                    got.append((-1, _given(c, engine)))
                elif ready:  # min is stable: of the earliest makers, the preferred one
                    got.append(min(((stage[f.source], f) for f in ready), key=lambda w: w[0]))
                else:
                    break
            else:
                placed.append((s, got))
        if not placed:  # only a cycle is left (rl/* feed each other): its first step starts a tree of its own
            s = pending[0]
            placed = [(s, [(-1, _given(c, engine)) for c in s.manifest.consumes if c.required])]
        for s, got in placed:
            via = max(got, key=lambda w: w[0], default=(-1, None))  # max is stable: the first input wins ties
            node = FlowNode(
                s, via[1] if via[0] >= 0 else None, [f for _, f in got if f is not via[1] or via[0] < 0]
            )
            stage[s.id] = via[0] + 1
            nodes[s.id] = node
            (nodes[node.via.source].children if node.via else roots).append(node)
        pending = [s for s in pending if s.id not in stage]
    return roots


def flow_json(nodes: list[FlowNode]) -> list[dict[str, typing.Any]]:
    """The flow tree as JSON holds it: each step's id, the feed it hangs by, its other feeds, its children."""

    def feed(f: Feed) -> dict[str, str]:
        return {"input": f.input, "type": f.type, "from": f.source}

    return [
        {
            "id": n.step.id,
            "via": feed(n.via) if n.via else None,
            "also": [feed(f) for f in n.also],
            "children": flow_json(n.children),
        }
        for n in nodes
    ]
