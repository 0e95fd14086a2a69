"""Record files that validated before are not read again (nemotron.artifacts.validated_files), through the CLI: the
reader's module loaded or not shows whether a dry run read the file's records."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

COUNT_DRY_RUN = ("steps", "run", "test/count", "-c", "tiny", "--dry-run")
READER = "nemotron.data.jsonl"


def _without_job_id(out: str) -> str:
    return re.sub(r"test-count-[0-9-]+-[0-9a-f]{4}", "JOB", out)


def _dry_run_on(records: str, tmp_path: Path, run_cli_imports: Any) -> tuple[Path, Any, set[str]]:
    """A records file `nums.jsonl` holding `records`, test/count's dry run on it (which must pass) and the modules
    that dry run imported."""
    nums = tmp_path / "nums.jsonl"
    nums.write_text(records)
    r, read = run_cli_imports(*COUNT_DRY_RUN, f"inputs.numbers={nums}")
    assert r.code == 0, r.err
    return nums, r, read


def test_a_file_is_read_again_only_when_its_content_changes(
    home: Path, fixture_steps: Path, tmp_path: Path, run_cli_imports: Any
) -> None:
    nums, first, read = _dry_run_on('{"prompt": "1"}\n{"prompt": "2"}\n', tmp_path, run_cli_imports)
    assert READER in read  # validated line by line the first time
    again, read = run_cli_imports(*COUNT_DRY_RUN, f"inputs.numbers={nums}")
    assert again.code == 0, again.err
    assert READER not in read
    assert _without_job_id(again.out) == _without_job_id(first.out)

    # a bad record of the same size under the same mtime: the content, not the file's stat, is what was validated
    stat = nums.stat()
    nums.write_text('{"prompt": "1"}\n{"prompX": "2"}\n')
    os.utime(nums, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert nums.stat().st_size == stat.st_size
    for _ in range(
        2
    ):  # a file that does not validate is never remembered: its problem is reported every time
        bad, read = run_cli_imports(*COUNT_DRY_RUN, f"inputs.numbers={nums}")
        assert bad.code == 2, bad.err
        assert f"{nums}:2" in bad.err and "prompt" in bad.err
        assert READER in read
    assert "Traceback" not in bad.err and not home.exists()


def test_the_cache_holds_digests_not_records(
    home: Path, fixture_steps: Path, tmp_path: Path, run_cli_imports: Any
) -> None:
    _dry_run_on('{"prompt": "a secret-looking prompt"}\n', tmp_path, run_cli_imports)
    cached = json.loads((tmp_path / "cache" / "validated_records.json").read_text())
    (key,) = [k for k in cached["keys"] if "PromptRecord" in k]
    assert "secret-looking" not in json.dumps(cached)
    assert len(key.split()[0]) == 64  # a sha256 of the file
