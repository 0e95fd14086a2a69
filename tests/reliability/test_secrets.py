"""Secrets planted in env vars, profiles and config never appear in dry-run output, job records, rendered launch
text or logs. Redaction matches by name (token, key, secret, password, ...) and by known value."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

PLANTED = {
    "env": "wandb-FAKE-abcdef123",  # WANDB_API_KEY in the caller's environment
    "profile_env": "hf_FAKE_1234567890",  # HF_TOKEN in the profile's env_vars
    "profile_pw": "pw-FAKE-987654321",  # DB_PASSWORD in the profile's env_vars
    "config": "cfg-token-FAKE-111",  # server.token set in the profile's config
    "cli": "cli-secret-FAKE-222",  # server.token on the command line (wins over the profile)
}


def _env_file(tmp: Path) -> Path:
    f = tmp / "env.toml"
    f.write_text(
        "[mine]\nexecutor = 'local'\n"
        f"env_vars = {{ HF_TOKEN = '{PLANTED['profile_env']}', DB_PASSWORD = '{PLANTED['profile_pw']}', PLAIN = 'visible' }}\n"
        f"config = {{ 'server.token' = '{PLANTED['config']}' }}\n"
    )
    return f


def _leaks(text: str) -> list[str]:
    return [k for k, v in PLANTED.items() if v in text]


def test_secrets_never_leak(home: Path, tmp_path: Path, fixture_steps: Path, run_cli: Any) -> None:
    _env_file(tmp_path)
    env = {**os.environ, "WANDB_API_KEY": PLANTED["env"], "NEMOTRON_STEPS_PATH": str(fixture_steps)}
    mine = ("steps", "run", "test/count", "-c", "tiny", "-r", "mine")  # on the profile that holds secrets
    dry = run_cli(*mine, "--dry-run", env=env, cwd=tmp_path)
    assert dry.code == 0, dry.err
    assert _leaks(dry.out + dry.err) == [] and "PLAIN=visible" in dry.out and "HF_TOKEN='***'" in dry.out

    shown = run_cli("profiles", "show", "mine", "--json", env=env, cwd=tmp_path)
    assert _leaks(shown.out) == [] and '"PLAIN": "visible"' in shown.out

    # a real run; the step even prints a secret it was handed (passthrough), and the log must mask it
    r = run_cli(
        *mine,
        f"server.token={PLANTED['cli']}",
        "--",
        "--show",
        PLANTED["profile_env"],
        env=env,
        cwd=tmp_path,
    )
    assert r.code == 0, r.err
    assert _leaks(r.out + r.err) == []
    (job,) = (home / "jobs").iterdir()
    for f in [p for p in job.rglob("*") if p.is_file() and p.name != ".secrets.json"]:
        assert _leaks(f.read_text(errors="replace")) == [], f"secret in {f.relative_to(job)}"
    assert "passthrough: --show ***" in (job / "logs" / "step.log").read_text()
    assert "token available to the step: True" in (job / "logs" / "step.log").read_text()  # masked, not lost
    secrets = job / ".secrets.json"
    assert oct(secrets.stat().st_mode & 0o777) == "0o600" and PLANTED["cli"] in secrets.read_text()


@pytest.mark.parametrize(
    "name",
    [
        "judge.token",
        "WANDB_API_KEY",
        "HF_TOKEN",
        "authToken",
        "server.token",
        "db_passwd",
        "api_key",
        "AWS_SECRET_ACCESS_KEY",
        "NEMOTRON_REWARD_TOKEN",
        "Authorization",
        "file_token",  # only a last part file/path/env/dir points elsewhere
        "path_secret",
    ],
)
def test_secret_names_are_masked(name: str) -> None:
    from nemotron.core.redact import is_secret_name

    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "generation.max_new_tokens",
        "loss_fn.token_level_loss",
        "keyword",
        "monkey",
        "tokenizer",
        "num_tokens",
        "max_total_sequence_length",
        "PWD",
        "OLDPWD",
        "reward.server.token_file",  # where a secret is kept is no secret: a path, a variable's name
        "SSH_KEY_PATH",
        "token_env",
        "secret_dir",
    ],
)
def test_names_that_only_mention_tokens_are_shown(name: str) -> None:
    """`max_new_tokens` was masked as `***` in dry-run, config.yaml and job.yaml (a name *part* must be secret)."""
    from nemotron.core.redact import is_secret_name, redact_tree

    assert not is_secret_name(name)
    assert redact_tree({name: 16}) == {name: 16}


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://bob:s3cret@db:5432/team", "postgresql://bob:***@db:5432/team"),
        ("'http://bob:pa:ss@mlflow:5000'", "'http://bob:***@mlflow:5000'"),
        ("see https://u:p4ssw0rd@h/x and sqlite:///a:b@c", "see https://u:***@h/x and sqlite:///a:b@c"),
        ("postgresql://bob@db/team", "postgresql://bob@db/team"),  # no password: nothing to mask
        ("user:pass@host", "user:pass@host"),  # not a URL
        (
            "postgresql://db/team?sslmode=require&password=s3cret",
            "postgresql://db/team?sslmode=require&password=***",
        ),
        (
            "postgresql://bob:pw@db/t?sslpassword=k3y&application_name=x",
            "postgresql://bob:***@db/t?sslpassword=***&application_name=x",
        ),
        (
            "http://mlflow:5000/api?token=abc123&tokenizer=gpt2",
            "http://mlflow:5000/api?token=***&tokenizer=gpt2",
        ),
        (
            "'https://s3/b/o?X-Amz-Credential=AK/x&X-Amz-Signature=ff00&X-Amz-Expires=60'",
            "'https://s3/b/o?X-Amz-Credential=***&X-Amz-Signature=***&X-Amz-Expires=60'",
        ),
        ("https://h/cb#access_token=tok9&state=1", "https://h/cb#access_token=***&state=1"),
        ("https://h/search?q=password=1&max_new_tokens=8", "https://h/search?q=password=1&max_new_tokens=8"),
        (
            "key=value&token=x",
            "key=value&token=x",
        ),  # not a URL: a config line is redacted by its key elsewhere
    ],
)
def test_the_password_of_a_url_is_masked_and_nothing_else(text: str, shown: str) -> None:
    from nemotron.core.redact import redact_url_passwords

    assert redact_url_passwords(text) == shown


def test_a_tracking_uri_with_a_password_is_refused_without_showing_it(home: Path, run_cli: Any) -> None:
    uri = "http://bob:s3cret-pw@mlflow:5000"
    r = run_cli("steps", "run", "rl/ppo", "-c", "tiny", "tracking.mlflow.enabled=true",
                f"tracking.mlflow.tracking_uri={uri}", "--dry-run")  # fmt: skip
    assert r.code == 2 and "tracking.mlflow.tracking_uri" in r.err and "MLFLOW_TRACKING_PASSWORD" in r.err, (
        r.err
    )
    assert "s3cret-pw" not in r.out + r.err and "http://bob:***@mlflow:5000" in r.err
    assert not home.exists() or not any(home.iterdir())  # nothing written


def test_a_token_in_a_url_query_is_masked_in_the_dry_run(home: Path, run_cli: Any) -> None:
    uri = "http://127.0.0.1:5999/?token=abcdef123&experiment=7"
    r = run_cli("steps", "run", "rl/ppo", "-c", "tiny", "tracking.mlflow.enabled=true",
                f"tracking.mlflow.tracking_uri={uri}", "--dry-run")  # fmt: skip
    assert r.code == 0, r.err
    assert (
        "abcdef123" not in r.out + r.err
        and "tracking_uri: http://127.0.0.1:5999/?token=***&experiment=7" in r.out
    )
