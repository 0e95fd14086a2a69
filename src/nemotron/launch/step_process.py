"""Our step process as every executor starts it, built once here and rendered by each in its own syntax (an argv,
an sbatch script, a Lepton job spec): the command line (`python -m nemotron.run_step`, under torchrun when the step
is distributed), the environment (NEMOTRON_* and the profile's variables) and which of those variables are secrets
(never written into a script or a spec; each executor says what it does with them instead)."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple
from urllib.parse import urlsplit

from nemotron.compile import Job
from nemotron.config.profiles import Profile
from nemotron.core.paths import bundled_root
from nemotron.core.redact import is_secret_name

RUN_STEP = "nemotron.run_step"  # exit codes 2/3/130 mean the same on every executor through it
# torchrun with the ranks' exit codes kept and Slurm's time-limit warning ignored in its agent (every executor)
TORCHRUN = "nemotron.launch.torchrun_agent"


class StepCommand(NamedTuple):
    """`[wrapper...] python -m module args...`: NeMo-Run's `Script(path=module, args, entrypoint=python, m=True)`
    without a wrapper. Words are as the executor needs them: shell words on a cluster, argv locally."""

    python: str
    module: str  # RUN_STEP, or the torchrun launcher that starts it
    args: tuple[str, ...]
    # words before the interpreter: a command that runs the step's command (a watchdog), ending in its `--`
    wrapper: tuple[str, ...] = ()

    def words(self) -> list[str]:
        return [*self.wrapper, self.python, "-m", self.module, *self.args]


def distributed(job: Job, nodes: int, nproc: int) -> bool:
    """Whether the step runs under torchrun: a torchrun step on more than one process in all."""
    return job.launch == "torchrun" and nodes * nproc > 1


def across_nodes(nodes: int, nproc: int, *rendezvous: str) -> tuple[str, ...]:
    """torchrun's flags for `nodes` launchers (one per node) of `nproc` ranks each, meeting by `rendezvous`."""
    return ("--nnodes", str(nodes), "--nproc-per-node", str(nproc), *rendezvous)


def code_path(local: str, code_root: str | None) -> str:
    """A path of the steps' code here, as the nodes see it: under the profile's `code_root` when it sets one."""
    here = str(bundled_root())
    if code_root and local.startswith(here + "/"):
        return code_root.rstrip("/") + local[len(here) :]
    return local


def step_command(
    job: Job,
    *,
    python: str,
    job_dir: str,
    torchrun: Sequence[str],
    nodes: int = 1,
    nproc: int = 1,
    code_root: str | None = None,
    launcher: str = TORCHRUN,
    quote: Callable[[str], str] = shlex.quote,
    wrapper: Sequence[str] = (),
) -> StepCommand:
    """The step's command: `python -m nemotron.run_step STEP.py --job-dir DIR [overrides...]`, or, when the step is
    `distributed`, `python -m <launcher> <torchrun flags> -m nemotron.run_step ...`. `python` and the flags are
    taken as given (they may name shell variables); the step's own words are passed through `quote`."""
    args = (
        quote(code_path(job.entry, code_root)),
        "--job-dir",
        quote(job_dir),
        *(quote(a) for a in job.passthrough),
    )
    if not distributed(job, nodes, nproc):
        return StepCommand(python, RUN_STEP, args, tuple(wrapper))
    return StepCommand(python, launcher, (*torchrun, "-m", RUN_STEP, *args), tuple(wrapper))


STORE_URL_ENV = "NEMOTRON_STORE_URL"


def secret_names(env_vars: Mapping[str, str]) -> list[str]:
    """The profile's variables whose value is a secret (by name, as everywhere: nemotron.core.redact), sorted."""
    return sorted(k for k, v in env_vars.items() if v and is_secret_name(k))


class StepEnv(NamedTuple):
    """The step's environment on a cluster: `variables` (name, plain value), to export; `secrets`, the names of the
    profile's variables that hold secrets, which no rendered script or spec may carry."""

    variables: tuple[tuple[str, str], ...]
    secrets: tuple[str, ...]


def artifacts_root(profile: Profile, home: str) -> str:
    """The artifact store as the nodes see it: the profile's, else the one in the cluster's NEMOTRON_HOME."""
    return profile.artifacts_root or f"{home}/artifacts"


def team_store_url(profile: Profile) -> str | None:
    """The team store ($NEMOTRON_STORE_URL, docs/artifacts.md "Which store") this submission uses, for the nodes
    to register into the same one; None when the profile names its own or there is none (SQLite under the
    artifacts root, which travels already)."""
    if STORE_URL_ENV in profile.env_vars:
        return None
    from nemotron.core.storeurl import store_url

    url = store_url()
    return None if url is None else url.url


def step_env(profile: Profile, home: str, job_dir: str) -> StepEnv:
    """NEMOTRON_HOME, NEMOTRON_ARTIFACTS_ROOT, the team store's NEMOTRON_STORE_URL and NEMOTRON_JOB_DIR as the
    nodes see them, then the profile's variables that hold a value, by name; its secret ones apart. A store URL
    that carries a password is a secret too: it travels as the profile's secrets do, never in a script or spec."""
    secrets = secret_names(profile.env_vars)
    store = team_store_url(profile)
    if store is not None and urlsplit(store).password is not None:
        secrets.append(STORE_URL_ENV)
    return StepEnv(
        (
            ("NEMOTRON_HOME", home),
            ("NEMOTRON_ARTIFACTS_ROOT", artifacts_root(profile, home)),
            *(((STORE_URL_ENV, store),) if store is not None and STORE_URL_ENV not in secrets else ()),
            ("NEMOTRON_JOB_DIR", job_dir),
            *((k, v) for k, v in sorted(profile.env_vars.items()) if v and k not in secrets),
        ),
        tuple(secrets),
    )
