"""Registering a job's outputs with lineage edges to its inputs: one function for every engine, whether the
step registers from inside its own process (builtin) or nemotron registers after a remote run ended (NeMo-RL)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from nemotron.artifacts.store import Artifact, ArtifactStore, open_store
from nemotron.config.backends import ENGINES, RUNS_AS_STEP_PROCESS
from nemotron.config.stepconfig import engine_name
from nemotron.core.paths import artifacts_dir
from nemotron.core.registry import load
from nemotron.jobs.record import JobRecord

log = logging.getLogger("nemotron")


def job_store(record: JobRecord) -> ArtifactStore:
    """The store a job registers into: $NEMOTRON_ARTIFACTS_ROOT (set for step processes), else the profile's
    artifacts_root, else this home's."""
    root = os.environ.get("NEMOTRON_ARTIFACTS_ROOT") or record.profile.get("artifacts_root")
    return open_store(Path(root).expanduser() if root else artifacts_dir())


def _adopted(record: JobRecord, paths: dict[str, Path]) -> dict[str, Any]:
    """Before a job's outputs are registered: the engine that ran it turns what it left into our artifact types
    in place, where they differ (NeMo-RL's eval samples -> an eval_report), and gives registration metadata. An
    engine without an `adopt_outputs` method leaves its outputs as they are."""
    adopt = getattr(load(ENGINES, engine_name(record.config), "backend"), "adopt_outputs", None)
    return dict(adopt(record, paths)) if adopt is not None else {}


def register_job_outputs(
    record: JobRecord,
    paths: dict[str, Path],
    metadata: dict[str, Any] | None = None,
    store: ArtifactStore | None = None,
) -> list[Artifact]:
    """Register every declared output of the job record (job.yaml) in one transaction, each with edges to the
    job's inputs (a plain-path input is registered as an external artifact first)."""
    declared = record.outputs
    missing = [n for n in declared if n not in paths]
    if missing:
        raise RuntimeError(f"step did not produce declared outputs {missing}")
    if engine_name(record.config) not in RUNS_AS_STEP_PROCESS:
        # an external engine's outputs in our artifact types first (NeMo-RL's eval samples -> an eval_report)
        metadata = {**_adopted(record, paths), **(metadata or {})}
    store = store or job_store(record)
    parents: list[tuple[str, int]] = []
    for binding in record.inputs:
        if binding.artifact_id is not None:
            parents.append((binding.name, binding.artifact_id))
        elif binding.kind == "path" and binding.path:
            ext = store.register_external(binding.actual_type or binding.expected_type, Path(binding.path))
            parents.append((binding.name, ext.id))
    meta = {
        "job_id": record.job_id,
        "step": record.step,
        "preset": record.preset,
        "config_hash": record.config_hash,
        "git": record.git.model_dump(),
        "versions": record.versions,
        **(metadata or {}),
    }
    outputs = [(declared[n].artifact, declared[n].type, paths[n], meta) for n in declared]
    arts = store.register(outputs, job_id=record.job_id, parents=parents)
    for a in arts:
        log.info("registered %s (%s) at %s", a.ref, a.type, a.path)
    return arts


def main(argv: list[str] | None = None) -> int:
    """`python -m nemotron.artifacts.lineage --job-dir DIR NAME=PATH...`: register a job's outputs from where they
    are, e.g. at the end of a NeMo-RL driver on the cluster (the store is $NEMOTRON_ARTIFACTS_ROOT there). A job
    whose outputs are registered already registers nothing twice."""
    import argparse

    from nemotron.jobs.record import load_record

    parser = argparse.ArgumentParser(prog="python -m nemotron.artifacts.lineage", description=main.__doc__)
    parser.add_argument("--job-dir", required=True, type=Path)
    parser.add_argument("outputs", nargs="+", metavar="NAME=PATH")
    args = parser.parse_args(argv)
    record = load_record(args.job_dir)
    paths = {name: Path(path) for name, _, path in (o.partition("=") for o in args.outputs)}
    missing = [f"{name}: {path}" for name, path in paths.items() if not path.exists()]
    if missing:
        print(f"nemotron: the run left no {', '.join(missing)}; nothing registered", file=sys.stderr)
        return 1
    from nemotron.errors import EngineOutputError

    store = job_store(record)
    done = store.by_job(record.job_id) if store.exists() else []
    try:
        arts = done or register_job_outputs(record, paths, store=store)
    except EngineOutputError as err:
        print(f"nemotron: {err}; nothing registered", file=sys.stderr)
        return 1
    print("nemotron: registered " + ", ".join(a.ref for a in arts), flush=True)
    # into the job's trackers too, from here where the job's tracking URI and credentials are; never changes the
    # exit status (a tracker that is down is one warning line naming `nemotron jobs sync`)
    from nemotron.tracking.fanout import sync_hint
    from nemotron.tracking.registered import log_registered

    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    try:
        log_registered(record, args.job_dir, store, arts)
    except Exception as e:  # a tracker never fails the registration
        first = (str(e).strip().splitlines() or [""])[0][:200]
        log.warning(
            "tracking: the registered artifacts were not logged: %s: %s; %s",
            type(e).__name__,
            first,
            sync_hint(record.job_id),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
