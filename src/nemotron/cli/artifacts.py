"""`nemotron artifacts ls | show | lineage | compare | verify | gc | alias | unalias | migrate`."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from nemotron.artifacts.refs import store_ref
from nemotron.artifacts.store import Artifact, ArtifactStore, content_hash, open_store
from nemotron.cli.console import TABLE_ROWS, print_columns, stdout_console
from nemotron.cli.help import command
from nemotron.cli.listing import since_option
from nemotron.core.paths import artifacts_dir
from nemotron.errors import UserError

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)  # its help: cli.app.GROUPS
out = stdout_console()


def _store() -> ArtifactStore:
    return open_store(artifacts_dir())


def _resolve(store: ArtifactStore, ref: str) -> Artifact:
    """Every command's reference: NAME:vN, NAME:latest, NAME@ALIAS, art://..., or a bare NAME (its latest)."""
    r = store_ref(ref)
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


@command(app, "ls", "nemotron artifacts ls --type checkpoint_hf --since 7d --limit 20")
def ls(
    name: Annotated[str | None, typer.Argument(help="only versions of this artifact")] = None,
    name_opt: Annotated[str | None, typer.Option("--name", help="only versions of this artifact")] = None,
    type_: Annotated[str | None, typer.Option("--type", help="only this type")] = None,
    step: Annotated[str | None, typer.Option(help="only artifacts made by this step (e.g. rl/rlhf)")] = None,
    since: Annotated[str | None, since_option("artifacts registered")] = None,
    alias: Annotated[
        str | None, typer.Option(help="only the artifacts this alias points at (one per name)")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="newest N")] = 50,
    all_: Annotated[bool, typer.Option("--all", help="every match, not the newest --limit")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="a JSON array, written as it is read")] = False,
    as_jsonl: Annotated[bool, typer.Option("--jsonl", help="one JSON object per line")] = False,
) -> None:
    """Artifacts in the store, newest first, a page at a time.

    A page is --limit rows (default 50), filtered and ordered in SQL."""
    from nemotron.cli.listing import more_note

    filters = {"name": name_opt or name, "type_": type_, "step": step, "alias": alias, "since": since}
    store = _store()
    page = _with_aliases(store, store.newest(None if all_ else limit, **filters))
    if as_json or as_jsonl:
        shown = 0
        for a, names in page:
            row = json.dumps({**{k: v for k, v in _as_dict(a).items() if k != "files"}, "aliases": names})
            sys.stdout.write(f"{row}\n" if as_jsonl else ("[\n  " if shown == 0 else ",\n  ") + row)
            shown += 1
        if as_json:
            sys.stdout.write("[]\n" if shown == 0 else "\n]\n")
    else:
        headers = ["ref", "type", "step", "job", "sha256", "created"]
        cells = [[a.ref, a.type, str(a.metadata.get("step") or ""), a.job_id or "(external)", a.sha256[:12],
                  a.created_at.replace("T", " ").removesuffix("+00:00"), " ".join("@" + n for n in names)]
                 for a, names in page]  # fmt: skip
        if any(c[-1] for c in cells):  # a column only where the page has an alias: most stores have none
            headers.append("aliases")
        else:
            cells = [c[:-1] for c in cells]
        shown = len(cells)
        if shown > TABLE_ROWS:
            print_columns(
                out, f"artifacts in {store.index.where}", headers, cells, ["bold"] + [""] * (len(headers) - 1)
            )
        else:
            table = Table(title=f"artifacts in {store.index.where}", title_justify="left")
            # the reference is what users copy: never cut; a narrow terminal folds the job id onto a second line
            table.add_column("ref", no_wrap=True, min_width=max((len(c[0]) for c in cells), default=3))
            for col in headers[1:]:
                table.add_column(col, overflow="fold" if col == "job" else "ellipsis", no_wrap=col != "job")
            for c in cells:
                table.add_row(*c)
            out.print(table)
    if not all_ and shown == limit:
        more_note(store.count(**filters) - limit, "artifacts")


def _with_aliases(store: ArtifactStore, arts: Iterator[Artifact]) -> Iterator[tuple[Artifact, list[str]]]:
    """Each artifact with the aliases pointing at it, looked up 500 at a time: `ls --all --json` stays a stream."""
    from nemotron.artifacts.aliases import aliases_of

    while chunk := list(itertools.islice(arts, 500)):
        found = aliases_of(store, [a.id for a in chunk])
        yield from ((a, found.get(a.id, [])) for a in chunk)


