"""Liveness of a multi-node Slurm job, watched by the launcher (the sbatch script), not the engine: every node
beats, a watchdog beside the batch script notices a node that stopped, and fails the job within a bound.

- One `srun --overlap` step with one task per node touches `<job dir>/heartbeats/<slurm id>-<restart>/<node>` every
  `heartbeat_interval_s`. A node that dies takes its task with it; a node that hangs (every process stopped, as
  SIGSTOP does) stops touching its file. Either way the file goes stale.
- The watchdog, a loop in the batch script's background, checks every file each interval. Once one is older
  than `heartbeat_timeout_s`, it writes `<job dir>/liveness.json` (the node, how long it was silent, the bound),
  says so in the batch log, and cancels the job's steps (`scancel <id>.<step>`): the step command ends non-zero,
  the batch script exits with it, the job ends FAILED and the allocation is released. Nothing is registered,
  since registration follows only a successful run.

A failure is noticed at most `heartbeat_timeout_s + heartbeat_interval_s` after the node's last beat, plus
Slurm's KillWait to end the steps. The watchdog runs on the first node with the batch script: a hang of that
node is left to Slurm's own node health check (SlurmdTimeout). docs/cluster.md, "Liveness".
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from nemotron.config.profiles import LeptonProfile, SlurmProfile
from nemotron.errors import UserError

RECORD_FILE = "liveness.json"
HEARTBEATS = "heartbeats"


@dataclass(frozen=True)
class Liveness:
    """Where the beats go and how often; `None` in a plan for a one-node job (nothing to watch)."""

    job_dir: str  # the step's job dir on shared storage
    groups: tuple[int, ...]  # the nodes of each srun group (one group unless a hetjob)
    interval_s: int = 30
    timeout_s: int = 90

    @property
    def beats(self) -> str:
        """The heartbeat folder of this run, a shell word: a requeued job (same id) beats afresh in its own."""
        return f'{shlex.quote(f"{self.job_dir}/{HEARTBEATS}")}/"$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}"'

    @property
    def record(self) -> str:
        return f"{self.job_dir}/{RECORD_FILE}"


def for_job(profile: SlurmProfile | LeptonProfile, job_dir: str, groups: tuple[int, ...]) -> Liveness | None:
    """The liveness settings of a job whose srun groups span `groups` nodes each (None on one node in all); a
    bound not above the interval would fail a healthy job, so it is refused (exit 2)."""
    if sum(groups) < 2:
        return None
    if profile.heartbeat_timeout_s <= profile.heartbeat_interval_s:
        raise UserError(
            f"profile '{profile.name}': heartbeat_timeout_s ({profile.heartbeat_timeout_s}) must be above "
            f"heartbeat_interval_s ({profile.heartbeat_interval_s}), or every node would look silent"
        )
    return Liveness(job_dir, groups, profile.heartbeat_interval_s, profile.heartbeat_timeout_s)


def heartbeat_lines(live: Liveness) -> list[str]:
    """Shell: start one heartbeat task on every node of the allocation (of each group of a hetjob), in the
    background; `--overlap` so it takes nothing from the job's own steps."""
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


def watchdog_lines(live: Liveness) -> list[str]:
    """Shell: the watchdog loop, in the background of the batch script (tracing off: it would flood the log)."""
    record = shlex.quote(live.record)
    json_line = (
        '{"node": "%s", "seen": "no heartbeat for %d s", "silent_s": %d, "bound_s": %d, "at": "%s", '
        '"slurm_job_id": "%s"}\\n'
    )
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
        for beat in {live.beats}/*; do
            [ -e "$beat" ] || continue
            silent=$(( now - $(stat -c %Y "$beat") ))
            [ "$silent" -gt {live.timeout_s} ] || continue
            node=$(basename "$beat")
            echo "nemotron: liveness: node $node sent no heartbeat for $silent s (bound {live.timeout_s} s); cancelling the job's steps" >&2
            printf '{json_line}' "$node" "$silent" "$silent" {live.timeout_s} "$(date -u +%FT%TZ)" "$SLURM_JOB_ID" > {record}.tmp
            mv {record}.tmp {record}
            for s in $(squeue -h -s -j "$SLURM_JOB_ID" -o %i | grep -E '\\.[0-9]+$'); do scancel "$s"; done
            exit 0
        done
    done
) &
liveness+=($!)"""
    return ["# the watchdog: fails the job once a node is silent past the bound", *body.splitlines()]


def lines(live: Liveness | None) -> list[str]:
    """Heartbeats and watchdog, or nothing for a one-node job. Their pids are in the shell array `liveness`."""
    return [*heartbeat_lines(live), *watchdog_lines(live)] if live else []


def stop_line(live: Liveness | None) -> str:
    """Shell: stop the heartbeats and the watchdog once the job's command ended (else the job lingers in
    COMPLETING while Slurm ends them)."""
    return 'kill "${liveness[@]}" 2>/dev/null' if live else ""
