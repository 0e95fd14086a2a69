"""`nemotron artifacts compare`: eval reports side by side, whether each one's metrics differ from the first's beyond
noise, and the config keys that differ between the jobs behind them.

Three stages: `load_report` and `load_job_config` read the store, the report files and the job records;
`compare` turns what they read into a typed `Comparison` without touching anything; compare_render prints it.

The difference rule. Both reports scored the same prompts (the same prompt texts and answers, in any order) ->
paired: each prompt's score in the other report minus its score in the first, and a percentile-bootstrap interval
of the mean of those differences. Prompts differ (only with --allow-different-prompts) -> unpaired: the two sets of
scores are resampled independently and the interval is that of the difference of their means. Either way the
bootstrap uses the first report's summary settings (resamples, level, seed), and a metric is `higher` or `lower`
when the whole interval lies above or below 0, else `inconclusive`. Checking whether the two reports' own intervals
overlap would be conservative: the prompts vary far more than a policy change moves any one of them, so two
reports' intervals overlap although every prompt's score rose; pairing cancels the prompts' own spread.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from nemotron.artifacts.store import Artifact, ArtifactStore
from nemotron.errors import UserError
from nemotron.policy_eval.report import FORMAT, METRICS
from nemotron.policy_eval.stats import Interval, bootstrap_interval, unpaired_difference_interval

# What --plot draws when not told: the first of these every report has.
PLOT_PREFERENCE = ("reward_model", "task_score", "math_correct", "win_rate")
# Config keys left out of the diff. Output names differ whenever runs are named apart, and an eval job's
# inputs.policy is the policy being compared (each column's header names it).
TRAINING_LEFT_OUT = ("outputs",)
EVALUATION_LEFT_OUT = ("outputs", "inputs.policy")
# The run-specific part of a job id (`rl-reinforce-20261126-223945-9504`): masked inside config values, so a path
# through a job directory differs only where it differs outside that id.
_JOB_STAMP = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4,}")

Verdict = Literal["higher", "lower", "inconclusive"]


# ----------------------------------------------------------------------------------------------- what is read


@dataclass(frozen=True)
class Report:
    """One eval_report as read: its files, and through lineage what it evaluated."""

    ref: str  # name:vN
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    eval_job: str | None  # the job that made the report; None: registered from a path
    policy: str | None  # the evaluated policy's artifact (its input `policy`)
    policy_job: str | None  # the job that made that policy; None: registered from a path (external)
    policy_step: str | None
    prompts: str | None  # the prompts artifact (its input `prompts`)

    def prompt_keys(self) -> list[tuple[str, str | None]]:
        """What identifies each row's prompt: its text and its reference answer."""
        return [(str(r.get("prompt")), r.get("answer")) for r in self.rows]


