"""Liveness of a Slurm job, watched by the launcher (the sbatch script), not the engine: every node beats, every
rank of a built-in step says when it last made progress, and a watchdog beside the batch script fails the job when
a node stops beating or the work stops moving.

- Nodes (a multi-node job): one `srun --overlap` step with one task per node touches
  `<job dir>/heartbeats/<slurm id>-<restart>/<node>` every `heartbeat_interval_s`. A node that dies takes its task
  with it; a node that hangs (every process stopped, as SIGSTOP does) stops touching its file.
- Progress (any node count, `progress_floor_s` > 0): each rank keeps a beacon in
  `<job dir>/progress/<slurm id>-<restart>/` with the deadline of its next progress (runtime/progress.py). A rank
  stuck on a live node (a collective whose peer hangs, a wedged filesystem call) lets its deadline pass while its
  node still beats.
- The watchdog, a loop in the batch script's background, checks every interval. A heartbeat older than
  `heartbeat_timeout_s`, or every watched rank past its deadline, and it writes `<job dir>/liveness.json` (what it
  saw, the bound, which node or rank was last seen progressing), says so in the batch log, and cancels the job's
  steps (`scancel <id>.<step>`): the step command ends non-zero, the batch script exits with it, the job ends
  FAILED and the allocation is released. Nothing is registered, since registration follows only a successful run.

A lost node is noticed at most `heartbeat_timeout_s + heartbeat_interval_s` after its last beat, a stall at most
`heartbeat_interval_s` after the last rank's deadline, plus Slurm's KillWait to end the steps. The watchdog runs on
the first node with the batch script: a hang of that node is left to Slurm's own node health check
(SlurmdTimeout). docs/cluster.md, "Liveness" and "Progress".
"""

from __future__ import annotations

import shlex
from typing import NamedTuple

from nemotron.config.profiles import LeptonProfile, LocalProfile, SlurmProfile
from nemotron.errors import UserError
from nemotron.runtime.progress import BOUNDS_ENV, DIR_ENV, RECORD_FILE, Bounds

HEARTBEATS = "heartbeats"
PROGRESS = "progress"
_ATTEMPT = (
    '"$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"'  # a requeued job (same id) starts afresh in its own folder
)


class Liveness(NamedTuple):
    """What the watchdog watches and how often; `None` in a plan with nothing to watch."""

    job_dir: str  # the step's job dir on shared storage
    groups: tuple[int, ...]  # the nodes of each srun group (one group unless a hetjob); () beats nothing
    interval_s: int = 30
    timeout_s: int = 90
    progress: Bounds | None = None  # the ranks' progress bounds; None: progress not watched

    @property
    def beats(self) -> str:
        """The heartbeat folder of this run, a shell word."""
        return f"{shlex.quote(f'{self.job_dir}/{HEARTBEATS}')}/{_ATTEMPT}"

    @property
    def beacons(self) -> str:
        """The progress folder of this run (the ranks' beacons), a shell word."""
        return f"{shlex.quote(f'{self.job_dir}/{PROGRESS}')}/{_ATTEMPT}"

    @property
    def record(self) -> str:
        return f"{self.job_dir}/{RECORD_FILE}"


def progress_bounds(profile: SlurmProfile | LeptonProfile | LocalProfile) -> Bounds | None:
    """The profile's progress bounds; None where `progress_floor_s` is 0 (progress not watched)."""
    if not profile.progress_floor_s:
        return None
    return Bounds(
        profile.progress_floor_s,
        profile.progress_pace_factor,
        profile.progress_startup_s,
        profile.progress_checkpoint_s,
        profile.progress_validation_s,
    )


def for_job(
    profile: SlurmProfile | LeptonProfile, job_dir: str, groups: tuple[int, ...], progress: bool = False
) -> Liveness | None:
    """The liveness settings of a job whose srun groups span `groups` nodes each: heartbeats on two nodes or more,
    and with `progress` (a launcher whose ranks write beacons) the progress bounds; None when nothing is watched.
    A heartbeat bound not above the interval would fail a healthy job, so it is refused (exit 2)."""
    bounds = progress_bounds(profile) if progress else None
    if sum(groups) < 2 and bounds is None:
        return None
    if sum(groups) >= 2 and profile.heartbeat_timeout_s <= profile.heartbeat_interval_s:
        raise UserError(
            f"profile '{profile.name}': heartbeat_timeout_s ({profile.heartbeat_timeout_s}) must be above "
            f"heartbeat_interval_s ({profile.heartbeat_interval_s}), or every node would look silent"
        )
    beating = groups if sum(groups) >= 2 else ()
    return Liveness(job_dir, beating, profile.heartbeat_interval_s, profile.heartbeat_timeout_s, bounds)


def progress_lines(live: Liveness) -> list[str]:
    """Shell: where the ranks' beacons go and their bounds, in the environment every srun task inherits."""
    if live.progress is None:
        return []
    return [
        "# every rank says by when it will have made progress (nemotron.runtime.progress)",
        f"export {DIR_ENV}={live.beacons}",
        f"export {BOUNDS_ENV}={live.progress.encode()}",
        f'mkdir -p "${DIR_ENV}"',
    ]


