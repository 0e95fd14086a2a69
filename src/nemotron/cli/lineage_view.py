"""`artifacts lineage` as the user reads it: the ancestry graph the store returns (nemotron.artifacts.store's
`lineage_graph`) drawn as a tree, or written as nodes and edges, each ancestor once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.markup import escape
from rich.tree import Tree

from nemotron.artifacts.store import Artifact
from nemotron.errors import UserError

# (child id, parent id, input name) -> what the edge names as its parent: an artifact's ref, or for a parent row that
# is gone, what the child's job recorded for that input (deleted_ref)
ParentRef = Callable[[int, int, str], str]


def lineage_lines(root: int, edges: list[tuple[int, int, str]], dist: dict[int, int],
                  depth: int | None = None) -> list[tuple[int, str, int, str]]:  # fmt: skip
    """The ancestry as printed lines (level, input name, artifact id, how): each ancestor is expanded once, where it
    is nearest to the root ("node"); every other path to it is a back-reference ("above" or "below")."""
    parents: dict[int, list[tuple[str, int]]] = {}
    for child, parent, input_name in edges:
        parents.setdefault(child, []).append((input_name, parent))
    lines: list[tuple[int, str, int, str]] = [(0, "", root, "node")]
    expanded = {root}
    stack = [(root, 0, iter(parents.get(root, [])))]
    while stack:  # depth first without recursion: a long chain must not hit Python's recursion limit
        _, level, todo = stack[-1]
        step = next(todo, None)
        if step is None:
            stack.pop()
            continue
        input_name, parent = step
        if parent not in dist:  # an edge to a row that is gone (registered while a gc removed its input)
            lines.append((level + 1, input_name, parent, "deleted"))
        elif parent in expanded:
            lines.append((level + 1, input_name, parent, "above"))
        elif dist.get(parent) == level + 1:
            expanded.add(parent)
            lines.append((level + 1, input_name, parent, "node"))
            if depth is None or level + 1 < depth:
                stack.append((parent, level + 1, iter(parents.get(parent, []))))
        else:
            lines.append((level + 1, input_name, parent, "below"))
    return lines


def deleted_ref(child: Artifact, input_name: str, parent: int) -> str:
    """What an edge to a removed artifact names: the ref the child's job recorded for that input, else its id."""
    from nemotron.core.paths import jobs_dir
    from nemotron.jobs.record import load_record

    job_dir = jobs_dir() / (child.job_id or "")
    if child.job_id and (job_dir / "job.yaml").is_file():
        try:
            found = [b.artifact for b in load_record(job_dir).inputs if b.name == input_name and b.artifact]
        except UserError:  # an unreadable record: the id is what is left
            found = []
        if found:
            return str(found[0])
    return f"artifact #{parent}"


def _node(a: Artifact, depth: int) -> dict[str, Any]:
    return {
        "ref": a.ref,
        "id": a.id,
        "type": a.type,
        "job_id": a.job_id,
        "step": a.metadata.get("step"),
        "preset": a.metadata.get("preset"),
        "config_hash": a.metadata.get("config_hash"),
        "depth": depth,
    }


def lineage_json(top: Artifact, nodes: dict[int, Artifact], edges: list[tuple[int, int, str]],
                 dist: dict[int, int], parent_ref: ParentRef) -> dict[str, Any]:  # fmt: skip
    """`lineage --json`: the nodes nearest first, and every edge (one to a removed artifact marked deleted)."""
    return {"root": top.ref, "nodes": [_node(nodes[i], dist[i]) for i in sorted(nodes, key=lambda i: (dist[i], i))],
            "edges": [{"child": nodes[c].ref, "parent": parent_ref(c, p, n), "input": n}
                      | ({} if p in nodes else {"deleted": True}) for c, p, n in edges]}  # fmt: skip


def _label(a: Artifact, via: str) -> str:
    step = a.metadata.get("step")
    made = (f"[dim]← {step} -c {a.metadata.get('preset')} job {a.job_id} config {a.metadata.get('config_hash')}[/]"
            if a.job_id else "[dim](external)[/]")  # fmt: skip
    return f"{via}[bold]{escape(a.ref)}[/] ({escape(a.type)}) {made}"


def lineage_tree(top: Artifact, nodes: dict[int, Artifact], edges: list[tuple[int, int, str]],
                 dist: dict[int, int], depth: int | None, parent_ref: ParentRef) -> Tree:  # fmt: skip
    """`lineage` as a tree: each ancestor expanded once, with the job, preset and config that made it; another path
    to it is a line pointing back to it (↳ policy:v3 (above))."""
    lines = lineage_lines(top.id, edges, dist, depth)
    tree = Tree(_label(top, ""))
    branches: list[Tree] = [tree]
    for level, input_name, art_id, how in lines[1:]:
        via = f"[cyan]{escape(input_name)}[/]: "
        if how == "deleted":
            child = next(c for c, p, n in edges if p == art_id and n == input_name)
            text = f"{via}[dim]{escape(parent_ref(child, art_id, input_name))} (deleted)[/]"
        else:
            text = (
                _label(nodes[art_id], via) if how == "node" else f"{via}[dim]↳ {nodes[art_id].ref} ({how})[/]"
            )
        del branches[level:]
        branches.append(branches[level - 1].add(text))
    return tree
