"""Pure rendering: Job -> the text `--dry-run` prints and executors submit. No I/O, no clock, no environment."""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from nemotron.artifacts.binding import Binding
from nemotron.compile import Job
from nemotron.core.redact import MASK, redact_text, redact_tree
from nemotron.launch.step_process import secret_names, step_command
from nemotron.plan import terms

# A word YAML 1.1 reads as a bool or null (PyYAML's implicit resolvers): as a string it must be quoted.
_YAML_WORDS = frozenset(
    f(w)
    for w in ("yes", "no", "true", "false", "on", "off", "null")
    for f in (str.lower, str.capitalize, str.upper)
)
# A string YAML writes plain: a letter or _ first (never a number, date, indicator or document marker), then no
# character that needs quoting (no space, colon, #, quote, bracket or comma).
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")


def _scalar(value: Any) -> str:
    """`value` as PyYAML's flow style writes it. The values a config holds most (None, bools, ints, floats, plain
    words and paths, empty groups) are written here as PyYAML would, without a yaml.safe_dump each (a few ms of a
    dry run); anything else goes through yaml (tests/launch/test_render.py compares the two)."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if type(value) is int:
        return str(value)
    if type(value) is float:
        if value != value:
            return ".nan"
        if value in (math.inf, -math.inf):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value).lower()
        return text.replace("e", ".0e", 1) if "." not in text and "e" in text else text
    if type(value) is str and value not in _YAML_WORDS and _PLAIN.fullmatch(value):
        return value
    if (type(value) is list or type(value) is dict) and not value:
        return "[]" if type(value) is list else "{}"
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def config_yaml(
    config: Mapping[str, Any], sources: Mapping[str, str], prefix: str = "", indent: int = 0
) -> str:
    """The config as YAML, each key set by a preset, profile or the CLI marked with a `# source` comment."""
    lines: list[str] = []
    pad = "  " * indent
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        note = f"  # {sources[dotted]}" if dotted in sources else ""
        if isinstance(value, Mapping) and value:
            lines.append(f"{pad}{key}:{note}")
            lines.append(config_yaml(value, sources, dotted + ".", indent + 1))
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}{note}")
    return "\n".join(line for line in lines if line)


def bindings_table(bindings: tuple[Binding, ...]) -> str:
    if not bindings:
        return "(this step consumes no artifacts)"
    rows = []
    width = max(14, *(len(b.name) for b in bindings))
    for b in bindings:
        where = b.artifact or b.path or b.ref
        got = f"{b.actual_type}" if b.actual_type else "unchecked"
        rows.append(f"{b.name:<{width}} {b.expected_type:<18} <- {b.ref}  [{b.kind}: {where}; type {got}]")
        if b.model:
            rows.append(f"{'':<{width}} {'':<18}    model: {b.model}")
    return "\n".join(rows)


def local_command(job: Job, job_dir: str, python: str = "python") -> list[str]:
    """The argv of the step process for a local run (torchrun for multi-process steps)."""
    nproc = getattr(job.profile, "nproc_per_node", 1)
    standalone = ("--standalone", f"--nproc-per-node={nproc}")
    return step_command(
        job, python=python, job_dir=job_dir, torchrun=standalone, nproc=nproc, quote=str
    ).words()


def local_launch(job: Job, job_dir: str, python: str = "python") -> str:
    secrets = secret_names(job.profile.env_vars)
    env = {k: (MASK if k in secrets else v) for k, v in sorted(job.profile.env_vars.items())}
    exports = "".join(f"{k}={shlex.quote(v)} " for k, v in env.items())
    return exports + shlex.join(local_command(job, job_dir, python))


def plan_table(planned: terms.Plan) -> str:
    """The resource plan as `--dry-run` shows it: its table, then a warning for each group that does not fit
    (plan.on_no_fit=warn let the job through)."""
    return "\n".join([terms.render(planned), *[f"warning: {terms.refusal(g)}" for g in planned.overflows()]])


def dry_run_text(
    job: Job,
    launch_text: str,
    job_dir: str,
    secrets: Iterable[str] = (),
    resource_plan: terms.Plan | None = None,
) -> str:
    """Everything `--dry-run` prints: the config with sources, the input bindings, the resource plan (memory per
    device of each process group), and the rendered launch."""
    header = (
        f"# step: {job.step_id}   preset: {job.preset}   profile: {job.profile.name} ({job.profile.executor})"
        f"   mode: {job.mode}\n# job dir: {job_dir}"
    )
    body = "\n".join(
        [
            header,
            "",
            "## config (keys marked with where they were set; unmarked = schema default)",
            config_yaml(redact_tree(job.config_tree), job.sources),
            "",
            "## inputs",
            bindings_table(job.bindings),
            *[f"warning: {w}" for w in job.warnings],
            *[f"note: {n}" for n in job.notes],
            "",
            "## outputs",
            "\n".join(
                f"{name:<14} {type_:<18} -> {art}:v<next>" for name, (art, type_) in job.outputs.items()
            )
            or "(none)",
            "",
            "## resource plan (memory per device; docs/cluster.md)",
            (plan_table(resource_plan) if resource_plan is not None else "") or "(none)",
            "",
            "## launch",
            launch_text,
        ]
    )
    return redact_text(body, secrets) + "\n"
