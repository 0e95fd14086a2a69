"""`nemotron artifacts ls | show | lineage | verify | gc`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.tree import Tree

from nemotron.artifacts.refs import parse_ref
from nemotron.artifacts.store import Artifact, ArtifactStore, content_hash
from nemotron.cli.console import stdout_console
from nemotron.cli.help import epilog
from nemotron.errors import UserError
from nemotron.paths import artifacts_dir

app = typer.Typer(help="The artifact store and checkpoint lineage.", no_args_is_help=True)
out = stdout_console()


def _store() -> ArtifactStore:
    return ArtifactStore(artifacts_dir())


def _resolve(store: ArtifactStore, ref: str) -> Artifact:
    r = parse_ref(ref if ":" in ref or ref.startswith("art://") else f"{ref}:latest")
    if r.kind != "store":
        raise UserError(f"'{ref}' is not an artifact reference (NAME:vN, NAME:latest or art://NAME:vN)")
    return store.resolve(r.name, r.version)


def _as_dict(a: Artifact) -> dict[str, Any]:
    return {
        "ref": a.ref,
        "id": a.id,
        "type": a.type,
        "path": a.path,
        "sha256": a.sha256,
        "job_id": a.job_id,
        "created_at": a.created_at,
        "metadata": a.metadata,
        "files": a.files,
    }


@app.command("ls", epilog=epilog("nemotron artifacts ls --json"))
def ls(
    name: Annotated[str | None, typer.Argument(help="only versions of this artifact")] = None,
    type_: Annotated[str | None, typer.Option("--type", help="only this type")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Artifacts in the store."""
    arts = _store().list_artifacts(type_=type_, name=name)
    if as_json:
        print(json.dumps([{k: v for k, v in _as_dict(a).items() if k != "files"} for a in arts], indent=2))
        return
    table = Table(title=f"artifacts in {artifacts_dir()}", title_justify="left")
    # the reference is what users copy: never cut; a narrow terminal folds the job id onto a second line
    table.add_column("ref", no_wrap=True, min_width=max((len(a.ref) for a in arts), default=3))
    table.add_column("type", no_wrap=True)
    table.add_column("job", overflow="fold")
    table.add_column("sha256", no_wrap=True)
    table.add_column("created (UTC)", no_wrap=True)
    for a in arts:
        created = a.created_at.replace("T", " ").removesuffix("+00:00")
        table.add_row(a.ref, a.type, a.job_id or "(external)", a.sha256[:12], created)
    out.print(table)


@app.command("show", epilog=epilog("nemotron artifacts show tiny_sft_policy:v1"))
def show(ref: str, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """One artifact: type, hash, files, producing job, inputs."""
    store = _store()
    a = _resolve(store, ref)
    info = {**_as_dict(a), "inputs": {n: p.ref for n, p in store.parents(a.id)}}
    if as_json:
        print(json.dumps(info, indent=2))
        return
    for k, v in info.items():
        if k != "files":
            out.print(f"[bold]{k}[/]: {v}")
    out.print(f"[bold]files[/]: {len(a.files)} ({sum(int(f['size']) for f in a.files)} bytes)")


def _lineage(store: ArtifactStore, a: Artifact, path: frozenset[int] = frozenset()) -> dict[str, Any]:
    """The ancestry as a tree; an artifact reached twice (a DAG) appears under each of its children."""
    node: dict[str, Any] = {
        "ref": a.ref,
        "type": a.type,
        "job_id": a.job_id,
        "step": a.metadata.get("step"),
        "preset": a.metadata.get("preset"),
        "config_hash": a.metadata.get("config_hash"),
        "inputs": {},
    }
    if a.id in path:  # a cycle cannot be registered, but a corrupt index must not hang the CLI
        return node
    for name, parent in store.parents(a.id):
        node["inputs"][name] = _lineage(store, parent, path | {a.id})
    return node


@app.command("lineage", epilog=epilog("nemotron artifacts lineage tiny_rlhf_policy:latest"))
def lineage(ref: str, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The ancestry tree of an artifact: which job made it, from which inputs, with which config."""
    store = _store()
    root = _lineage(store, _resolve(store, ref))
    if as_json:
        print(json.dumps(root, indent=2))
        return

    def label(node: dict[str, Any], via: str = "") -> str:
        made = (
            f"[dim]← {node['step']} -c {node['preset']} job {node['job_id']} config {node['config_hash']}[/]"
            if node["job_id"]
            else "[dim](external)[/]"
        )
        return f"{via}[bold]{node['ref']}[/] ({node['type']}) {made}"

    def add(tree: Tree, node: dict[str, Any]) -> None:
        for name, child in node["inputs"].items():
            add(tree.add(label(child, f"[cyan]{name}[/]: ")), child)

    tree = Tree(label(root))
    add(tree, root)
    out.print(tree)


@app.command("verify", epilog=epilog("nemotron artifacts verify tiny_sft_policy:v1"))
def verify(ref: str) -> None:
    """Re-hash an artifact's files and report tampering or corruption (exit 1)."""
    a = _resolve(_store(), ref)
    path = Path(a.path)
    if not path.exists():
        out.print(f"[red]✗[/] {a.ref}: {path} is missing")
        raise typer.Exit(1)
    sha, files = content_hash(path)
    if sha == a.sha256:
        out.print(f"[green]✓[/] {a.ref}: {len(files)} files match sha256 {sha[:12]}")
        return
    recorded = {f["path"]: f["sha256"] for f in a.files}
    now = {f["path"]: f["sha256"] for f in files}
    changed = sorted(p for p in recorded.keys() | now.keys() if recorded.get(p) != now.get(p))
    out.print(f"[red]✗[/] {a.ref}: content changed: {', '.join(changed)}")
    raise typer.Exit(1)


@app.command("gc", epilog=epilog("nemotron artifacts gc --keep 2 (add --yes to delete)"))
def gc(
    keep: Annotated[
        int, typer.Option(min=1, help="versions of each artifact to keep (their ancestors are always kept)")
    ] = 1,
    yes: Annotated[bool, typer.Option("--yes", help="really delete; without it gc only reports")] = False,
) -> None:
    """Remove old, unreferenced artifact versions. A dry run unless --yes; never removes an ancestor of a kept one."""
    import shutil

    from nemotron.artifacts.store import gc_plan
    from nemotron.paths import nemotron_home

    store = _store()
    kept, removable = gc_plan(store, keep)
    home = nemotron_home().resolve()
    for a in removable:
        owned = Path(a.path).resolve().is_relative_to(home)
        what = (
            "delete files + index entry"
            if owned
            else "drop index entry (files outside $NEMOTRON_HOME are left alone)"
        )
        out.print(f"{'removing' if yes else 'would remove'} {a.ref} ({a.type}): {what}")
    out.print(
        f"{len(kept)} kept, {len(removable)} {'removed' if yes else 'removable'}"
        + ("" if yes or not removable else " — run with --yes to remove")
    )
    if not yes:
        return
    store.delete([a.id for a in removable])
    for a in removable:
        p = Path(a.path).resolve()
        if p.is_relative_to(home):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
