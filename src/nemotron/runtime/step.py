"""What a step script sees when it runs: its validated config, its job dir, metrics, and output registration."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import yaml
from pydantic import BaseModel

from nemotron.artifacts.lineage import register_job_outputs
from nemotron.artifacts.store import Artifact, ArtifactStore, open_store
from nemotron.catalog import load_schema
from nemotron.config.configtree import set_dotted
from nemotron.core.paths import artifacts_dir
from nemotron.errors import UserError
from nemotron.jobs.record import JobRecord, load_record
from nemotron.runtime.metrics import MetricsLogger, summary_line
from nemotron.runtime.progress import Beacon, Bounds

if TYPE_CHECKING:
    from nemotron.tracking.job import StepTracking

C = TypeVar("C", bound=BaseModel)
T = TypeVar("T")
log = logging.getLogger("nemotron")


def required(value: T | None, key: str) -> T:
    """A config value the step cannot run without (schemas leave inputs optional so that presets can omit
    them): the value, or exit 2 naming the key."""
    if value is None:
        raise UserError(f"{key} is required: set it in the preset or on the command line ({key}=...)")
    return value


def container_only(step_id: str, runner: str, where: str) -> int:
    """The entry of a step that an engine runs as `runner` in a container (`where`: "the NeMo container
    (backend=nemo)"), never as this process: the engine compiles the job, and every executor that cannot run the
    container refuses it before anything is written. The entry exists for the catalog; run, it says so: exit 2."""
    print(
        f"{step_id}: {runner} runs it in {where}; submit it with a Slurm profile: "
        f"nemotron steps run {step_id} -c default -b PROFILE",
        file=sys.stderr,
    )
    return 2


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Turn SIGTERM into an exception so `finally` blocks run: sibling servers stop, no temp files linger.
    raise KeyboardInterrupt("SIGTERM")


@dataclass
class StepRun(Generic[C]):
    job_dir: Path
    config: C
    record: JobRecord
    passthrough: list[str] = field(default_factory=list)
    rank: int = 0
    world_size: int = 1
    _metrics: MetricsLogger | None = None
    _tracking: StepTracking | None = None
    # this rank's progress beacon (runtime/progress.py): written only where a launcher watches the job
    progress: Beacon = field(default_factory=lambda: Beacon(None, 0, Bounds()))

    @classmethod
    def start(cls, step_file: str, schema: type[C] | None = None) -> StepRun[C]:
        """Parse `--job-dir`, load config.yaml (+ the 0600 secrets file) and validate it against the step's schema."""
        parser = argparse.ArgumentParser(description=f"nemotron step {step_file}")
        parser.add_argument("--job-dir", required=True, type=Path)
        args, rest = parser.parse_known_args()
        job_dir: Path = args.job_dir.resolve()
        logging.basicConfig(
            level=logging.INFO,
            format="%(asctime)s %(levelname)s %(message)s",
            datefmt="%H:%M:%S",
            stream=sys.stdout,
        )
        signal.signal(signal.SIGTERM, _on_sigterm)
        _quiet_libraries()
        raw = yaml.safe_load((job_dir / "config.yaml").read_text()) or {}
        secrets_file = job_dir / ".secrets.json"
        if secrets_file.is_file():
            for key, value in json.loads(secrets_file.read_text()).items():
                set_dotted(raw, key, value)
        model = schema or load_schema(Path(step_file).resolve().parent / "schema.py")
        config = model.model_validate(raw)
        record = load_record(job_dir)
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        run = cls(job_dir, config, record, rest, rank, world)  # type: ignore[arg-type]
        run.exit_if_finished()
        run.progress = Beacon.from_env(rank)
        if run.is_main and hasattr(config, "tracking"):
            from nemotron.tracking.job import StepTracking

            run._tracking = StepTracking.open(config, record, job_dir)  # exit 2 here, before training
        return run

    def exit_if_finished(self) -> None:
        """A job that already registered its outputs and starts again (Slurm requeued it after it finished) has
        nothing to do: exit 0 before training, so it never trains twice nor registers a second version."""
        store = self.store()
        done = store.by_job(self.record.job_id) if store.exists() else []
        if done:
            refs = ", ".join(a.ref for a in done)
            print(
                f"nemotron: {self.record.job_id} already finished and registered {refs}; nothing to do",
                flush=True,
            )
            raise SystemExit(0)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def checkpoint_dir(self) -> Path:
        return self.job_dir / "checkpoints"

    def output_dir(self, name: str) -> Path:
        """Where output `name` is written. Registered only by `register_outputs` at the very end."""
        d = self.job_dir / "outputs" / name
        d.parent.mkdir(parents=True, exist_ok=True)
        return d

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """One step's metrics (main rank: metrics.jsonl, trackers); then, on every rank, the step's progress beacon
        (after the logging, whose first call loads TensorBoard: that is the step's time, not the next one's)."""
        if self.is_main:
            if self._metrics is None:
                self._metrics = MetricsLogger(self.job_dir)
            self._metrics.log(step, metrics)
            if self._tracking is not None:
                self._tracking.log_metrics(step, metrics)
        if step > self.progress.step:
            self.progress.beat(step)

    def rewind_metrics(self, step: int) -> None:
        """Drop metrics.jsonl rows after `step`: a restarted job resumes there, and the rows its lost run wrote
        after that checkpoint would otherwise appear twice. -1 drops every row: a restart that starts over."""
        if not self.is_main:
            return
        path = self.job_dir / "metrics.jsonl"
        if not path.is_file():
            return
        lines = path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if line.strip() and json.loads(line).get("step", 0) <= step]
        if len(kept) != len(lines):
            tmp = path.with_name(".metrics.jsonl.tmp")
            tmp.write_text("".join(kept))
            os.replace(tmp, path)

    def report(
        self, step: int, total: int, metrics: dict[str, float], keys: tuple[str, ...], every: int = 1
    ) -> None:
        """Log one step's metrics; on the main rank print its `step i/N key=value` summary line (the `keys`,
        which attached runs parse) every `every` steps and at the last."""
        self.log_metrics(step, metrics)
        if self.is_main and (step % every == 0 or step == total):
            print(summary_line(step, total, metrics, keys), flush=True)

    def store(self) -> ArtifactStore:
        root = os.environ.get("NEMOTRON_ARTIFACTS_ROOT")
        return open_store(Path(root) if root else artifacts_dir())

    def register_outputs(
        self, paths: dict[str, Path], metadata: dict[str, Any] | None = None
    ) -> list[Artifact]:
        """Register every output in one transaction, with lineage edges to the inputs. Main rank only; its
        progress is done."""
        if not self.is_main:
            return []
        self.progress.unwatched("done")
        if self._metrics is not None:
            self._metrics.close()
        store = self.store()
        artifacts = register_job_outputs(self.record, paths, metadata, store)
        if self._tracking is not None:
            self._tracking.log_outputs(store, artifacts)
        return artifacts


def _quiet_libraries() -> None:
    """Progress bars from transformers (loading and writing shards) would drown the step's own log lines."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach a hub
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass
