"""Pipelines: steps with presets wired by artifact, run in order; a step whose outputs exist for the same inputs
and config is skipped."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from nemotron.artifacts.store import Artifact, ArtifactStore
from nemotron.catalog import Catalog
from nemotron.compile import Job, compile_job
from nemotron.core.paths import step_roots
from nemotron.engines.base import Launch
from nemotron.errors import NotFound, UserError, did_you_mean

REPORT_TYPE = "eval_report"  # the artifact type whose summaries [pipeline] compare sets side by side


class PipelineStep(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    step: str
    preset: str = "tiny"
    inputs: dict[str, str] = {}  # input name -> "<pipeline step id>.<output name>"
    overrides: list[str] = []


class PipelineInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    description: str = ""
    report: list[
        str
    ] = []  # metrics.jsonl keys shown per step as before -> after (eval_<metric>_before/_after)
    # eval_report metrics shown side by side after the run, one row per eval/policy step (mean [interval])
    compare: list[str] = []


class Pipeline(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    pipeline: PipelineInfo
    steps: list[PipelineStep]


def pipeline_files() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root in reversed(step_roots()):
        for p in sorted((root / "manifests" / "pipelines").glob("*.toml")):
            found[p.stem] = p
    return found


def load_pipeline(name: str, catalog: Catalog) -> Pipeline:
    files = pipeline_files()
    path = Path(name) if name.endswith(".toml") else files.get(name)
    if path is None or not path.is_file():
        raise NotFound(
            f"unknown pipeline '{name}'{did_you_mean(name, files)}; pipelines: {', '.join(files) or 'none'}"
        )
    try:
        with path.open("rb") as f:
            pipe = Pipeline.model_validate(tomllib.load(f))
    except (tomllib.TOMLDecodeError, ValidationError) as e:
        raise UserError(f"{path}: invalid pipeline: {e}") from None
    problems: list[str] = []
    seen: dict[str, str] = {}
    for s in pipe.steps:
        if s.step not in catalog.steps:
            problems.append(f"step '{s.id}': unknown step '{s.step}'{did_you_mean(s.step, catalog.steps)}")
            continue
        consumes = {c.name for c in catalog.get(s.step).manifest.consumes}
        for inp, src in s.inputs.items():
            if inp not in consumes:
                problems.append(
                    f"step '{s.id}': '{s.step}' has no input '{inp}'{did_you_mean(inp, consumes)}"
                )
            up, _, out = src.partition(".")
            if up not in seen:
                problems.append(
                    f"step '{s.id}': input '{inp}' comes from '{up}', which is not an earlier step"
                )
            elif out not in {p.name for p in catalog.get(seen[up]).manifest.produces}:
                problems.append(f"step '{s.id}': '{up}' ({seen[up]}) produces no '{out}'")
        seen[s.id] = s.step
    evaluators = catalog.producers_of(REPORT_TYPE)  # the steps whose manifests produce one
    if pipe.pipeline.compare and not set(evaluators) & set(seen.values()):
        problems.append(
            f"[pipeline] compare sets {REPORT_TYPE} metrics side by side, but no step is {' or '.join(evaluators)}"
        )
    if problems:
        raise UserError(f"{path}: invalid pipeline:", problems)
    return pipe


def _check_until(pipe: Pipeline, until: str | None) -> None:
    if until is not None and until not in {s.id for s in pipe.steps}:
        ids = [s.id for s in pipe.steps]
        raise UserError(
            f"--until {until}: no such step in pipeline '{pipe.pipeline.name}'{did_you_mean(until, ids)}; "
            f"its steps: {', '.join(ids)}"
        )


@dataclass
class StepResult:
    id: str
    step: str
    job_id: str | None
    skipped: bool
    outputs: dict[str, Artifact] = field(default_factory=dict)
    seconds: float = 0.0


def existing_outputs(job: Job, store: ArtifactStore) -> dict[str, Artifact] | None:
    """The outputs of an earlier successful run with the same config and the same input artifacts, if any."""
    wanted_parents = sorted((b.name, b.artifact_id) for b in job.bindings if b.artifact_id is not None)
    found: dict[str, Artifact] = {}
    for out_name, (art_name, _type) in job.outputs.items():
        match = None
        for art in reversed(store.list_artifacts(name=art_name)):
            if art.metadata.get("config_hash") != job.config_hash or not Path(art.path).exists():
                continue
            parents = sorted((n, p.id) for n, p in store.parents(art.id) if not p.metadata.get("external"))
            if parents == wanted_parents:
                match = art
                break
        if match is None:
            return None
        found[out_name] = match
    return found


def bound_overrides(s: PipelineStep, catalog: Catalog, upstream: Callable[[str, str], str]) -> list[str]:
    """The step's own overrides, then each input bound to what `upstream(step id, output name)` gives for its
    source: a registered artifact's ref when the pipeline runs, a planned path in a dry run."""
    keys = {c.name: c.config_key for c in catalog.get(s.step).manifest.consumes}
    overrides = list(s.overrides)
    for inp, src in s.inputs.items():
        up, _, out = src.partition(".")
        overrides.append(f"{keys[inp]}={upstream(up, out)}")
    return overrides


