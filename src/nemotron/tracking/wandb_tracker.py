"""A job as one Weights & Biases run: its config, metrics.jsonl's rows, system metrics, and each registered artifact
as a W&B reference artifact used by its inputs' artifacts, so W&B draws our lineage (docs/tracking.md, "Weights &
Biases"). wandb is imported on start only: it is an optional extra and stays off the CLI's start-up path."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemotron.artifacts.store import Artifact
from nemotron.config.stepconfig import WandbTracking
from nemotron.tracking.base import LoggedArtifact, RunInfo

if TYPE_CHECKING:
    import wandb

# wandb.init waits 90 s by default for a server that does not answer; the caller retries a failed start
# (tracking.retries) with backoff, so a tracker that is down costs the job a few short waits, never many minutes.
INIT_TIMEOUT_S = 15.0
# The alias our version takes in W&B. W&B names its own versions v0, v1, ... in the order they were logged to a
# collection, and that index is not ours (a W&B project may miss versions, or hold them from several homes), so
# "name:v3" in W&B would be W&B's fourth version. Ours is the alias nemotron-v3.
VERSION_ALIAS = "nemotron-v{version}"
# The file in each W&B artifact that names our version: it puts our sha256 into W&B's digest
# (reference_artifact).
ARTIFACT_CARD = "nemotron-artifact.json"
# The last metrics step this job wrote to its offline runs, kept beside them: an offline run cannot ask a server
# where it left off, so a requeued job or a replay reads it here. Online the server is the only record (a step
# this job sent may never have reached it), and an offline job replayed online later sends every row.
LAST_STEP_FILE = "nemotron-last-step"

_RUN_ID_CHARS = re.compile(r"[^a-z0-9_-]")
_ARTIFACT_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def run_id(job_id: str) -> str:
    """The W&B run id of a job: the job id where it is already a safe W&B id (lower-case letters, digits, `-`
    and `_`, as `compile.new_job_id` makes them); otherwise the same text with every other character made `-`,
    plus 8 hex of the job id's sha256 so two jobs that differ only there stay two runs. W&B refuses `:;,#?/'`
    in a run id and puts it in URLs; 64 characters at most."""
    safe = _RUN_ID_CHARS.sub("-", job_id.lower())
    if safe == job_id and len(safe) <= 64:
        return job_id
    return f"{safe[:55]}-{hashlib.sha256(job_id.encode()).hexdigest()[:8]}"


def artifact_name(artifact: Artifact) -> str:
    """The W&B artifact name of our artifact: our name, with any character W&B refuses in a name made `-` (a
    plain input is named after its file). W&B keeps every version of one name in one collection."""
    return _ARTIFACT_NAME_CHARS.sub("-", artifact.name)


class WandbTracker:
    """The Tracker (tracking.base) for W&B. Every wandb error reaches the caller, which retries and then skips W&B
    for the rest of the job; WANDB_API_KEY (or ~/.netrc) is read by wandb itself, never passed by us."""

    name = "wandb"

    def __init__(
        self, settings: WandbTracking, job_dir: Path, init_timeout_s: float = INIT_TIMEOUT_S
    ) -> None:
        self.settings = settings
        self.job_dir = job_dir
        self.init_timeout_s = init_timeout_s
        self._run: wandb.Run | None = None
        # rows below it are in the run already (an earlier attempt or sync sent them)
        self._first_new_step = 0
        self._last_step: int | None = None  # the last step this session sent
        self._used: set[int] = set()  # our ids of the inputs this run has marked as used

    @property
    def wandb_dir(self) -> Path:
        """Where wandb writes the run: `<job_dir>/wandb/offline-run-<time>-<run id>/` (offline) or
        `run-<time>-<run id>/` (online), with the run's `.wandb` record file and wandb's own logs."""
        return self.job_dir / "wandb"

    def start(self, run: RunInfo) -> None:
        import wandb

        self.wandb_dir.mkdir(parents=True, exist_ok=True)
        tags = [*self.settings.tags, run.step, *([run.preset] if run.preset else [])]
        self._run = wandb.init(
            id=run_id(run.job_id),
            # allow: a requeued job, a second attempt after a failed call, or `nemotron jobs sync` continue the
            # same run instead of starting another
            resume="allow",
            project=self.settings.project,
            entity=self.settings.entity,
            name=self.settings.name or run.job_id,
            job_type=run.step,
            tags=list(dict.fromkeys(tags)),
            config=run.config,
            mode=self.settings.mode,
            dir=str(self.job_dir),
            # several jobs in one process (tests, `jobs sync` of many jobs) each get their own run
            reinit="create_new",
            settings=wandb.Settings(
                init_timeout=self.init_timeout_s,
                # System metrics (CPU, memory, disk, network, and GPUs where present) are sampled by wandb's
                # own service, offline too; said here so an environment's WANDB_X_DISABLE_STATS cannot drop them.
                x_disable_stats=False,
                # the job's stdout/stderr are in its own log already; wandb copying them would double them
                console="off",
                silent=True,
            ),
        )
        # Where the run left off: online, the server's next step (run.step on a resumed run: its last step + 1);
        # offline, the step file an earlier attempt wrote.
        if self.settings.mode == "online":
            self._first_new_step = self._run.step
        else:
            last = self._read_last_step()
            self._first_new_step = last + 1 if last is not None else 0
        self._last_step = None

    def log_metrics(self, step: int, metrics: dict[str, float]) -> bool:
        """One metrics.jsonl row at its step. W&B drops (with a warning) a row below the run's current step, and
        a run resumed by a requeued job or `jobs sync` already holds the rows it was sent before: such a row is
        skipped here, so a replay adds no point twice. Rows at the same step merge into one W&B step."""
        run = self._require_run()
        if step < self._first_new_step or (self._last_step is not None and step < self._last_step):
            return False
        run.log(dict(metrics), step=step)
        if step != self._last_step:
            self._last_step = step
            if self.settings.mode == "offline":
                self._write_last_step(step)
        return True

    def log_artifacts(self, artifacts: list[LoggedArtifact]) -> None:
        """Each output as a reference artifact (nothing uploaded: it points at our path), after the run has used
        each of its inputs, so W&B draws input -> this run -> output. Offline wandb cannot mark a use (its
        use_artifact asks the server), so there the inputs are only in the output's metadata (nemotron.inputs)
        until `nemotron jobs sync` replays the job online."""
        run = self._require_run()
        online = self.settings.mode == "online"
        for logged in artifacts:
            if online:
                for _, parent in logged.inputs:
                    if parent.id not in self._used:
                        # The same contents as the W&B artifact the parent's own job logged, so W&B resolves this
                        # to that version; a parent made outside W&B gets its version here.
                        run.use_artifact(reference_artifact(parent, inputs=[]))
                        self._used.add(parent.id)
            out = logged.artifact
            run.log_artifact(
                reference_artifact(out, inputs=logged.inputs),
                aliases=[VERSION_ALIAS.format(version=out.version), "latest"],
            )

    def finish(self, ok: bool) -> None:
        if self._run is not None:
            self._run.finish(exit_code=0 if ok else 1)
            self._run = None

    def _require_run(self) -> wandb.Run:
        if self._run is None:
            raise RuntimeError("WandbTracker used before start() or after finish()")
        return self._run

    def _read_last_step(self) -> int | None:
        try:
            text = (self.wandb_dir / LAST_STEP_FILE).read_text().strip()
        except FileNotFoundError:
            return None
        return int(text)

    def _write_last_step(self, step: int) -> None:
        # write-then-rename: a job killed mid-write leaves the previous step, never a half-written number
        path = self.wandb_dir / LAST_STEP_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{step}\n")
        os.replace(tmp, path)


def reference_artifact(artifact: Artifact, inputs: list[tuple[str, Artifact]]) -> wandb.Artifact:
    """Our artifact as a W&B artifact that uploads nothing: a `file://` reference to its path, without W&B's own
    checksum (that reads every byte of a checkpoint again: 3 to 5 s per GiB from the page cache, by
    bench/wandb_tracker_costs.py, so minutes for a large checkpoint; we have sha256 already), plus a small card naming our version and hash. The card is what makes W&B's digest change with our
    content, and what makes an input built here match the version its own job logged."""
    import wandb

    metadata: dict[str, Any] = {
        "nemotron.ref": artifact.ref,
        "nemotron.job_id": artifact.job_id,
        "sha256": artifact.sha256,
        "path": artifact.path,
        "files": artifact.files,
    }
    if inputs:
        metadata["nemotron.inputs"] = {name: parent.ref for name, parent in inputs}
    out = wandb.Artifact(artifact_name(artifact), type=artifact.type, metadata=metadata)
    with out.new_file(ARTIFACT_CARD) as card:
        json.dump(
            {"ref": artifact.ref, "type": artifact.type, "sha256": artifact.sha256}, card, sort_keys=True
        )
    out.add_reference(Path(artifact.path).resolve().as_uri(), checksum=False)
    return out