def load_report(store: ArtifactStore, artifact: Artifact) -> Report:
    """An eval_report artifact's summary, rows and lineage; exit 2 for any other type or a report nemotron
    cannot read."""
    if artifact.type != "eval_report":
        raise UserError(
            f"{artifact.ref} is a {artifact.type} artifact, expected eval_report (what eval/policy registers)"
        )
    directory = Path(artifact.path)
    try:
        summary = json.loads((directory / "summary.json").read_text())
        lines = (directory / "responses.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError) as e:
        raise UserError(
            f"{artifact.ref}: cannot read its report in {directory}: {e}",
            hint=f"Check its files with: nemotron artifacts verify {artifact.ref}",
        ) from None
    written = summary.get("format") if isinstance(summary, dict) else None
    if not isinstance(written, int) or written > FORMAT:
        raise UserError(
            f"{artifact.ref}: summary.json has format {written!r}; this nemotron reads eval reports of format "
            f"{FORMAT} and older (a newer nemotron wrote it: upgrade)"
        )
    parents = dict(store.parents(artifact.id))
    policy, prompts = parents.get("policy"), parents.get("prompts")
    return Report(
        ref=artifact.ref,
        summary=summary,
        rows=rows,
        eval_job=artifact.job_id,
        policy=policy.ref if policy else None,
        policy_job=policy.job_id if policy else None,
        policy_step=str(policy.metadata.get("step")) if policy and policy.job_id else None,
        prompts=prompts.ref if prompts else None,
    )


@dataclass(frozen=True)
class JobConfig:
    """A job's resolved config, flattened to dotted keys, with each input as the artifact it was bound to."""

    job_id: str | None
    step: str | None
    config: dict[str, Any] | None  # None: no record to read; `note` says why
    note: str = ""  # why there is no config: "was registered from a path: no job made it", ...
    # What a key's value is compared by, where not by the value itself: an input's content hash, so the same
    # files registered twice (external.sft_policy:v1 and :v2) are the same input
    identity: dict[str, str] = field(default_factory=dict)


def load_job_config(job_id: str | None, jobs_root: Path, store: ArtifactStore) -> JobConfig:
    """The config job.yaml recorded for `job_id`. An input is shown as the artifact it resolved to
    (`tiny_sft_policy:v3`, not the `:latest` that was typed), since that is what the job read, and compared by
    that artifact's content hash."""
    from nemotron.errors import NotFound
    from nemotron.jobs.record import load_record

    if job_id is None:
        return JobConfig(None, None, None, "was registered from a path: no job made it")
    job_dir = jobs_root / job_id
    if not (job_dir / "job.yaml").is_file():
        return JobConfig(job_id, None, None, f"was made by job {job_id}, whose record is not in {jobs_root}")
    record = load_record(job_dir)
    config = json.loads(json.dumps(record.config))  # a deep copy
    inputs = config.get("inputs")
    identity = {}
    if isinstance(inputs, dict):
        # a plain-path input became an artifact (external.NAME:vN) when the job registered its outputs: its
        # lineage edge names it
        made = store.by_job(job_id)
        registered = dict(store.parents(made[0].id)) if made else {}
        for binding in record.inputs:
            if binding.name not in inputs:
                continue
            parent = registered.get(binding.name) if binding.artifact_id is None else None
            inputs[binding.name] = binding.artifact or (parent.ref if parent else binding.ref)
            if parent is not None:
                identity[f"inputs.{binding.name}"] = parent.sha256
            elif binding.artifact_id is not None:
                try:
                    identity[f"inputs.{binding.name}"] = store.get(binding.artifact_id).sha256
                except NotFound:  # removed by gc since: compared by its name
                    pass
    return JobConfig(job_id, record.step, flatten(config), identity=identity)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys; lists stay values."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


# ----------------------------------------------------------------------------------------- the comparison


@dataclass(frozen=True)
class Estimate:
    """A mean with its interval: a metric of one report (from its summary), or a difference from the first."""

    mean: float
    low: float
    high: float
    n: int  # prompts it is over (for a difference: the pairs, or the smaller report)


@dataclass(frozen=True)
class Difference(Estimate):
    verdict: Verdict  # higher / lower: the whole interval is above / below 0


@dataclass(frozen=True)
class MetricRow:
    name: str
    values: list[Estimate | None]  # per report; None: the report has no such metric
    differences: list[Difference | None]  # per report, from the first; the first's own is None


@dataclass(frozen=True)
class CorpusRow:
    name: str
    values: list[float | None]  # per report: the summary's corpus value (no interval: one number per corpus)


@dataclass(frozen=True)
class Column:
    ref: str
    policy: str | None
    policy_step: str | None
    policy_job: str | None
    eval_job: str | None
    prompts: str | None
    num_prompts: int


@dataclass(frozen=True)
class Rule:
    test: Literal["paired", "unpaired"]
    resamples: int
    level: float
    seed: int


@dataclass(frozen=True)
class KeyDiff:
    key: str
    values: list[Any]  # per report; meaningful where `set` is true
    set: list[bool]  # per report: the key is in that job's config (false too where the job has no record)


@dataclass(frozen=True)
class JobColumn:
    job_id: str | None
    step: str | None
    note: str  # why there is no config to compare ("" when there is one)


@dataclass(frozen=True)
class ConfigDiff:
    jobs: list[JobColumn]  # per report
    keys: list[KeyDiff]  # the keys whose values differ, by name
    left_out: list[str]  # keys that differ but are left out (output names, ...), by name


@dataclass(frozen=True)
class Comparison:
    reports: list[Column]
    rule: Rule
    metrics: list[MetricRow]
    corpus: list[CorpusRow]
    training: ConfigDiff  # the jobs that made the compared policies
    evaluation: ConfigDiff  # the eval jobs that made the reports


def align(reference: Sequence[Any], other: Sequence[Any]) -> list[int] | None:
    """For each prompt of `reference`, the index of the same prompt in `other` (the k-th repeat of a prompt pairs
    with the k-th); None when the two are not the same prompts."""
    if sorted(reference, key=repr) != sorted(other, key=repr):
        return None
    where: dict[str, list[int]] = {}
    for j, key in enumerate(other):
        where.setdefault(repr(key), []).append(j)
    taken = {key: iter(js) for key, js in where.items()}
    return [next(taken[repr(key)]) for key in reference]


def verdict(interval: Interval) -> Verdict:
    if interval.low > 0:
        return "higher"
    if interval.high < 0:
        return "lower"
    return "inconclusive"


def difference(
    metric: str,
    reference: Sequence[Mapping[str, Any]],
    other: Sequence[Mapping[str, Any]],
    order: Sequence[int] | None,
    rule: Rule,
) -> Difference | None:
    """How `other`'s `metric` differs from `reference`'s: paired through `order` (align's), else unpaired. None
    when either report has no values for it."""
    if order is not None:
        pairs = [(reference[i].get(metric), other[j].get(metric)) for i, j in enumerate(order)]
        deltas = [float(b) - float(a) for a, b in pairs if a is not None and b is not None]
        if not deltas:
            return None
        interval = bootstrap_interval(deltas, resamples=rule.resamples, level=rule.level, seed=rule.seed)
    else:
        a = [float(r[metric]) for r in reference if r.get(metric) is not None]
        b = [float(r[metric]) for r in other if r.get(metric) is not None]
        if not a or not b:
            return None
        interval = unpaired_difference_interval(
            a, b, resamples=rule.resamples, level=rule.level, seed=rule.seed
        )
    return Difference(interval.mean, interval.low, interval.high, interval.n, verdict(interval))


def metric_names(summaries: Sequence[Mapping[str, Any]]) -> list[str]:
    names = {name for s in summaries for name in s.get("metrics", {})}
    known = [m for m in METRICS if m in names]
    return known + sorted(names - set(known))


def check_prompts(reports: Sequence[Report], allow_different: bool) -> list[list[int] | None]:
    """Each report's alignment to the first's prompts; exit 2 naming the first report that scored other
    prompts, unless `allow_different` (then its alignment is None: compared unpaired)."""
    first = reports[0].prompt_keys()
    orders = []
    for report in reports:
        order = align(first, report.prompt_keys())
        if order is None and not allow_different:
            raise UserError(
                f"{reports[0].ref} and {report.ref} were made on different prompt sets "
                f"({_prompt_set(reports[0])}; {_prompt_set(report)}): their scores cannot be paired",
                hint="Pass --allow-different-prompts to compare them anyway (unpaired).",
            )
        orders.append(order)
    return orders


def _prompt_set(report: Report) -> str:
    return f"{len(report.rows)} prompts of {report.prompts or 'an unrecorded prompt file'}"


def config_diff(jobs: Sequence[JobConfig], left_out: Sequence[str]) -> ConfigDiff:
    """The keys whose values differ between the jobs that have a config (job ids masked in the values), minus
    those under `left_out` (listed apart)."""

    def leave(key: str) -> bool:
        return any(key == p or key.startswith(p + ".") for p in left_out)

    configs = [j.config for j in jobs]
    known = [c for c in configs if c is not None]
    keys, dropped = [], []
    for key in sorted({k for c in known for k in c}):
        seen = [_compared(j, key) for j in jobs if j.config is not None]
        if all(v == seen[0] for v in seen):
            continue
        if leave(key):
            dropped.append(key)
            continue
        keys.append(
            KeyDiff(
                key,
                values=[c.get(key) if c is not None else None for c in configs],
                set=[c is not None and key in c for c in configs],
            )
        )
    return ConfigDiff([JobColumn(j.job_id, j.step, j.note) for j in jobs], keys, dropped)


_UNSET = object()


def _compared(job: JobConfig, key: str) -> Any:
    """What `key`'s value in `job` is compared by: its identity (an input's content hash), else the value with
    job ids masked; _UNSET where the key is absent."""
    assert job.config is not None
    if key not in job.config:
        return _UNSET
    return job.identity.get(key) or _masked(job.config[key])


def _masked(value: Any) -> Any:
    if isinstance(value, str):
        return _JOB_STAMP.sub("<job>", value)
    if isinstance(value, list):
        return [_masked(v) for v in value]
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    return value


def compare(
    reports: Sequence[Report],
    training: Sequence[JobConfig],
    evaluation: Sequence[JobConfig],
    *,
    allow_different_prompts: bool = False,
) -> Comparison:
    """The reports side by side, the first as the reference (pure: everything is read already). Exit 2 for
    fewer than two reports, or reports on different prompt sets unless `allow_different_prompts`."""
    if len(reports) < 2:
        raise UserError(f"compare needs at least two eval reports, got {len(reports)}")
    orders = check_prompts(reports, allow_different_prompts)
    settings = reports[0].summary.get("interval", {})
    rule = Rule(
        "paired" if all(o is not None for o in orders) else "unpaired",
        int(settings.get("resamples", 1000)),
        float(settings.get("level", 0.95)),
        int(settings.get("seed", 0)),
    )
    metrics = []
    for name in metric_names([r.summary for r in reports]):
        values = [_estimate(r.summary.get("metrics", {}).get(name)) for r in reports]
        diffs = [None] + [
            difference(name, reports[0].rows, r.rows, order if rule.test == "paired" else None, rule)
            for r, order in zip(reports[1:], orders[1:], strict=True)
        ]
        metrics.append(MetricRow(name, values, diffs))
    corpus_names = sorted({n for r in reports for n in r.summary.get("corpus", {})})
    corpus = [CorpusRow(n, [r.summary.get("corpus", {}).get(n) for r in reports]) for n in corpus_names]
    columns = [
        Column(r.ref, r.policy, r.policy_step, r.policy_job, r.eval_job, r.prompts, len(r.rows))
        for r in reports
    ]
    return Comparison(
        columns,
        rule,
        metrics,
        corpus,
        config_diff(training, TRAINING_LEFT_OUT),
        config_diff(evaluation, EVALUATION_LEFT_OUT),
    )


def _estimate(m: Mapping[str, Any] | None) -> Estimate | None:
    if m is None:
        return None
    return Estimate(float(m["mean"]), float(m["low"]), float(m["high"]), int(m["n"]))


def compare_artifacts(
    store: ArtifactStore,
    artifacts: Sequence[Artifact],
    jobs_root: Path,
    *,
    allow_different_prompts: bool = False,
) -> tuple[Comparison, list[Report]]:
    """Read the reports and the records of the jobs behind them, and compare (what the CLI runs)."""
    if len(artifacts) < 2:
        raise UserError(f"compare needs at least two eval reports, got {len(artifacts)}")
    reports = [load_report(store, a) for a in artifacts]
    training = [load_job_config(r.policy_job, jobs_root, store) for r in reports]
    evaluation = [load_job_config(r.eval_job, jobs_root, store) for r in reports]
    return compare(reports, training, evaluation, allow_different_prompts=allow_different_prompts), reports


# ----------------------------------------------------------------------------------- what --plot draws


def plot_metric(reports: Sequence[Report], asked: str | None) -> str:
    """The per-prompt score --plot draws: `asked`, else the first of PLOT_PREFERENCE every report has; exit 2
    when no report-wide per-prompt score fits."""
    common = set.intersection(*(set(r.summary.get("metrics", {})) for r in reports))
    if asked is not None:
        if asked not in common:
            raise UserError(
                f"--plot-metric {asked}: not a metric of every report (they share: "
                f"{', '.join(metric_names([{'metrics': dict.fromkeys(common)}])) or 'none'})"
            )
        return asked
    for name in PLOT_PREFERENCE:
        if name in common:
            return name
    if not common:
        raise UserError("--plot: the reports share no per-prompt metric to draw")
    return metric_names([{"metrics": dict.fromkeys(common)}])[0]


def scores(report: Report, metric: str) -> list[float]:
    return [float(r[metric]) for r in report.rows if r.get(metric) is not None]