@command(app, "show", "nemotron artifacts show tiny_sft_policy:v1")
def show(ref: str, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """One artifact: hash, files, job, inputs, aliases.

    Also its type, and its aliases' history: every move of an alias that points at it, and of one that pointed
    at it before (newest first, at most 20)."""
    from nemotron.artifacts.aliases import aliases_of, history_of

    store = _store()
    a = _resolve(store, ref)
    info = {**_as_dict(a), "inputs": {n: p.ref for n, p in store.parents(a.id)}}
    aliases = aliases_of(store, [a.id]).get(a.id, [])
    moves, more = history_of(store, a)
    if as_json:
        history = [{"alias": m.ref, "from": None if m.from_version is None else f"{a.name}:v{m.from_version}",
                    "to": None if m.to_version is None else f"{a.name}:v{m.to_version}", "at": m.at,
                    "by": m.by_user, "host": m.host} for m in moves]  # fmt: skip
        print(json.dumps({**info, "aliases": aliases, "alias_history": history}, indent=2))
        return
    for k, v in info.items():
        if k != "files":
            out.print(f"[bold]{k}[/]: {v}")
    out.print(f"[bold]files[/]: {len(a.files)} ({sum(int(f['size']) for f in a.files)} bytes)")
    out.print(f"[bold]aliases[/]: {escape(', '.join(aliases)) if aliases else '(none)'}")
    if moves:
        out.print("[bold]alias history[/] (newest first):")
        for m in moves:
            when = m.at.replace("T", " ").removesuffix("+00:00")
            out.print(f"  {when}  {m.describe()}  by {m.by_user} on {m.host}", markup=False, highlight=False)
        if more:
            out.print(f"  ... and {more} older moves", markup=False)


@command(app, "lineage", "nemotron artifacts lineage tiny_rlhf_policy:latest --depth 3")
def lineage(
    ref: str,
    depth: Annotated[int | None, typer.Option(min=1, help="at most N inputs away (default: all)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="the graph as nodes and edges")] = False,
) -> None:
    """Which job made an artifact, from which inputs.

    The whole ancestry, with each job's config. Each ancestor is printed once; another path to it is a line that points back to it (↳ policy:v3 (above))."""
    from nemotron.cli.lineage_view import deleted_ref, lineage_json, lineage_tree

    store = _store()
    top = _resolve(store, ref)
    nodes, edges, dist = store.lineage_graph(top.id, depth)

    def parent_ref(child: int, parent: int, input_name: str) -> str:
        return nodes[parent].ref if parent in nodes else deleted_ref(nodes[child], input_name, parent)

    if as_json:
        print(json.dumps(lineage_json(top, nodes, edges, dist, parent_ref), indent=2))
        return
    out.print(lineage_tree(top, nodes, edges, dist, depth, parent_ref))


@command(
    app, "compare", "nemotron artifacts compare tiny_eval_report:v1 tiny_eval_report:v2 --plot rewards.png"
)
def compare(
    refs: Annotated[list[str], typer.Argument(help="eval_report artifacts (NAME:vN, NAME:latest, NAME@ALIAS, art://NAME:vN); the first is the reference")],
    as_json: Annotated[bool, typer.Option("--json", help="the whole comparison as JSON (keys: docs/evaluation.md)")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", metavar="FILE", help="also draw each report's per-prompt scores into FILE (.png, .svg, .pdf)")] = None,
    plot_metric: Annotated[str | None, typer.Option(help="the per-prompt score --plot draws (default: reward_model, else task_score, ...)")] = None,
    allow_different_prompts: Annotated[bool, typer.Option("--allow-different-prompts", help="compare reports made on different prompt sets (unpaired: a weaker test)")] = False,
) -> None:  # fmt: skip
    """Eval reports side by side: metrics, differences beyond noise, config diff.

    Each metric's mean and interval, whether it differs from the first report's beyond
    noise (a paired bootstrap over the prompts), and the config keys that differ between the jobs that trained the
    compared policies and between the eval jobs. Reports made on different prompt sets are refused (exit 2) unless
    --allow-different-prompts."""
    from nemotron.core.paths import jobs_dir
    from nemotron.policy_eval.compare import compare_artifacts, scores
    from nemotron.policy_eval.compare import plot_metric as choose_metric
    from nemotron.policy_eval.compare_render import as_json as comparison_json
    from nemotron.policy_eval.compare_render import renderables

    if len(refs) < 2:
        raise UserError(f"compare needs at least two eval reports, got {len(refs)}: {' '.join(refs)}")
    if plot_metric is not None and plot is None:
        raise UserError("--plot-metric acts only with --plot FILE")
    if plot is not None and not plot.parent.resolve().is_dir():
        raise UserError(f"--plot {plot}: {plot.parent} is not a directory")
    store = _store()
    resolved = [_resolve(store, r) for r in refs]
    given: dict[int, str] = {}
    for ref, artifact in zip(refs, resolved, strict=True):
        if (
            artifact.id in given
        ):  # `report:v1 report:latest` included: a report compared with itself says nothing
            raise UserError(
                f"{ref} and {given[artifact.id]} are the same report, {artifact.ref}: compare it with another one"
                if ref != given[artifact.id]
                else f"{ref} is given twice: compare a report with another one"
            )
        given[artifact.id] = ref
    comparison, reports = compare_artifacts(
        store, resolved, jobs_dir(), allow_different_prompts=allow_different_prompts
    )
    if plot is not None:
        from nemotron.cli.plotting import plot_distributions

        metric = choose_metric(reports, plot_metric)
        series = [(f"{r.ref} ({r.policy})" if r.policy else r.ref, scores(r, metric)) for r in reports]
        plot_distributions(series, metric, plot)
    if as_json:
        print(json.dumps(comparison_json(comparison), indent=2))
    else:
        for item in renderables(comparison):
            out.print(item)
    if plot is not None and not as_json:
        out.print(f"wrote {plot}", markup=False, highlight=False)


@command(app, "verify", "nemotron artifacts verify tiny_sft_policy:v1")
def verify(ref: str) -> None:
    """Re-hash an artifact's files; exit 1 when they changed.

    A file that no longer hashes to what the store recorded was tampered with or corrupted."""
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


@command(app, "gc", "nemotron artifacts gc --keep 2 (add --yes to delete)")
def gc(
    keep: Annotated[
        int, typer.Option(min=1, help="versions of each artifact to keep (their ancestors are always kept)")
    ] = 1,
    yes: Annotated[bool, typer.Option("--yes", help="really delete; without it gc only reports")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="one line per removable artifact")] = False,
) -> None:
    """Remove old, unreferenced artifact versions.

    A dry run unless --yes; never removes an artifact an alias points at, one a job that has not ended uses as an
    input, nor an ancestor of a kept one. Reports per name (versions, bytes); deletes in batches, each its own transaction, so Ctrl-C leaves a
    consistent store (run gc again to finish)."""
    from nemotron.cli.artifacts_gc import run_gc

    run_gc(_store(), keep, yes=yes, verbose=verbose, out=out)


@command(app, "alias", "nemotron artifacts alias tiny_sft_policy:v2 best")
def alias(
    ref: Annotated[
        str,
        typer.Argument(
            metavar="REF", help="the artifact: NAME:vN, NAME:latest, NAME@OTHER_ALIAS or art://..."
        ),
    ],
    name: Annotated[str, typer.Argument(metavar="ALIAS", help="letters, digits, _ -; not latest nor vN")],
    as_json: Annotated[bool, typer.Option("--json", help="the move as JSON")] = False,
) -> None:
    """Set or move NAME@ALIAS to an artifact (recorded).

    Inputs then take NAME@ALIAS wherever they take NAME:vN. Each move is recorded (from, to, when, by whom:
    `artifacts show NAME@ALIAS`); gc keeps every artifact an alias points at."""
    from nemotron.artifacts.aliases import move_alias
    from nemotron.artifacts.refs import check_alias_name

    why = check_alias_name(name)  # before the store is read: a bad name is refused whatever the reference
    if why is not None:
        raise UserError(f"cannot set alias: {why}")
    store = _store()
    target = _resolve(store, ref)
    move = move_alias(store, target, name)
    to = f"{target.name}@{name}"
    if as_json:
        was = None if move is None or move.from_version is None else f"{target.name}:v{move.from_version}"
        print(json.dumps({"alias": to, "to": target.ref, "moved": move is not None,
                          "from": target.ref if move is None else was}))  # fmt: skip
    elif move is None:
        out.print(f"{to} already points at {target.ref}", markup=False, highlight=False)
    elif move.from_version is None:
        out.print(f"{to} -> {target.ref} (new alias)", markup=False, highlight=False)
    else:
        out.print(f"{to} -> {target.ref} (moved from v{move.from_version})", markup=False, highlight=False)


@command(app, "unalias", "nemotron artifacts unalias tiny_sft_policy@best")
def unalias(
    ref: Annotated[str, typer.Argument(metavar="NAME@ALIAS", help="the alias to remove")],
    as_json: Annotated[bool, typer.Option("--json", help="the removal as JSON")] = False,
) -> None:
    """Remove an alias (recorded in its history).

    The artifact NAME@ALIAS pointed at stays, and gc may remove it once nothing else keeps
    it. The removal is the alias's last recorded move."""
    from nemotron.artifacts.aliases import remove_alias

    name, at, alias_name = ref.removeprefix("art://").partition("@")
    if not at or not name or not alias_name:
        raise UserError(f"unalias takes NAME@ALIAS, got '{ref}'")
    move = remove_alias(_store(), name, alias_name)
    was = f"{name}:v{move.from_version}"
    if as_json:
        print(json.dumps({"alias": move.ref, "removed": True, "from": was}))
    else:
        out.print(f"removed {move.ref} (it pointed at {was})", markup=False, highlight=False)


@command(
    app,
    "migrate",
    "nemotron artifacts migrate --to postgresql://nemotron@db.example.com:5432/nemotron   # password: $PGPASSWORD",
)
def migrate(
    to: Annotated[
        str,
        typer.Option(
            "--to",
            metavar="URL",
            help="the PostgreSQL store: postgresql://USER@HOST[:PORT]/DATABASE (no password: $PGPASSWORD or"
            " ~/.pgpass)",
        ),
    ],
) -> None:
    """Copy this home's SQLite store into an empty PostgreSQL store, and verify it.

    The store under $NEMOTRON_HOME: every artifact (version, sha256, files, metadata, job, creation time), every
    lineage edge, every alias and the whole alias history; then both are read back and compared (counts, each reference's sha256, the edges by reference, the aliases). The files
    stay where they are. A target that already holds this same store is a verified no-op; one that holds anything
    else is refused. The password is never part of --to (it would be in your shell history and in `ps`): libpq
    reads it from $PGPASSWORD or ~/.pgpass. Afterwards, point every host at the new store with
    `export NEMOTRON_STORE_URL=URL`."""
    from urllib.parse import parse_qs, urlsplit

    from nemotron.artifacts.migrate import migrate as copy_store
    from nemotron.artifacts.pg_index import PostgresIndex
    from nemotron.core.storeurl import parse_store_url, redact_url

    parts = urlsplit(to)
    if parts.password is not None or "password" in parse_qs(parts.query):
        raise UserError(
            f"--to {redact_url(to)}: a password in the URL would be kept in your shell history and shown by `ps`",
            hint="give it as PGPASSWORD=... or a line in ~/.pgpass (mode 0600), and the URL without it",
        )
    url = parse_store_url(to, given_as="--to ")
    source = ArtifactStore(artifacts_dir())  # this home's SQLite store, whatever $NEMOTRON_STORE_URL says
    if not source.exists():
        raise UserError(f"there is no SQLite store in {artifacts_dir()}: nothing to migrate")
    done = copy_store(source, ArtifactStore(artifacts_dir(), PostgresIndex(url)))
    counts = done.contents.counts()
    if done.copied:
        out.print(
            f"migrated {counts} from {source.index.where} to {url.shown}", markup=False, highlight=False
        )
    else:
        out.print(
            f"{url.shown} already holds this store ({counts}); nothing copied", markup=False, highlight=False
        )
    out.print("verified: every reference's sha256, the lineage edges, the aliases and their history match",
              markup=False, highlight=False)  # fmt: skip
    out.print(f"use it: export NEMOTRON_STORE_URL={url.shown}", markup=False, highlight=False)