def run_pipeline(
    pipe: Pipeline,
    catalog: Catalog,
    store: ArtifactStore,
    run_job: Callable[[Job], int],
    force: bool = False,
    on_event: Callable[[str, PipelineStep, Any], None] = lambda *a: None,
    until: str | None = None,
) -> list[StepResult]:
    import time

    _check_until(pipe, until)
    results: dict[str, StepResult] = {}
    for s in pipe.steps:
        overrides = bound_overrides(s, catalog, lambda up, out: results[up].outputs[out].ref)
        job = compile_job(
            catalog,
            s.step,
            s.preset,
            overrides=overrides,
            store=store,
            argv=["nemotron", "pipeline", "run", pipe.pipeline.name],
        )
        prior = None if force else existing_outputs(job, store)
        if prior is not None:
            results[s.id] = StepResult(s.id, s.step, None, True, prior)
            on_event("skip", s, prior)
            if s.id == until:
                break
            continue
        on_event("start", s, job)
        t0 = time.monotonic()
        code = run_job(job)
        if code != 0:
            raise UserError(
                f"pipeline '{pipe.pipeline.name}' stopped: step '{s.id}' ({s.step}) failed with exit code {code}",
                hint=f"See: nemotron jobs logs {job.job_id}",
            )
        produced = {a.name: a for a in store.by_job(job.job_id)}
        results[s.id] = StepResult(
            s.id,
            s.step,
            job.job_id,
            False,
            {n: produced[a] for n, (a, _t) in job.outputs.items()},
            time.monotonic() - t0,
        )
        on_event("done", s, results[s.id])
        if s.id == until:
            break
    return list(results.values())


# ----------------------------------------------------------------------------- the verdict: eval reports compared


@dataclass(frozen=True)
class EvalReport:
    """One eval/policy step's report, labelled by the step that made the policy it evaluated."""

    label: str  # "rl/ppo": the pipeline step the evaluated policy came from (its step name)
    artifact: Artifact  # the eval_report

    @property
    def ref(self) -> str:
        return self.artifact.ref


def eval_reports(pipe: Pipeline, results: Sequence[StepResult]) -> list[EvalReport]:
    """The eval_report of every step that ran or was skipped as done and produced one, in pipeline order."""
    wiring = {s.id: s.inputs for s in pipe.steps}
    step_of = {r.id: r.step for r in results}
    found = []
    for r in results:
        report = next((a for a in r.outputs.values() if a.type == REPORT_TYPE), None)
        if report is None:
            continue
        producer = wiring[r.id].get("policy", "").partition(".")[0]
        found.append(EvalReport(step_of.get(producer, r.id), report))
    return found


