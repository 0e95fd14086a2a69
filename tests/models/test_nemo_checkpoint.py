"""A .nemo's model config, read without NeMo: once per process while the file is unchanged (a compile asks for it
from the load check, every GPU group of the preflight and every trainer's batch rule), afresh when it changes."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
import yaml

from nemotron.models.layout import CheckpointError
from nemotron.models.nemo_checkpoint import nemo_model_config


def _nemo(path: Path, tensor: int) -> Path:
    config = path.with_suffix(".yaml")
    config.write_text(yaml.safe_dump({"tensor_model_parallel_size": tensor}))
    with tarfile.open(path, "w") as tar:
        tar.add(config, arcname="./model_config.yaml")
    return path


def test_a_nemo_is_read_once_until_it_changes(tmp_path: Path) -> None:
    nemo = _nemo(tmp_path / "m.nemo", tensor=2)
    first = nemo_model_config(nemo)
    assert first == {"tensor_model_parallel_size": 2}
    assert nemo_model_config(nemo) is first  # not read again
    _nemo(tmp_path / "m.nemo", tensor=4)
    (tmp_path / "m.nemo").touch()
    assert nemo_model_config(nemo) == {"tensor_model_parallel_size": 4}


def test_not_here_is_none_and_not_a_nemo_is_refused_every_time(tmp_path: Path) -> None:
    assert nemo_model_config(tmp_path / "elsewhere.nemo") is None
    broken = tmp_path / "broken.nemo"
    broken.write_bytes(b"not a tar" * 64)
    for _ in range(2):
        with pytest.raises(CheckpointError, match=r"not a readable \.nemo"):
            nemo_model_config(broken)
