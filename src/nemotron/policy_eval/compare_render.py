"""How `nemotron artifacts compare` shows a Comparison: rich tables on a terminal, the same as plain text, and the
JSON of --json. Pure: a Comparison in, objects or text out; nothing is read or written here."""

from __future__ import annotations

import dataclasses
import io
import json
from typing import TYPE_CHECKING, Any

from nemotron.policy_eval.compare import Comparison, ConfigDiff, Difference, Estimate

if TYPE_CHECKING:
    from rich.console import RenderableType

JSON_FORMAT = 1  # bump when --json's keys change


def as_json(c: Comparison) -> dict[str, Any]:
    """The whole comparison as documented in docs/evaluation.md ("--json")."""
    return {"format": JSON_FORMAT, **dataclasses.asdict(c)}


def number(x: float, signed: bool = False) -> str:
    """Three decimals (a score in [0, 1] and a length alike); a tiny non-zero value keeps 3 significant digits."""
    text = f"{x:+.3f}" if signed else f"{x:.3f}"
    if x != 0 and abs(x) < 0.0005:
        text = f"{x:+.3g}" if signed else f"{x:.3g}"
    return text


def estimate(e: Estimate | None) -> str:
    return "—" if e is None else f"{number(e.mean)} [{number(e.low)}, {number(e.high)}]"


def delta(d: Difference | None) -> str:
    if d is None:
        return "Δ —"
    mark = "" if d.verdict == "inconclusive" else f" {d.verdict}"
    return f"Δ {number(d.mean, True)} [{number(d.low, True)}, {number(d.high, True)}]{mark}"


def value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def legend(c: Comparison) -> str:
    how = (
        "each prompt's score minus its score in the first report"
        if c.rule.test == "paired"
        else "unpaired: the reports scored different prompts"
    )
    return (
        f"mean [interval] as each report's summary gives it. Δ: the difference from {c.reports[0].ref} with its "
        f"{c.rule.level:.0%} bootstrap interval ({how}; {c.rule.resamples} resamples, seed {c.rule.seed}); "
        "higher / lower: the interval excludes 0."
    )


def renderables(c: Comparison) -> list[RenderableType]:
    """The metrics table, its legend, and the two config diffs (training jobs, eval jobs)."""
    from rich.table import Table
    from rich.text import Text

    table = Table()
    table.add_column("")
    for col in c.reports:
        table.add_column(Text(col.ref), no_wrap=True)
    table.add_row("policy", *(Text(col.policy or "?") for col in c.reports))
    made = [f"{col.policy_step} {col.policy_job}" if col.policy_job else "external" for col in c.reports]
    table.add_row("trained by", *(Text(m) for m in made))
    table.add_row("eval job", *(Text(col.eval_job or "external") for col in c.reports))
    table.add_row(
        "prompts",
        *(Text(f"{col.prompts or '?'} ({col.num_prompts})") for col in c.reports),
        end_section=True,
    )
    for row in c.metrics:
        cells = [estimate(row.values[0])] + [
            f"{estimate(v)}\n{delta(d)}" for v, d in zip(row.values[1:], row.differences[1:], strict=True)
        ]
        table.add_row(Text(row.name), *(Text(x) for x in cells))
    for corpus in c.corpus:
        cells = ["—" if v is None else number(v) for v in corpus.values]
        table.add_row(Text(f"corpus {corpus.name}"), *(Text(x) for x in cells))
    out: list[RenderableType] = [
        Text("eval reports (the first is the reference)"),
        table,
        Text(legend(c)),
        Text(""),
    ]
    out += config_tables(c, c.training, "training config", "the jobs that made the policies")
    out += config_tables(c, c.evaluation, "eval config", "the eval jobs")
    return out


def config_tables(c: Comparison, d: ConfigDiff, title: str, whose: str) -> list[RenderableType]:
    from rich.table import Table
    from rich.text import Text

    subjects = (
        [col.policy or "its policy" for col in c.reports] if d is c.training else ["the report"] * len(d.jobs)
    )
    notes = [
        Text(f"  {col.ref}: {subject} {job.note}")
        for col, job, subject in zip(c.reports, d.jobs, subjects, strict=True)
        if job.note
    ]
    left = [Text(f"  left out (they differ by design): {', '.join(d.left_out)}")] if d.left_out else []
    readable = len(d.jobs) - len(notes)
    if readable < 2:
        return [Text(f"{title}: fewer than two of {whose} have a record to compare"), *notes, Text("")]
    if not d.keys:
        return [Text(f"{title}: no key differs between {whose}"), *notes, *left, Text("")]
    table = Table()
    table.add_column("key", no_wrap=True)
    for col, job in zip(c.reports, d.jobs, strict=True):
        table.add_column(Text("\n".join(x for x in (col.ref, job.step, job.job_id) if x)))
    for key in d.keys:
        cells = [
            value(v) if is_set else ("(unset)" if not job.note else "—")
            for v, is_set, job in zip(key.values, key.set, d.jobs, strict=True)
        ]
        table.add_row(Text(key.key), *(Text(x) for x in cells))
    return [Text(f"{title}: the keys that differ between {whose}"), table, *notes, *left, Text("")]


def render_text(c: Comparison, width: int = 200) -> str:
    """What the command prints, as plain text `width` columns wide."""
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, highlight=False, markup=False, emoji=False)
    for item in renderables(c):
        console.print(item)
    return buffer.getvalue()
