"""A submitted job's remote record, typed: what an executor wrote into status.json when it submitted the job, so
that status, logs and cancel find it again. Each executor has one model per launch shape it places (`shape`: a
step `process`, a `ray` cluster, an engine's `hetjob`); the model is the object that asks that executor's scheduler
about that shape, so no code asks which shape a record is. remote.py holds what every shape shares.

Records written before `shape` existed said `"launch": "ray"` for a Ray cluster and nothing for the rest: they read
as `ray` and `process` (the launch shapes they were).
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from nemotron.errors import UserError

SHAPE_FIELD = "shape"


class LogReader(Protocol):
    live: bool  # True: read() may be polled while the job runs; False: the log is whole only once it ended

    def read(self) -> str:
        """The log text not returned before."""
        ...


class RemoteState(NamedTuple):
    """What the scheduler says of a job now."""

    state: str  # pending | running | succeeded | failed | cancelled | unknown
    # the job's watchdog record (launch/liveness.py), where the scheduler reports it rather than the job dir (the
    # Ray job's log on Lepton, which goes with its cluster); kept in the job dir by the caller
    liveness: dict[str, Any] | None = None


class RemoteRecord(BaseModel):
    """The fields every shape records, and the questions each shape answers on its executor."""

    # status.json holds the job's lifecycle (state, times, exit code) beside the record: those are not its fields.
    # defer_build: a shape's schema is built when a record is read, not when a dry run imports its executor
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True, defer_build=True)

    shape: str  # each shape narrows it to its Literal: the discriminator
    handle: str  # NeMo-Run's handle of the job
    remote_id: str  # the Slurm job id, the Lepton job or RayCluster name
    roles: list[str] = []  # the srun groups (or the one Lepton job), the step's last
    # output name -> path, registered after success where the run does not register them itself (launch/remote.py)
    outputs: dict[str, str] = Field({}, alias="register")

    @abstractmethod
    def state(self) -> RemoteState:
        """The scheduler's state of the job."""

    @abstractmethod
    def exit_code(self) -> int | None:
        """The step's exit code once the job ended, where the scheduler keeps it; None where it does not."""

    @abstractmethod
    def log_reader(self, job_dir: Path, role: str | None = None) -> LogReader:
        """The step's log (or `role`'s), as the scheduler gives it."""

    @abstractmethod
    def cancel(self) -> None:
        """Ask the scheduler to stop the job (and free what it holds); returns before it stopped."""

    def side_logs(self) -> list[Path]:
        """Logs of the job's other groups worth naming after the step's (a reward server's)."""
        return []


R = TypeVar("R", bound=RemoteRecord)


def read_record(records: TypeAdapter[R], status: dict[str, Any], job_dir: Path) -> R:
    """The record in a job's status.json, as one of an executor's shapes (`records`: their discriminated union)."""
    if SHAPE_FIELD not in status:
        # written before `shape` existed: `launch` named the one other shape there was ("ray"); none, our process
        status = {**status, SHAPE_FIELD: str(status["launch"]) if "launch" in status else "process"}
    try:
        return records.validate_python(status)
    except ValidationError as e:
        problems = [f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in e.errors()]
        raise UserError(
            f"{job_dir / 'status.json'}: not a submitted job's record nemotron can read", problems
        ) from None
