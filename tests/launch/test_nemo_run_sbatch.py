"""NeMo-Run's sbatch template filled in by Python (launch/nemo_run_sbatch.py) renders as jinja2 renders the installed
template, over every branch of it our plans can take, without jinja2; another template, or a tag the Python does not
know, goes to jinja2."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path
from typing import Any

import pytest

from nemotron.launch import nemo_run_sbatch
from nemotron.launch.slurm_script import nemo_run_templates

TEMPLATES = nemo_run_templates()
SOURCE = (TEMPLATES / "slurm.sh.j2").read_text(encoding="utf-8")


def variables(groups: int, monitor: bool, env: bool, setup: bool, memory: bool) -> dict[str, Any]:
    return {
        "sbatch_command": "sbatch --parsable",
        "sbatch_flags": [f"#SBATCH --flag-{i}=v" for i in range(3)]
        + (["#SBATCH hetjob"] if groups > 1 else []),
        "max_retries": 0,
        "env_vars": ["export A=1", "export B='two words'"] if env else [],
        "head_node_ip_var": "head_node_ip",
        "setup_lines": "mkdir -p /x\necho ready" if setup else None,
        "memory_measure": "/logs/mem.out" if memory else None,
        "srun_commands": [f"srun --het-group={i} python step.py & pids[{i}]=$!" for i in range(groups)],
        "group_env_vars": [[f"export G{i}=1", f"export H{i}=2"] for i in range(groups)] if groups > 1 else [],
        "heterogeneous": groups > 1,
        "run_as_group": groups > 1,
        "monitor_group_job": monitor,
        "monitor_group_job_wait_time": 1,
        "het_group_host_var": "het_group_host",
        "ft_enabled": False,
    }


def test_the_installed_template_is_the_one_checked() -> None:
    # nemo-run moved its template: check nemo_run_sbatch against it (the tests below), then update its sha256
    assert hashlib.sha256(SOURCE.encode()).hexdigest() == nemo_run_sbatch.TEMPLATE_SHA256


@pytest.mark.parametrize(
    "groups,monitor,env,setup,memory",
    [c for c in itertools.product([1, 2, 3], [False, True], [False, True], [False, True], [False, True])],
)
def test_python_renders_as_jinja2(
    groups: int, monitor: bool, env: bool, setup: bool, memory: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    v = variables(groups, monitor, env, setup, memory)
    expected = nemo_run_sbatch.render_with_jinja2(TEMPLATES, SOURCE, v)
    monkeypatch.setattr(nemo_run_sbatch, "render_with_jinja2", no_jinja2)
    assert nemo_run_sbatch.render(TEMPLATES, v) == expected


def no_jinja2(*_: object) -> str:
    raise AssertionError("rendered by jinja2")


def test_fault_tolerance_is_rendered_by_jinja2() -> None:
    v = variables(1, False, True, False, False) | {
        "ft_enabled": True,
        "fault_tol_cfg_path": "/ft/cfg.yaml",
        "fault_tol_finished_flag_file": "/ft/finished",
        "fault_tol_job_results_file": "/ft/results",
    }
    script = nemo_run_sbatch.render(TEMPLATES, v)
    assert 'export FAULT_TOL_CFG_PATH="/ft/cfg.yaml"' in script
    assert script == nemo_run_sbatch.render_with_jinja2(TEMPLATES, SOURCE, v)


@pytest.mark.parametrize(
    "edit",
    [
        ("{{sbatch_command}}", "{{sbatch_command|upper}}"),  # a filter
        ("# Parameters", "# Parameters{# a comment #}"),
        ("{%- for sbatch_flag in sbatch_flags %}", "{%- for sbatch_flag in sbatch_flags|sort %}"),
        ("{% if heterogeneous %}", "{% if heterogeneous and run_as_group %}"),
        ("{{head_node_ip_var}}", "{{undefined_variable}}"),
    ],
)
def test_a_tag_python_does_not_know_is_rendered_by_jinja2(
    edit: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the sha256 guard let through, so that the tags alone decide
    edited = SOURCE.replace(*edit)
    monkeypatch.setattr(nemo_run_sbatch, "TEMPLATE_SHA256", hashlib.sha256(edited.encode()).hexdigest())
    templates, v = templates_with(tmp_path, edited), variables(2, True, True, True, False)
    assert nemo_run_sbatch.render(templates, v) == nemo_run_sbatch.render_with_jinja2(templates, edited, v)
    monkeypatch.setattr(nemo_run_sbatch, "render_with_jinja2", no_jinja2)
    with pytest.raises(AssertionError, match="rendered by jinja2"):
        nemo_run_sbatch.render(templates, v)


def test_another_template_is_rendered_by_jinja2(tmp_path: Path) -> None:
    edited = SOURCE + "# written by a newer NeMo Run\n"
    script = nemo_run_sbatch.render(templates_with(tmp_path, edited), variables(2, True, True, True, False))
    assert script.endswith("\n# written by a newer NeMo Run")


def templates_with(directory: Path, source: str) -> Path:
    """NeMo-Run's template dir, copied to `directory`, with `source` as its slurm.sh.j2."""
    for name in ("slurm.sh.j2", "ft_launcher_slurm.j2"):
        (directory / name).write_text((TEMPLATES / name).read_text(encoding="utf-8"))
    (directory / "slurm.sh.j2").write_text(source)
    return directory
