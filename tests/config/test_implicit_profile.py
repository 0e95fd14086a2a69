"""A run without -r/-b uses the `local` profile of the user's env.toml, not a hard-coded one."""

from pathlib import Path
from typing import Any


def test_the_users_local_profile_applies_without_a_flag(home: Path, tmp_path: Path, run_cli: Any) -> None:
    (tmp_path / "env.toml").write_text('[local]\nexecutor = "local"\nconfig = { "trainer.max_steps" = 3 }\n')
    r = run_cli("steps", "run", "rl/reinforce", "-c", "tiny", "--dry-run", cwd=tmp_path)
    assert r.code == 0, r.err
    assert "max_steps: 3  # profile:local" in r.out and "profile: local (local)" in r.out


def test_without_an_env_file_the_shipped_local_profile_applies(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    r = run_cli("steps", "run", "rl/reinforce", "-c", "tiny", "--dry-run", cwd=tmp_path)
    assert r.code == 0, r.err
    assert "# profile:local" not in r.out and "profile: local (local)" in r.out