def verdict(
    reports: Sequence[EvalReport], metrics: Sequence[str], store: ArtifactStore, jobs: Path
) -> dict[str, Any]:
    """The pipeline's final table: `nemotron artifacts compare` of its eval reports (the first, the SFT policy's,
    is the reference), kept to the pipeline's `compare` metrics, as a JSON-able record: {"compare": metrics,
    "rule": {...}, "reports": [{"policy", "report", "metrics": {name: {mean, low, high, n[, delta]}}}]}, where
    `delta` is the paired-bootstrap difference from the first report with its verdict (higher / lower /
    inconclusive)."""
    import dataclasses

    from nemotron.policy_eval.compare import compare_artifacts

    comparison, _ = compare_artifacts(store, [r.artifact for r in reports], jobs)
    rows = {row.name: row for row in comparison.metrics if row.name in metrics}
    out = []
    for i, report in enumerate(reports):
        cells: dict[str, Any] = {}
        for name in metrics:
            row = rows.get(name)
            value = row.values[i] if row else None
            if value is None:
                continue
            cells[name] = dataclasses.asdict(value)
            diff = row.differences[i] if row and i else None
            if diff is not None:
                cells[name]["delta"] = dataclasses.asdict(diff)
        out.append({"policy": report.label, "report": report.ref, "metrics": cells})
    return {"compare": list(metrics), "rule": dataclasses.asdict(comparison.rule), "reports": out}


def verdict_cells(record: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The verdict record as text cells, a header and one row per report: "mean [low, high]", and for every report
    after the first its difference from the first, "Δ +d higher" (or lower; no word when the interval holds 0).
    `pipeline run` prints these and scripts/tiny_figures.py writes them into the README."""
    metrics = record["compare"]
    header = ["policy", "report", *metrics]
    rows = []
    for report in record["reports"]:
        cells = []
        for m in metrics:
            got = report["metrics"].get(m)
            if got is None:
                cells.append("-")
                continue
            cell = f"{got['mean']:.2f} [{got['low']:.2f}, {got['high']:.2f}]"
            if "delta" in got:
                d = got["delta"]
                word = "" if d["verdict"] == "inconclusive" else f" {d['verdict']}"
                cell += f", Δ {d['mean']:+.2f}{word}"
            cells.append(cell)
        rows.append([report["policy"], report["report"], *cells])
    return header, rows


# ----------------------------------------------------------------------------- --dry-run


@dataclass
class PlannedStep:
    """One step of a pipeline's dry-run: its compiled job, what it would submit, and where its outputs will be."""

    id: str
    step: str
    job: Job
    text: str  # what `steps run ... --dry-run` prints for this job
    outputs: dict[str, str]  # output name -> the path the job will leave it at


def planned_outputs(job: Job, job_dir: str, launch: Launch, catalog: Catalog) -> dict[str, str]:
    """Where a job will leave each output: an external engine says (`outputs` of its launch); our own step process
    writes output NAME at <job dir>/outputs/NAME, with its type's suffix for a file (`StepRun.output_dir`)."""
    if launch.external:
        named = dict(launch.outputs)
        return {name: named[name] for name in job.outputs}
    paths = {}
    for name, (_artifact, type_name) in job.outputs.items():
        spec = catalog.types.get(type_name)
        suffix = spec.suffix if spec is not None and spec.kind == "file" and spec.suffix else ""
        paths[name] = f"{job_dir}/outputs/{name}{suffix}"
    return paths


def plan_pipeline(
    pipe: Pipeline,
    catalog: Catalog,
    profile_name: str | None,
    store: ArtifactStore | None = None,
    until: str | None = None,
) -> list[PlannedStep]:
    """Compile every step without running any: each input bound to the path its upstream step's job will leave
    the output at (paths that do not exist yet, bound as a dry-run binds a path on the cluster). Every refusal
    of any step comes out here, before anything is written."""
    from nemotron.launch import submit

    _check_until(pipe, until)
    planned: dict[str, PlannedStep] = {}
    for s in pipe.steps:
        overrides = bound_overrides(s, catalog, lambda up, out: planned[up].outputs[out])
        job = compile_job(
            catalog,
            s.step,
            s.preset,
            overrides=overrides,
            profile_name=profile_name,
            mode="batch",
            store=store,
            argv=["nemotron", "pipeline", "run", pipe.pipeline.name, "--dry-run"],
            dry_run=True,
        )
        planned_launch = submit.plan(job)
        _executor, where, launch, _text = planned_launch
        text = submit.planned_dry_run(job, planned_launch)
        planned[s.id] = PlannedStep(
            s.id, s.step, job, text, planned_outputs(job, where.job_dir, launch, catalog)
        )
        if s.id == until:
            break
    return list(planned.values())