def heartbeat_lines(live: Liveness) -> list[str]:
    """Shell: start one heartbeat task on every node of the allocation (of each group of a hetjob), in the
    background; `--overlap` so it takes nothing from the job's own steps. Nothing beats on one node."""
    if not live.groups:
        return ["liveness=()"]
    beat = f'while :; do touch {live.beats}/"$SLURMD_NODENAME"; sleep {live.interval_s}; done'
    het = len(live.groups) > 1
    lines = [
        f"mkdir -p {live.beats}",
        "# every node beats (nemotron.launch.liveness): a dead or hung node stops touching its file",
        "liveness=()",
    ]
    for i, nodes in enumerate(live.groups):
        where = f"--het-group={i} " if het else ""
        lines += [
            f"srun --overlap {where}--nodes={nodes} --ntasks={nodes} --ntasks-per-node=1 --output=/dev/null "
            f"bash -c {shlex.quote(beat)} &",
            "liveness+=($!)",
        ]
    return lines


_CANCEL = 'for s in $(squeue -h -s -j "$SLURM_JOB_ID" -o %i | grep -E \'\\.[0-9]+$\'); do scancel "$s"; done'


def _heartbeat_check(live: Liveness) -> str:
    """Shell, inside the watchdog loop: a node silent past the bound fails the job."""
    record = shlex.quote(live.record)
    json_line = (
        '{"node": "%s", "seen": "no heartbeat for %d s", "silent_s": %d, "bound_s": %d, "at": "%s", '
        '"slurm_job_id": "%s"}\\n'
    )
    return f"""        for beat in {live.beats}/*; do
            [ -e "$beat" ] || continue
            silent=$(( now - $(stat -c %Y "$beat") ))
            [ "$silent" -gt {live.timeout_s} ] || continue
            node=$(basename "$beat")
            echo "nemotron: liveness: node $node sent no heartbeat for $silent s (bound {live.timeout_s} s); cancelling the job's steps" >&2
            printf '{json_line}' "$node" "$silent" "$silent" {live.timeout_s} "$(date -u +%FT%TZ)" "$SLURM_JOB_ID" > {record}.tmp
            mv {record}.tmp {record}
            {_CANCEL}
            exit 0
        done"""


def _progress_check(live: Liveness) -> str:
    """Shell, inside the watchdog loop: every watched rank past its deadline (runtime/progress.py) fails the job;
    the record names the rank that was last seen progressing (the newest deadline) and lists them all."""
    record = shlex.quote(live.record)
    json_line = (
        '{"kind": "progress", "node": "%s", "rank": %d, "section": "%s", "step": %d, '
        '"seen": "no progress for %d s", "silent_s": %d, "bound_s": %d, "ranks": "%s", "at": "%s", '
        '"slurm_job_id": "%s"}\\n'
    )
    return f"""        newest=0 last="" ranks="" n=0
        for beacon in {live.beacons}/*; do
            read -r deadline section step node rank _ written 2>/dev/null <"$beacon" || continue
            [ "$deadline" -gt 0 ] 2>/dev/null || continue  # not watched (serving, done)
            n=$((n + 1))
            ranks="$ranks${{ranks:+; }}rank $rank on $node: $section after step $step"
            [ "$deadline" -gt "$newest" ] && newest=$deadline last="$rank $node $section $step $written"
        done
        if [ "$n" -gt 0 ] && [ "$now" -gt "$newest" ]; then
            read -r rank node section step written <<<"$last"
            silent=$((now - written)) bound=$((newest - written))
            echo "nemotron: liveness: no progress from any of $n rank(s) for $silent s (bound $bound s); the last to progress was rank $rank on $node ($section after step $step); cancelling the job's steps" >&2
            printf '{json_line}' "$node" "$rank" "$section" "$step" "$silent" "$silent" "$bound" "$ranks" "$(date -u +%FT%TZ)" "$SLURM_JOB_ID" > {record}.tmp
            mv {record}.tmp {record}
            {_CANCEL}
            exit 0
        fi"""


def watchdog_lines(live: Liveness) -> list[str]:
    """Shell: the watchdog loop, in the background of the batch script (tracing off: it would flood the log)."""
    checks = [_heartbeat_check(live)] if live.groups else []
    if live.progress is not None:
        checks.append(_progress_check(live))
    body = f"""(
    {{ set +xve; }} 2>/dev/null
    waited=0
    # the watchdog ends within a second of the batch script ($$), exited or a zombie (it would hold the script's
    # output open)
    while sleep 1 && read -r _ _ state _ 2>/dev/null </proc/$$/stat && [ "$state" != Z ]; do
        waited=$((waited + 1))
        [ "$waited" -ge {live.interval_s} ] || continue
        waited=0
        now=$(date +%s)
{chr(10).join(checks)}
    done
) &
liveness+=($!)"""
    what = "a node is silent" if live.groups else "the work stops"
    if live.groups and live.progress is not None:
        what = "a node is silent or the work stops"
    return [f"# the watchdog: fails the job once {what} past the bound", *body.splitlines()]


def lines(live: Liveness | None) -> list[str]:
    """Progress environment, heartbeats and watchdog, or nothing. Their pids are in the shell array `liveness`."""
    return [*progress_lines(live), *heartbeat_lines(live), *watchdog_lines(live)] if live else []


def stop_line(live: Liveness | None) -> str:
    """Shell: stop the heartbeats and the watchdog once the job's command ended (else the job lingers in
    COMPLETING while Slurm ends them)."""
    return 'kill "${liveness[@]}" 2>/dev/null' if live else ""
